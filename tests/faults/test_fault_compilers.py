"""A neuronx-cc that misbehaves (the fake, first on PATH): what the driver reads of it stays bounded."""
from __future__ import annotations

import tracemalloc

import pytest

from neuron_args.cache import CompileCache
from neuron_args.deferred import parallel_compile
from tests.faults.fault_helpers import make_pending

MB = 1 << 20


@pytest.mark.slow
def test_a_failed_compile_with_a_huge_output_names_its_tail_without_reading_it_whole(tmp_path, fake_env, monkeypatch):
    """40 MB of compiler output, then exit 70: the driver read the captured output and the log into memory whole,
    several times (the append, the hint's tail, the error's tail), a few hundred MB at neuronx-cc's verbose levels."""
    monkeypatch.setenv("FAKE_NEURONX_CC_OUTPUT_BYTES", str(40 * MB))
    monkeypatch.setenv("FAKE_NEURONX_CC_MODE", "exit70")
    root = tmp_path / "cache"
    (key,) = make_pending(root, 1)
    tracemalloc.start()
    try:
        report = parallel_compile(root, workers=1, quiet=True, raise_on_error=False)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    (graph,) = report.graphs
    assert graph.status == "failed" and "killed or out of memory (exit status 70)" in graph.error
    assert "  fake neuronx-cc: last line\n" in graph.error  # the tail of what it printed
    assert peak < 8 * MB, f"reading the failed compile's output took {peak / MB:.0f} MB"
    log = CompileCache(root).entry(key).path / "log-neuron-cc.txt"
    assert log.stat().st_size > 40 * MB and log.read_bytes().endswith(b"fake neuronx-cc: last line\n")
