"""The compile farm: parallel_compile of 8 pending graphs on a 2-worker Dask LocalCluster vs a 2-process pool.

    python benchmarks/bench_farm.py [--graphs 8] [--reps 3]

tests/models.py's MLP at N batch sizes is captured once (``neuron_libtorch_graph_capture``, local
compiler); each repetition copies that cache twice and builds one copy per flow, each flow in a
fresh subprocess of this script (``--phase pool|cluster``) that imports no torch or jax:

- ``pool``: ``parallel_compile(executor=ProcessPoolExecutor(2))`` (fork);
- ``cluster``: ``parallel_compile(executor=client.get_executor())`` on a ``LocalCluster`` of 2
  worker processes with 1 thread each, on 127.0.0.1 (started before the clock starts: a farm's
  cluster is long-lived).

Both flows ship each graph's inputs and results (``neuron_args.deferred.farm``); the figure of
interest is the wall-time ratio cluster / pool (target <= 1.2) and the bytes shipped per graph
(the pickled task out, the pickled outcome back). Prints a table; asserts nothing on speed.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
BASE = ["--auto-cast=none", "-O1"]
LOOPBACK = "127.0.0.1"


def capture(cache: Path, n: int) -> None:
    sys.path.insert(0, str(REPO))
    import torch

    from tests.models import MLP

    torch.manual_seed(0)
    opts = {"cache_dir": str(cache), "compiler_args": BASE, "target": "trn2", "compiler": "local"}
    cm = torch.compile(MLP().eval(), backend="neuron_libtorch_graph_capture", options=opts, dynamic=False)
    with torch.inference_mode():
        for b in range(1, n + 1):
            cm(torch.ones(b, 32))


def shipped_bytes(cache: Path) -> dict[str, Any]:
    """Pickled size of each graph's task (out) and outcome (back), from the built entries."""
    import pickle

    from neuron_args.cache import CompileCache
    from neuron_args.deferred.farm import CompileOutcome, prepare_task

    out, back = [], []
    for entry in CompileCache(cache).entries():
        md = entry.metadata()
        task = prepare_task(entry, {**md, "compiler": {}}, md["compiler_args"])
        blob, log = entry.executable_path.read_bytes(), entry.log_path.read_bytes()
        outcome = CompileOutcome(key=entry.key, status="compiled", worker="host:1", workdir="/tmp/x" * 8,
                                 executable=blob, executable_sha256="0" * 64, log=log, argv=tuple(md["command"]),
                                 compiler=md["compiler"])
        out.append(len(pickle.dumps(task)))
        back.append(len(pickle.dumps(outcome)))
    return {"task": out, "outcome": back}


def phase(kind: str, cache: str, workers: int) -> dict[str, Any]:
    import concurrent.futures as cf
    import multiprocessing as mp

    from neuron_args.cache import CompileCache
    from neuron_args.deferred import parallel_compile

    cluster = client = None
    if kind == "cluster":
        from distributed import Client, LocalCluster

        cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, host=LOOPBACK,
                               dashboard_address=f"{LOOPBACK}:0")
        client = Client(cluster, set_as_default=False)
        client.wait_for_workers(workers)
        executor: cf.Executor = client.get_executor(pure=False)
    else:
        executor = cf.ProcessPoolExecutor(workers, mp_context=mp.get_context("fork"))
    try:
        t0 = time.perf_counter()
        report = parallel_compile(cache, executor=executor, quiet=True)
        seconds = time.perf_counter() - t0
    finally:
        if client is not None:
            client.close()
            cluster.close()
        else:
            executor.shutdown()
    complete = sum(e.status == "complete" for e in CompileCache(cache).entries())
    return {"seconds": seconds, "complete": complete, "per_graph": sorted(g.compile_seconds for g in report.graphs)}


def spawn(kind: str, cache: Path, workers: int) -> dict[str, Any]:
    argv = [sys.executable, str(Path(__file__).resolve()), "--phase", kind, "--cache", str(cache),
            "--workers", str(workers)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=1800)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise SystemExit(f"phase {kind} failed (exit {proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    return json.loads(lines[-1][len("RESULT "):])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--graphs", type=int, default=8)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--phase", choices=("pool", "cluster"))
    parser.add_argument("--cache")
    ns = parser.parse_args()
    if ns.phase:
        print("RESULT " + json.dumps(phase(ns.phase, ns.cache, ns.workers)), flush=True)
        return 0
    tmp = Path(tempfile.mkdtemp(prefix="bench-farm-"))
    try:
        source = tmp / "captured"
        capture(source, ns.graphs)
        times: dict[str, list[float]] = {"pool": [], "cluster": []}
        built = None
        for rep in range(ns.reps):
            order = ("pool", "cluster") if rep % 2 == 0 else ("cluster", "pool")
            for kind in order:
                copy = tmp / f"{kind}-{rep}"
                shutil.copytree(source, copy)
                result = spawn(kind, copy, ns.workers)
                if result["complete"] != ns.graphs:
                    raise SystemExit(f"{kind}: {result['complete']} of {ns.graphs} graphs built")
                times[kind].append(result["seconds"])
                built = copy
        sizes = shipped_bytes(built)
        one, five, _ = os.getloadavg()
        pool, cluster = statistics.median(times["pool"]), statistics.median(times["cluster"])
        print(f"bench_farm: {ns.graphs} pending MLP graphs, {ns.workers} workers, {ns.reps} reps "
              f"(load average {one:.2f} {five:.2f} on {os.cpu_count()} cores)")
        runs = {kind: ", ".join(f"{t:.2f}" for t in ts) for kind, ts in times.items()}
        print(f"  {ns.workers}-process pool        median {pool:6.2f} s  (runs {runs['pool']})")
        print(f"  {ns.workers}-worker LocalCluster median {cluster:6.2f} s  (runs {runs['cluster']})")
        print(f"  ratio cluster / pool      {cluster / pool:6.2f}  (target <= 1.2)")
        print(f"  bytes shipped per graph: task out median {statistics.median(sizes['task']):.0f} B "
              f"(HLO + args), outcome back median {statistics.median(sizes['outcome']):.0f} B "
              f"(executable + log); range out {min(sizes['task'])}-{max(sizes['task'])} B, "
              f"back {min(sizes['outcome'])}-{max(sizes['outcome'])} B")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
