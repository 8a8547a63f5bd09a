"""Orchestration that scales: ``parallel_compile`` of N graphs on W workers with a compiler taking T s a graph.

    python benchmarks/bench_orchestration.py [--graphs 64] [--workers 8] [--seconds 2] [--reps 2] [--flows pool,cluster]

Compiles on real hosts take minutes, so what ``parallel_compile`` itself adds per graph is what decides
whether N graphs on W workers finish in N*T/W. The compiler is a stand-in ``neuronx-cc``
(``tests/fakes/neuronx_cc.py`` installed on PATH under that name) that sleeps ``FAKE_NEURONX_CC_SLEEP`` =
T seconds per compile and writes a small executable: it loads no core, so W workers on a 2-core machine
still overlap their T's.

tests/models.py's MLP at N batch sizes is captured once for ``neuronx-cc`` (``neuron_libtorch_graph_capture``;
the stand-in answers ``--version``); each repetition copies that cache once per flow and builds the copy in
a fresh subprocess of this script (``--phase FLOW``), flows in rotating order:

- ``threads``: ``parallel_compile(workers=W)``: its own W threads, each compile a compiler process;
- ``pool``: ``parallel_compile(executor=ProcessPoolExecutor(W))`` (fork): inputs and results shipped
  (``neuron_args.deferred.farm``);
- ``cluster``: ``parallel_compile(executor=client.get_executor())`` on a Dask ``LocalCluster`` of W worker
  processes of 1 thread each on 127.0.0.1, started and its workers' imports of the compile task's modules
  done before the clock (a farm's cluster is long-lived: its workers imported them with their first graph).

Figures: total / (N*T/W) per flow (target <= 1.10) and the scheduling overhead per graph,
(total - N*T/W) * W / N: what each graph adds to its worker's T. Prints a table; asserts nothing on speed.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

from figures import figure, load  # noqa: E402
from phases import answer, run_phase  # noqa: E402

FAKE = REPO / "tests" / "fakes" / "neuronx_cc.py"
BASE = ["--auto-cast=none", "-O1"]
LOOPBACK = "127.0.0.1"
FLOWS = ("threads", "pool", "cluster")


#: The stand-in a compile runs when ``--stand-in sh``: a POSIX shell script (a few ms of CPU to start, where
#: the Python fake takes ~50 ms: on 2 shared cores that start-up, not the orchestration, would dominate).
#: ``compile graph.hlo --framework XLA --target T --output O --logfile L ...``: sleep, then write O and L.
SH_STAND_IN = """#!/bin/sh
if [ "$1" = "--version" ]; then echo "NeuronX Compiler version 2.21.33363.0+82d8b54d"; exit 0; fi
[ "$1" = compile ] && [ "$3" = --framework ] && [ "$5" = --target ] && [ "$7" = --output ] && [ "$9" = --logfile ] \\
  || { echo "stand-in neuronx-cc: unexpected argv $*" >&2; exit 64; }
