"""README's cold-cache pattern warms up through ``neuron_runner`` in a test body: the manifest still lists its graphs.

A warmup of the session's runner writes the session's ledger wherever it is called (the
``neuron_warmup`` fixture or the test itself), so a later ``neuron_manifest`` test of those graph
types finds them whatever the test order, with or without a manifest folder.
"""
from __future__ import annotations

import pytest

COLD_CACHE_FIRST = """
import pytest

def test_cache_is_warm(neuron_runner, neuron_compile_counter):
    with neuron_compile_counter.expect(compiles=0):
        neuron_runner.warmup()

@pytest.mark.graph_type("decode", "prefill")
def test_manifest(neuron_manifest):
    neuron_manifest.assert_complete(["decode", "prefill"])
    assert len(neuron_manifest.graphs) == 2
"""


@pytest.mark.parametrize("manifest_dir", [False, True], ids=["no-manifest-dir", "manifest-dir"])
def test_a_warmup_in_the_test_body_reaches_a_later_neuron_manifest(neuron_project: pytest.Pytester,
                                                                   manifest_dir: bool) -> None:
    neuron_project.makepyfile(test_cold=COLD_CACHE_FIRST)
    args = [f"--neuron-manifest-dir={neuron_project.path / 'manifests'}"] if manifest_dir else []
    result = neuron_project.runpytest("-p", "no:randomly", *args)
    result.assert_outcomes(passed=2)
