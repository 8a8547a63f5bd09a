"""A farm worker's answer is untrusted: an executable it says another compiler built is never stored under the key."""
from __future__ import annotations

import dataclasses

import pytest

from neuron_args.errors import CompileError
from neuron_args.deferred.farm import commit_outcome
from tests.security.test_security_compiler_versions import INSTALLED, fake_cc  # noqa: F401  (a fixture)
from tests.security.test_security_compiler_versions import pending as pending_entry
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


def test_a_worker_sends_the_tail_of_a_log_past_the_cap_not_an_invalid_result(tmp_path, fake_cc, monkeypatch):  # noqa: F811
    """A verbose compile's log larger than the cap on what a worker may send (lowered here): the worker sends its
    end (where the errors are), and the good executable is committed, not refused as an invalid result."""
    from neuron_args import deferred
    from neuron_args.cache import CompileCache
    from neuron_args.deferred.farm import prepare_task, run_compile_task

    monkeypatch.setattr(deferred.farm, "MAX_LOG_BYTES", 24)
    root = tmp_path / "cache"
    entry = CompileCache(root).entry(pending_entry(root, "verbose", INSTALLED))
    md = entry.info()
    outcome = run_compile_task(prepare_task(entry, md, ["-O1"]))
    assert outcome.status == "compiled", outcome.error
    assert len(outcome.log) == 24 and outcome.log.endswith(b"\n")
    assert commit_outcome(entry, md, prepare_task(entry, md, ["-O1"]), outcome) > 0
    assert entry.is_complete and entry.log_path.read_bytes() == outcome.log
