"""The deferred flow: warmup wall time of N graphs, parallel vs sequential, and compile-worker scaling.

    python benchmarks/bench_deferred.py [--quick] [--graphs 8] [--reps 1] [--flows-only]

The N graphs are tests/models.py's MLP at N batch sizes (1..N): N distinct static graphs and
cache entries. Every flow runs in a fresh subprocess of this script (``--phase ...``) with its own
fresh cache dir, so no flow inherits another's Dynamo state, jax client or cache:

- ``--phase sequential``: the in-process flow: ``torch.compile(backend="neuron_libtorch")`` called
  once per shape (each call lowers, runs the local compiler and loads the executable);
- ``--phase parallel``: ``parallel_trace`` (forked children capture pending entries; the parent
  has no jax client, so fork is safe) then ``parallel_compile`` (default workers = CPU count);
- ``--phase parallel-preimport``: the same, but the parent first imports jax and torchax (no jax
  client, so fork stays safe) -- a candidate fix, timed including the imports;
- ``--phase capture`` once, its cache copied twice, then ``--phase compile --workers 1`` and
  ``--workers 2`` on the copies: the ``parallel_compile`` speed-up (target >= 1.8x on 2 cores).

Every phase starts from the state of a process that uses the runner (``neuron_args.runner``
imported: torch, Dynamo and the backends loaded, no jax), times its own work with
``time.perf_counter`` (after those imports and model construction) and prints one
``RESULT {json}`` line; the orchestrator also reports each process's wall time.
``--reps`` repeats every phase (median and min reported). Prints a table; asserts nothing on speed.
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
sys.path.insert(0, str(REPO / "benchmarks"))

from figures import figure  # noqa: E402
BASE = ["--auto-cast=none", "-O1"]


def options(cache: str) -> dict[str, Any]:
    return {"cache_dir": cache, "compiler_args": BASE, "target": "trn2", "compiler": "local"}


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f} {five:.2f} {fifteen:.2f} on {os.cpu_count()} cores"


# -- phases (each in its own process) ------------------------------------------------------------
def _models(n: int) -> tuple[Any, list[Any]]:
    """The model and inputs, in the state a runner process starts from (untimed).

    ``neuron_args.runner`` is imported first, as a process using the runner has it: torch, Dynamo
    and the backends are loaded (forked children inherit them), jax is not (no client).
    """
    sys.path.insert(0, str(REPO))
    import neuron_args.runner  # noqa: F401
    from tests.models import make_mlp, mlp_inputs

    return make_mlp(), [mlp_inputs(batch=b)[0] for b in range(1, n + 1)]


def phase_sequential(cache: str, n: int) -> dict[str, Any]:
    import torch

    from neuron_args.cache import STATS, CompileCache

    model, xs = _models(n)
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 4 * n)
    cm = torch.compile(model, backend="neuron_libtorch", options=options(cache), dynamic=False)
    per_graph = []
    t0 = time.perf_counter()
    with torch.inference_mode():
        for x in xs:
            t1 = time.perf_counter()
            cm(x)
            per_graph.append(time.perf_counter() - t1)
    seconds = time.perf_counter() - t0
    complete = sum(e.status == "complete" for e in CompileCache(cache).entries())
    return {"seconds": seconds, "per_graph": per_graph, "complete": complete, "compiles": STATS.compiles}


def preimport() -> None:
    """Candidate fix (not in the library): import what every trace child needs once, in the parent.

    jax and torchax (and the lowering module) are imported but no jax client is created, so
    forking stays safe (``fork_is_safe()`` is still True) and each child inherits the modules
    instead of importing them again. (torch._dynamo is already loaded: see ``_models``.)
    """
    from torch._dynamo.backends.common import aot_autograd  # noqa: F401

    from neuron_args.lowering.torchax_compat import import_torchax

    import_torchax()
    import neuron_args.lowering.hlo  # noqa: F401
    import neuron_args.seams.backends  # noqa: F401


def _capture(cache: str, n: int, warm_parent: bool = False) -> tuple[float, list[Any]]:
    from neuron_args.deferred import parallel_trace
    from neuron_args.deferred.parallel_trace import fork_is_safe

    model, xs = _models(n)
    jobs = [(model, {"x": x}, BASE) for x in xs]
    t0 = time.perf_counter()
    if warm_parent:
        preimport()
    if not fork_is_safe():
        raise SystemExit("the parent holds a jax client; parallel_trace would fall back to spawn")
    results = parallel_trace(jobs, options=options(cache), timeout=600)
    return time.perf_counter() - t0, results


def phase_parallel(cache: str, n: int, warm_parent: bool = False) -> dict[str, Any]:
    from neuron_args.cache import CompileCache
    from neuron_args.deferred import parallel_compile

    trace_s, results = _capture(cache, n, warm_parent)
    t0 = time.perf_counter()
    report = parallel_compile(cache, quiet=True)
    compile_s = time.perf_counter() - t0
    complete = sum(e.status == "complete" for e in CompileCache(cache).entries())
    return {"seconds": trace_s + compile_s, "trace": trace_s, "compile": compile_s, "complete": complete,
            "trace_children": [r.seconds for r in results], "per_graph": [g.seconds for g in report.graphs]}


def phase_capture(cache: str, n: int) -> dict[str, Any]:
    from neuron_args.cache import CompileCache

    trace_s, _ = _capture(cache, n)
    pending = sum(e.status == "pending" for e in CompileCache(cache).entries())
    return {"seconds": trace_s, "pending": pending}


def _log_seconds(entries: list[Any], label: str) -> list[float]:
    """A figure the local compiler logs per graph (``jax startup seconds``, ``compile seconds``)."""
    out = []
    for entry in entries:
        for line in entry.log_path.read_text().splitlines():
            if f"{label}: " in line:
                out.append(float(line.rsplit(": ", 1)[1]))
    return out


def phase_compile(cache: str, workers: int) -> dict[str, Any]:
    from neuron_args.cache import CompileCache
    from neuron_args.deferred import parallel_compile

    # As in a real warmup, the parent already has torch + Dynamo imported, and the forked pool
    # workers inherit them. Without this every worker imports them on its first graph, because
    # the worker body reaches compile_entry through neuron_args.seams.backends (timed here).
    t0 = time.perf_counter()
    import neuron_args.runner  # noqa: F401

    import_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    report = parallel_compile(cache, workers=workers, quiet=True)
    seconds = time.perf_counter() - t0
    entries = CompileCache(cache).entries()
    complete = sum(e.status == "complete" for e in entries)
    return {"seconds": seconds, "complete": complete, "per_graph": [g.seconds for g in report.graphs],
            "backends_import": import_s, "jax_startup": _log_seconds(entries, "jax startup seconds"),
            "xla_compile": _log_seconds(entries, "compile seconds")}


def run_phase(ns: argparse.Namespace) -> int:
    if ns.phase == "sequential":
        result = phase_sequential(ns.cache, ns.graphs)
    elif ns.phase == "parallel":
        result = phase_parallel(ns.cache, ns.graphs)
    elif ns.phase == "parallel-preimport":
        result = phase_parallel(ns.cache, ns.graphs, warm_parent=True)
    elif ns.phase == "capture":
        result = phase_capture(ns.cache, ns.graphs)
    else:
        result = phase_compile(ns.cache, ns.workers)
    print("RESULT " + json.dumps(result), flush=True)
    return 0


# -- orchestrator ----------------------------------------------------------------------------------
def spawn(phase: str, cache: Path, n: int, workers: int | None = None) -> dict[str, Any]:
    argv = [sys.executable, str(Path(__file__).resolve()), "--phase", phase, "--cache", str(cache),
            "--graphs", str(n)]
    if workers is not None:
        argv += ["--workers", str(workers)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    env.pop("NEURON_ARGS_COMPILE_WORKERS", None)
    env.pop("NEURON_ARGS_TRACE_WORKERS", None)
    t0 = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=1800)
    wall = time.perf_counter() - t0
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise SystemExit(f"phase {phase} failed (exit {proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    result = json.loads(lines[-1][len("RESULT "):])
    result["process_wall"] = wall
    return result


def row(name: str, values: list[float], note: str = "") -> None:
    print(f"  {name:<61} {statistics.median(values):>8.2f} {min(values):>8.2f} s  {note}")


def orchestrate(n: int, reps: int, compare_only: bool = False) -> int:
    print(f"bench_deferred: {n} graphs (MLP at batch 1..{n}), {reps} rep(s) per phase; {load()} (start)")
    flows = ("sequential", "parallel", "parallel-preimport")
    runs: dict[str, list[dict[str, Any]]] = {f: [] for f in flows}
    captures: list[dict[str, Any]] = []
    workers_runs: dict[int, list[dict[str, Any]]] = {1: [], 2: []}
    loads: list[str] = []
    with tempfile.TemporaryDirectory(prefix="bench-deferred-") as tmp:
        root = Path(tmp)
        for rep in range(reps):
            # rotate which flow goes first so a load drift does not favour one
            for phase in flows[rep % 3:] + flows[:rep % 3]:
                runs[phase].append(spawn(phase, root / f"{phase}-{rep}", n))
                loads.append(f"after {phase} rep {rep}: {load()}")
            if compare_only:
                continue
            captured = root / f"captured-{rep}"
            captures.append(spawn("capture", captured, n))
            for workers in ((1, 2) if rep % 2 == 0 else (2, 1)):
                copy = root / f"captured-{rep}-w{workers}"
                shutil.copytree(captured, copy)
                workers_runs[workers].append(spawn("compile", copy, n, workers))
                loads.append(f"after compile workers={workers} rep {rep}: {load()}")

    seq, par, pre = runs["sequential"], runs["parallel"], runs["parallel-preimport"]
    print("\n1. warmup wall time of the whole set (timed inside each phase process)".ljust(63) + "  median      min")
    row("A sequential in-process (torch.compile'd call per shape)", [r["seconds"] for r in seq],
        f"complete {seq[-1]['complete']}/{n}")
    row("B parallel_trace + parallel_compile", [r["seconds"] for r in par], f"complete {par[-1]['complete']}/{n}")
    row("    of which parallel_trace (2 children at a time)", [r["trace"] for r in par])
    row("    of which parallel_compile (default workers)", [r["compile"] for r in par])
    row("C as B, parent pre-imports jax + torchax (candidate fix)", [r["seconds"] for r in pre],
        f"complete {pre[-1]['complete']}/{n}")
    row("    of which pre-import + parallel_trace", [r["trace"] for r in pre])
    row("    of which parallel_compile (default workers)", [r["compile"] for r in pre])
    for name, rs in (("A", seq), ("B", par), ("C", pre)):
        row(f"{name} process wall incl. interpreter + imports", [r["process_wall"] for r in rs])
    med = {k: statistics.median(r["seconds"] for r in v) for k, v in runs.items()}
    print("  per rep, parallel / sequential: "
          + ", ".join(f"{b['seconds'] / a['seconds']:.2f}" for a, b in zip(seq, par))
          + "; pre-import / sequential: " + ", ".join(f"{c['seconds'] / a['seconds']:.2f}" for a, c in zip(seq, pre)))
    print(f"  ratio parallel / sequential wall: {med['parallel'] / med['sequential']:.2f} "
          f"(speed-up {med['sequential'] / med['parallel']:.2f}x); with the parent pre-import: "
          f"{med['parallel-preimport'] / med['sequential']:.2f} (speed-up "
          f"{med['sequential'] / med['parallel-preimport']:.2f}x)")
    figure(f"warmup of {n} static graphs: deferred flow (2 workers) / in-process", med["parallel"] / med["sequential"],
           "<= 0.35", note=f"{med['parallel']:.1f} s vs {med['sequential']:.1f} s")
    print(f"  A per graph (last rep): {', '.join(f'{s:.1f}' for s in seq[-1]['per_graph'])} s")
    print(f"  B trace child seconds (last rep): {', '.join(f'{s:.1f}' for s in par[-1]['trace_children'])}")
    print(f"  C trace child seconds (last rep): {', '.join(f'{s:.1f}' for s in pre[-1]['trace_children'])}")

    if not compare_only:
        w1, w2 = workers_runs[1], workers_runs[2]
        print(f"\n2. parallel_compile of {n} captured graphs, 1 vs 2 workers".ljust(63) + "  median      min")
        row("capture (parallel_trace, for the copies)", [r["seconds"] for r in captures],
            f"pending {captures[-1]['pending']}/{n}")
        row("parallel_compile workers=1", [r["seconds"] for r in w1], f"complete {w1[-1]['complete']}/{n}")
        row("parallel_compile workers=2", [r["seconds"] for r in w2], f"complete {w2[-1]['complete']}/{n}")
        row("(untimed above) parent import of neuron_args.runner", [r["backends_import"] for r in w1 + w2],
            "torch + Dynamo; a worker pays it too if the parent has not")
        speedup = statistics.median(r["seconds"] for r in w1) / statistics.median(r["seconds"] for r in w2)
        figure("parallel_compile speed-up 1 -> 2 workers", speedup, ">= 1.8", "x",
               note="per rep: " + ", ".join(f"{a['seconds'] / b['seconds']:.2f}" for a, b in zip(w1, w2)))
        print(f"  speed-up workers=1 / workers=2: {speedup:.2f}x  (target >= 1.8: "
              f"{'met' if speedup >= 1.8 else 'MISSED'}); per rep: "
              + ", ".join(f"{a['seconds'] / b['seconds']:.2f}x" for a, b in zip(w1, w2)))
        for w, rs in ((1, w1), (2, w2)):
            last = rs[-1]
            print(f"  per graph (last rep), workers={w}: compiler wall median {statistics.median(last['per_graph']):.2f} s, "
                  f"of which jax start-up {statistics.median(last['jax_startup']):.2f} s and XLA compile "
                  f"{statistics.median(last['xla_compile']):.2f} s (the rest: interpreter start + imports + I/O)")
    print("\nload during the run:\n  " + "\n  ".join(loads))
    print(f"bench_deferred: {load()} (end)")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="part 1 only (same as --flows-only), one rep")
    parser.add_argument("--graphs", type=int, default=8, help="number of graphs (>= 8 for the reported figure)")
    parser.add_argument("--reps", type=int, default=None, help="repetitions of every phase (default 1)")
    parser.add_argument("--flows-only", action="store_true", help="only part 1 (skip the workers comparison)")
    parser.add_argument("--phase", choices=("sequential", "parallel", "parallel-preimport", "capture", "compile"), help=argparse.SUPPRESS)
    parser.add_argument("--cache", help=argparse.SUPPRESS)
    parser.add_argument("--workers", type=int, default=None, help=argparse.SUPPRESS)
    ns = parser.parse_args()
    if ns.phase:
        return run_phase(ns)
    return orchestrate(ns.graphs, ns.reps or 1, ns.flows_only or ns.quick)


if __name__ == "__main__":
    raise SystemExit(main())
