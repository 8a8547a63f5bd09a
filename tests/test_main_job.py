"""The main job end to end: TP=2 ranks in each of two data-parallel engines, one command."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_two_engines_of_two_tp_ranks_write_two_manifests_with_both_ranks(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("VLLM_NEURON_MANIFEST_DIR", "NEURON_LIBTORCH_ASSERT_CACHE_HIT")}
    run = subprocess.run([sys.executable, "-m", "examples.tiny_vlm.main", "--tp", "2", "--dp", "2", "--out", str(tmp_path)],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=1200)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert run.stdout.count("tokens match eager PyTorch") == 2  # local rank 0 of each engine
    manifests = sorted((tmp_path / "manifests").glob("*/manifest.json"))
    assert [m.parent.name for m in manifests] == ["dev0_1", "dev2_3"]
    for m in manifests:
        doc = json.loads(m.read_text())
        assert doc["manifest_version"] == "1"
        assert doc["config"]["topology"]["tensor_parallel_size"] == 2
        assert doc["config"]["topology"]["data_parallel_size"] == 2
        assert len(doc["graphs"]) == 6  # encoder, 2 prefill, 2 decode, jf buckets
        assert all(g["ranks"] == [0, 1] for g in doc["graphs"])
        levels = sorted(next((t for t in g["compiler_flags"].split() if t.startswith("-O")), "-") for g in doc["graphs"])
        assert levels == ["-", "-", "-O2", "-O3", "-O3", "-O3"]
    assert not (tmp_path / "manifests" / "ledger" / "dev0_1").exists()  # each engine cleaned its own ledger


@pytest.mark.slow
def test_hf_llama_main_job_in_the_deferred_flow_matches_transformers_generate(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("VLLM_NEURON_MANIFEST_DIR", "NEURON_LIBTORCH_ASSERT_CACHE_HIT")}
    run = subprocess.run([sys.executable, "-m", "examples.hf_llama.main", "--flow", "parallel", "--out", str(tmp_path)],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "tokens match transformers generate()" in run.stdout
    assert "0 cache misses, 0 compiles" in run.stdout
    doc = json.loads((tmp_path / "manifests" / "nodev" / "manifest.json").read_text())
    shapes = sorted(g["input_shapes"][0] for g in doc["graphs"])
    assert shapes == ["1, 1", "1, 16", "1, 32"]
    levels = {g["input_shapes"][0]: next((t for t in g["compiler_flags"].split() if t.startswith("-O")), "-")
              for g in doc["graphs"]}
    assert levels == {"1, 1": "-O3", "1, 16": "-", "1, 32": "-"}