[ -f "$2" ] || { echo "stand-in neuronx-cc: no input $2" >&2; exit 64; }
sleep "${FAKE_NEURONX_CC_SLEEP:-0}"
echo "stand-in neuronx-cc compiled $2" > "${10}"
printf 'NEFF%060d' 0 > "$8"
"""


def install_fake(bindir: Path, kind: str = "sh") -> dict[str, str]:
    """The stand-in as ``neuronx-cc`` on PATH; the environment the phases run with.

    ``kind`` ``python``: tests/fakes/neuronx_cc.py (checks every option; ~50 ms of CPU to start);
    ``sh``: :data:`SH_STAND_IN`."""
    bindir.mkdir(parents=True, exist_ok=True)
    exe = bindir / "neuronx-cc"
    exe.write_text(f"#!{sys.executable}\n" + FAKE.read_text() if kind == "python" else SH_STAND_IN)
    exe.chmod(0o755)
    return {"PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}"}


def phase_capture(cache: str, n: int) -> dict[str, Any]:
    sys.path.insert(0, str(REPO))
    import torch

    from neuron_args.cache import CompileCache
    from tests.models import make_mlp, mlp_inputs

    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 2 * n)
    opts = {"cache_dir": cache, "compiler_args": BASE, "target": "trn2", "compiler": "neuronx-cc"}
    cm = torch.compile(make_mlp(), backend="neuron_libtorch_graph_capture", options=opts, dynamic=False)
    with torch.inference_mode():
        for b in range(1, n + 1):
            cm(mlp_inputs(batch=b)[0])
    return {"pending": sum(e.status == "pending" for e in CompileCache(cache).entries())}


def phase_build(kind: str, cache: str, workers: int) -> dict[str, Any]:
    import concurrent.futures as cf
    import multiprocessing as mp

    from neuron_args.cache import CompileCache
    from neuron_args.deferred import parallel_compile

    cluster = client = executor = None
    if kind == "cluster":
        from distributed import Client, LocalCluster

        cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, host=LOOPBACK,
                               dashboard_address=f"{LOOPBACK}:0")
        client = Client(cluster, set_as_default=False)
        client.wait_for_workers(workers)
        # a long-lived farm's workers imported the compile task's modules with their first graph, long ago
        client.run(exec, "import neuron_args.deferred.farm, neuron_args.compilers")
        executor = client.get_executor(pure=False)
    elif kind == "pool":
        executor = cf.ProcessPoolExecutor(workers, mp_context=mp.get_context("fork"))
    try:
        t0 = time.perf_counter()
        report = parallel_compile(cache, executor=executor, workers=workers, quiet=True)
        seconds = time.perf_counter() - t0
    finally:
        if client is not None:
            client.close()
            cluster.close()
        elif executor is not None:
            executor.shutdown()
    complete = sum(e.status == "complete" for e in CompileCache(cache).entries())
    return {"seconds": seconds, "complete": complete, "per_graph": [g.compile_seconds for g in report.graphs]}


def spawn(phase: str, cache: Path, env: dict[str, str], *extra: str) -> dict[str, Any]:
    return run_phase(__file__, ["--phase", phase, "--cache", str(cache), *extra], env)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--graphs", type=int, default=64)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=2.0, help="T: the stand-in compiler's seconds a graph")
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--flows", default=",".join(FLOWS))
    parser.add_argument("--stand-in", choices=("sh", "python"), default="sh",
                        help="the stand-in compiler: a shell script (default) or tests/fakes/neuronx_cc.py")
    parser.add_argument("--phase", choices=("capture", *FLOWS))
    parser.add_argument("--cache")
    ns = parser.parse_args()
    if ns.phase == "capture":
        return answer(phase_capture(ns.cache, ns.graphs))
    if ns.phase:
        return answer(phase_build(ns.phase, ns.cache, ns.workers))
    flows = [f for f in ns.flows.split(",") if f]
    if "cluster" in flows and importlib.util.find_spec("distributed") is None:
        flows.remove("cluster")
        print("bench_orchestration: no Dask cluster flow: the farm extra is not installed (pip install -e '.[farm]')")
    print(f"bench_orchestration: {ns.graphs} graphs, {ns.workers} workers, T = {ns.seconds:g} s, {ns.stand_in} stand-in; "
          f"{load()}", flush=True)
    tmp = Path(tempfile.mkdtemp(prefix="bench-orchestration-"))
    try:
        env = install_fake(tmp / "bin", ns.stand_in)
        source = tmp / "captured"
        captured = spawn("capture", source, env, "--graphs", str(ns.graphs))
        if captured["pending"] != ns.graphs:
            raise SystemExit(f"capture left {captured['pending']} pending entries, not {ns.graphs}")
        env["FAKE_NEURONX_CC_SLEEP"] = str(ns.seconds)
        times: dict[str, list[float]] = {f: [] for f in flows}
        per_graph: dict[str, list[float]] = {f: [] for f in flows}
        for rep in range(ns.reps):
            for kind in flows[rep % len(flows):] + flows[:rep % len(flows)]:
                copy = tmp / f"{kind}-{rep}"
                shutil.copytree(source, copy)
                result = spawn(kind, copy, env, "--workers", str(ns.workers))
                if result["complete"] != ns.graphs:
                    raise SystemExit(f"{kind}: {result['complete']} of {ns.graphs} graphs built")
                times[kind].append(result["seconds"])
                per_graph[kind].extend(result["per_graph"])
                shutil.rmtree(copy, ignore_errors=True)
        report(ns, times, per_graph)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


def report(ns: argparse.Namespace, times: dict[str, list[float]], per_graph: dict[str, list[float]]) -> None:
    ideal = ns.graphs * ns.seconds / ns.workers
    print(f"  ideal N*T/W = {ideal:.2f} s")
    print(f"  {'flow':<8} {'median s':>9} {'min s':>7} {'total/ideal':>12} {'overhead/graph':>15}  per-graph report s (median)")
    for kind, runs in times.items():
        med = statistics.median(runs)
        ratio, overhead = (med / ideal if ideal else float("inf")), (med - ideal) * ns.workers / ns.graphs
        print(f"  {kind:<8} {med:9.2f} {min(runs):7.2f} {ratio:12.3f} {overhead * 1000:12.0f} ms  "
              f"{statistics.median(per_graph[kind]):.2f}")
        if ideal:
            figure(f"parallel_compile {ns.graphs} graphs / {ns.workers} workers, T={ns.seconds:g} s, {kind}: "
                   "total / (N*T/W)", ratio, "<= 1.10")
        figure(f"parallel_compile scheduling overhead per graph, {kind}", overhead * 1000, unit="ms")
    print(f"  ({load()})")


if __name__ == "__main__":
    sys.exit(main())
