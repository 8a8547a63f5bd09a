"""A farm worker's answer is untrusted: an executable it says another compiler built is never stored under the key."""
from __future__ import annotations

import dataclasses

import pytest

from neuron_args.errors import CompileError
from neuron_args.deferred.farm import commit_outcome
from tests.security.test_security_inputs import _outcome, _task, pending  # noqa: F401  (a fixture)


@pytest.mark.parametrize(("compiler", "why"), [
    ({"name": "neuronx-cc", "version": "1.9", "format": "neff"}, "version '1.9'"),
    ({"name": "neuronx-cc", "format": "neff"}, "version None"),
    ({"name": "local", "version": "2.0", "format": "xla-cpu-executable"}, "compiler 'local'"),
])
def test_an_executable_built_by_another_compiler_is_not_committed(pending, compiler, why):  # noqa: F811
    """An old or hostile worker skips its own version check: the caller checks the record it sent."""
    entry, md = pending
    task = _task(entry.key)
    with pytest.raises(CompileError, match=why) as err:
        commit_outcome(entry, md, task, dataclasses.replace(_outcome(entry.key), compiler=compiler))
    assert entry.key in str(err.value) and "'decode'" in str(err.value) and "fix:" in str(err.value)
    assert not entry.executable_path.exists() and entry.metadata()["status"] == "pending"

