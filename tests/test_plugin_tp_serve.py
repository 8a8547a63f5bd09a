"""``--neuron-tp N`` serves: a test using ``neuron_served`` runs in each rank process against its shard.

It passes only when every rank passed with no cache miss; a failure names the rank. The summary
and the ``--neuron-report`` JSON list each rank's result. ``assert_ranks(N)`` refuses a model that
ignores its rank (every rank holds the unsharded model's weights).
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # rank processes

SERVING = """
import pytest
import torch
import torch.distributed as dist


@pytest.mark.graph_type("decode")
def test_serves_on_every_rank(neuron_served):
    out = neuron_served.run("decode", {"x": torch.ones(1, 8)})
    assert out.shape == (1, 4)
    if dist.get_rank() == 1:
        assert False, "rank one disagrees"


@pytest.mark.graph_type("decode")
def test_misses_on_one_rank(neuron_served):
    shape = (1, 8) if dist.get_rank() == 0 else (2, 8)  # an undeclared shape: no graph of it was warmed up
    neuron_served.run("decode", {"x": torch.ones(*shape)})


@pytest.mark.graph_type("decode")
def test_manifest(neuron_manifest):
    with pytest.raises(AssertionError, match="no shard: every rank holds weights of the same names and shapes"):
        neuron_manifest.assert_ranks(2)
    neuron_manifest.assert_ranks(2, replicated=True)
"""


def test_a_serving_test_runs_in_every_rank_and_fails_naming_the_rank(neuron_project: pytest.Pytester,
                                                                      tmp_path: Path) -> None:
    neuron_project.makepyfile(test_tp=SERVING)
    report = tmp_path / "report.json"
    result = neuron_project.runpytest_subprocess("-p", "no:randomly", "--neuron-tp=2", f"--neuron-report={report}")
    result.assert_outcomes(passed=1, failed=2)
    out = result.stdout.str()
    result.stdout.fnmatch_lines([
        "*--neuron-tp 2: the test ran in each rank process against its shard; rank 1 failed (1 calls, 0 misses):",
        "call: *", "*AssertionError: rank one disagrees*"])
    assert "rank 0 failed" not in out.split("test_misses_on_one_rank")[0], out
    result.stdout.fnmatch_lines(["*rank 1 failed (* misses):*", "*CacheMissError*"])
    result.stdout.fnmatch_lines(["--neuron-tp 2 served in the rank processes: test_tp.py::test_serves_on_every_rank: "
                                 "rank 0 passed (1 calls, 0 misses); rank 1 failed (1 calls, 0 misses)"])
    doc = json.loads(report.read_text())
    serves = {s["test"]: s for s in doc["tp_serve"]}
    ranks = serves["test_tp.py::test_serves_on_every_rank"]["ranks"]
    assert [(r["rank"], r["outcome"], r["serve_calls"]) for r in ranks] == [(0, "passed", 1), (1, "failed", 1)]
    assert "rank one disagrees" in ranks[1]["error"]


def test_the_tiny_vlm_serves_its_shards_in_two_ranks() -> None:
    """The example's serving test under --neuron-tp=2: each rank generates with its vocabulary shard."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
                          "examples/test_tiny_vlm.py", "--neuron-tp=2", "-k", "serve or ranks"],
                         cwd=root, capture_output=True, text=True, timeout=1800)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert "2 passed" in run.stdout, run.stdout[-2000:]
    assert ("served in the rank processes: examples/test_tiny_vlm.py::"
            "test_warmup_then_serve_generates_eager_tokens_without_a_cache_miss: rank 0 passed") in run.stdout
