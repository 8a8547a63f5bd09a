"""Two NeuronRunner jobs of one engine emitting into one manifest folder at once lose no graph: the second job
waits for the first one's emit (neuron_args.manifest.folder_lock), so no emit removes ledger lines the other job
still needs, and the folder's manifest ends listing every graph."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # two job processes

REPO = Path(__file__).resolve().parents[1]

# argv: role (first | second), signal folder, --out folder. "first" warms prefill, then waits until "second" has
# emitted or is waiting for the folder, then warms decode and emits: the interleaving that lost graphs, every run.
JOB = r"""
import json, logging, os, sys, time
from pathlib import Path
sys.path.insert(0, sys.argv[4])
role, signals, out = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
os.environ["VLLM_NEURON_MANIFEST_DIR"] = str(out / "manifests")
import torch
from neuron_args.runner import NeuronRunner
from tests.test_runner import TwoGraphModel

class Waiting(logging.Handler):
    def emit(self, record):
        if "is held by pid" in record.getMessage():
            (signals / "second-waits").touch()

logging.getLogger("neuron_args.manifest").addHandler(Waiting())
runner = NeuronRunner(TwoGraphModel(), compiler_args=["--auto-cast=none", "-O1"], compiler="local",
                      cache_dir=out / "cache")
def until(*names):
    while not any((signals / n).exists() for n in names):
        time.sleep(0.05)
if role == "first":
    keys = runner.warmup(["prefill"], emit=False).keys
    (signals / "first-started").touch()
    until("second-emitted", "second-waits")
    keys += runner.warmup(["decode"], emit=False).keys
else:
    until("first-started")
    keys = runner.warmup(emit=False).keys
path = runner.emit_manifest()
if role == "second":
    (signals / "second-emitted").touch()
listed = sorted(g["graph_hash"] for g in json.loads(path.read_text())["graphs"])
print(json.dumps({"keys": sorted(set(keys)), "listed": listed}))
"""


def test_two_jobs_of_one_engine_on_one_folder_leave_every_graph_in_the_manifest(tmp_path):
    signals, out = tmp_path / "signals", tmp_path / "run"
    signals.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("VLLM_NEURON_MANIFEST_DIR", "NEURON_VISIBLE_DEVICES")}
    jobs = {role: subprocess.Popen([sys.executable, "-c", JOB, role, str(signals), str(out), str(REPO)], env=env,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for role in ("first", "second")}
    results = {}
    for role, job in jobs.items():
        stdout, stderr = job.communicate(timeout=900)
        assert job.returncode == 0, f"{role} job failed:\n{stderr[-3000:]}"
        results[role] = json.loads(stdout.strip().splitlines()[-1])
    every = sorted(set(results["first"]["keys"]) | set(results["second"]["keys"]))
    assert len(every) == 2  # prefill and decode
    for role, result in results.items():  # each job's manifest, as it wrote it, lists every graph it warmed
        assert set(result["keys"]) <= set(result["listed"]), role
    final = json.loads((out / "manifests" / "nodev" / "manifest.json").read_text())
    assert sorted(g["graph_hash"] for g in final["graphs"]) == every
    assert not (out / "manifests" / "ledger" / "nodev").exists()  # consumed by the last emit
