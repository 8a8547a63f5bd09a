"""What a runner's later parallel warmup gains from kept trace children, and from the fork server.

Three runners (an MLP of another width each: other keys, so each traces in children) warm up with
``flow="parallel"`` one after another in one process, each on a fresh cache, each serving once after
its warmup (jax's client then exists: a later call's new children cannot fork). Per variant, each
run a fresh process, order rotated per repetition:

* ``kept``: the default, the first runner's children are kept and trace the later runners' jobs;
* ``server``: ``NEURON_ARGS_TRACE_IDLE_SECONDS=0`` (none kept): later children fork from the fork server;
* ``spawn``: none kept and no fork server: later children are fresh interpreters.

Reports the later runners' warmup seconds (median) and their ratios to ``kept``.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from figures import figure, load  # noqa: E402

CHILD = r'''
import json, sys, time
from pathlib import Path
import torch
from neuron_args.graphs import GraphSpec
from neuron_args.runner import NeuronRunner

if sys.argv[2] == "spawn":  # no fork server: once forking is unsafe, children spawn
    pt = sys.modules["neuron_args.deferred.parallel_trace"]
    pt._start_fork_server = lambda modules: None
    _context = pt._context
    pt._context = lambda method, server=None: _context(method, server if pt.fork_is_safe() else None)

from tests.models import make_mlp, mlp_inputs

class Model(torch.nn.Module):  # a runner model: the tests' MLP, its hidden width another per runner (other keys)
    def __init__(self, width):
        super().__init__()
        self.mlp = make_mlp(d_hidden=width)
    def neuron_graphs(self):
        bucket = lambda b: (lambda: {"x": mlp_inputs(batch=b)[0]})
        return [GraphSpec("prefill", self.mlp, {"b2": bucket(2), "b4": bucket(4)}),
                GraphSpec("decode", self.mlp, {"b1": bucket(1)})]

out = []
for i, width in enumerate((16, 24, 32)):
    runner = NeuronRunner(Model(width), compiler_args=["--auto-cast=none", "-O1"], compiler="local",
                          cache_dir=Path(sys.argv[1]) / str(i))
    t0 = time.perf_counter()
    runner.warmup(flow="parallel", emit=False)
    out.append(time.perf_counter() - t0)
    with torch.inference_mode(), runner.serve():
        runner.run("decode", {"x": mlp_inputs(batch=1)[0]})
    if i == 0:
        time.sleep(4)  # a test's serve between two warmups: the fork server's start (in the background) has time
print(json.dumps(out))
'''

VARIANTS = ("kept", "server", "spawn")


def run(variant: str) -> list[float]:
    env = {**os.environ, "NEURON_ARGS_TRACE_WORKERS": "2", "PYTHONPATH": str(HERE.parent)}
    env["NEURON_ARGS_TRACE_IDLE_SECONDS"] = "30" if variant == "kept" else "0"
    with tempfile.TemporaryDirectory(prefix="bench-trace-children-") as tmp:
        done = subprocess.run([sys.executable, "-c", CHILD, tmp, variant], env=env, capture_output=True, text=True,
                              check=True)
    return json.loads(done.stdout.splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="one repetition")
    ns = parser.parse_args()
    print(load())
    later: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for rep in range(1 if ns.quick else ns.reps):
        for variant in VARIANTS[rep % 3:] + VARIANTS[:rep % 3]:
            t0 = time.perf_counter()
            first, *rest = run(variant)
            later[variant] += rest
            print(f"{variant:7} first {first:6.2f} s  later {'  '.join(f'{s:6.2f}' for s in rest)} s  "
                  f"(process {time.perf_counter() - t0:.1f} s)", flush=True)
    med = {v: statistics.median(s) for v, s in later.items()}
    print(f"later runners' warmup, median: " + ", ".join(f"{v} {m:.2f} s" for v, m in med.items()))
    figure("later warmup, fork server / kept children", med["server"] / med["kept"], None, note="bench_trace_children")
    figure("later warmup, spawn / kept children", med["spawn"] / med["kept"], None, note="bench_trace_children")
    print(load())
    return 0


if __name__ == "__main__":
    sys.exit(main())
