"""The deferred flow: warmup wall time of N graphs, parallel vs sequential, and compile-worker scaling.

    python benchmarks/bench_deferred.py [--quick] [--graphs 8] [--reps 1] [--flows-only]

The N graphs are tests/models.py's MLP at N batch sizes (1..N): N distinct static graphs and
cache entries. Every flow runs in a fresh subprocess of this script (``--phase ...``) with its own
fresh cache dir, so no flow inherits another's Dynamo state, jax client or cache:

- ``--phase sequential``: the in-process flow: ``torch.compile(backend="neuron_libtorch")`` called
  once per shape (each call lowers, runs the local compiler and loads the executable);
- ``--phase parallel``: the runner's parallel flow: one compile worker prestarted, ``parallel_trace``
  (2 forked long-lived children capture pending entries, 4 each; the parent has no jax client, so
  fork is safe) then ``parallel_compile`` (default workers = CPU count);
- ``--phase capture`` once, its cache copied for each run, then ``--phase compile --workers 1`` and
  ``--workers 2`` on the copies: the ``parallel_compile`` speed-up (target >= 1.8x on 2 cores);
- ``--phase start``: the time a runner process waits for its first warm compile worker to be ready
  (``WorkerPool.prestart(1)``: a worker process's start),
  the T in "8 graphs of c seconds scale as (T + 8c) / (T + 4c)" when the call starts the workers.

The small MLPs compile in ~0.05 s each on XLA:CPU, so with warm workers little is left to scale;
``--model deep`` graphs (a ``DEEP_LAYERS``-layer MLP, same batch sizes) compile in ~0.25-0.5 s each, as a
neuronx-cc compile dominates its worker's time. Part 2 (``parallel_compile`` 1 vs 2 workers) and
part 3 (the two flows) run them too, so both regimes are reported side by side.

Every flow and every ``parallel_compile`` runs side by side: with the local compiler's warm
workers (the default) and with one process per graph (``NEURON_ARGS_WARM_WORKERS=0``, as before
the warm workers; small MLPs only in part 2).

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

from figures import figure, load  # noqa: E402
BASE = ["--auto-cast=none", "-O1"]
#: The autograd mode both flows build their graphs in (a key component): a runner's, which serves in inference mode.
SERVE_MODE = "inference_mode"


def options(cache: str) -> dict[str, Any]:
    return {"cache_dir": cache, "compiler_args": BASE, "target": "trn2", "compiler": "local"}



# -- phases (each in its own process) ------------------------------------------------------------
#: Layers of the compile-bound model (``--model deep``): its XLA:CPU compile takes ~0.25-0.5 s a graph
#: on these machines, so a compile dominates its worker's time as a neuronx-cc compile (minutes) does.
DEEP_LAYERS = 32


def _deep_mlp() -> Any:
    import torch

    class DeepMLP(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = torch.nn.ModuleList(torch.nn.Linear(32, 32) for _ in range(DEEP_LAYERS))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for layer in self.layers:
                x = torch.nn.functional.gelu(layer(x))
            return x

    torch.manual_seed(0)
    return DeepMLP().eval()


def _models(n: int, model: str = "mlp") -> tuple[Any, list[Any]]:
    """The model and inputs, in the state a runner process starts from (untimed).

    ``neuron_args.runner`` is imported first, as a process using the runner has it: torch, Dynamo
    and the backends are loaded (forked children inherit them), jax is not (no client).
    """
    sys.path.insert(0, str(REPO))
    import neuron_args.runner  # noqa: F401
    from tests.models import make_mlp, mlp_inputs

    return (make_mlp() if model == "mlp" else _deep_mlp()), [mlp_inputs(batch=b)[0] for b in range(1, n + 1)]


def phase_sequential(cache: str, n: int, model_kind: str = "mlp") -> dict[str, Any]:
    import torch

    from neuron_args.cache_key import autograd_mode
    from neuron_args.cache import STATS, CompileCache

    model, xs = _models(n, model_kind)
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 4 * n)
    cm = torch.compile(model, backend="neuron_libtorch", options=options(cache), dynamic=False)
    per_graph = []
    t0 = time.perf_counter()
    with autograd_mode(SERVE_MODE):
        for x in xs:
            t1 = time.perf_counter()
            cm(x)
            per_graph.append(time.perf_counter() - t1)
    seconds = time.perf_counter() - t0
    complete = sum(e.status == "complete" for e in CompileCache(cache).entries())
    return {"seconds": seconds, "per_graph": per_graph, "complete": complete, "compiles": STATS.compiles}


def trace_jobs(model: Any, xs: list[Any]) -> list[Any]:
    """The deferred flow's jobs, as a runner builds them: traced in :data:`SERVE_MODE`, the mode the in-process
    flow compiles in. A plain ``(model, kwargs, args)`` job is traced in the ``parallel_trace`` call's mode (here
    ``grad``: a training forward that also returns what its backward saves), so the two flows would build
    different graphs."""
    from neuron_args.deferred.jobs import TraceJob

    return [TraceJob(model, {"x": x}, BASE, autograd=SERVE_MODE) for x in xs]


def _capture(cache: str, n: int, prestart: bool = False, model_kind: str = "mlp") -> tuple[float, list[Any]]:
    from neuron_args.deferred import parallel_trace
    from neuron_args.deferred.parallel_trace import fork_is_safe
    from neuron_args.runner import prestart_compile_worker
    from neuron_args.settings import CompileSettings

    model, xs = _models(n, model_kind)
    jobs = trace_jobs(model, xs)
    t0 = time.perf_counter()
    if not fork_is_safe():
        raise SystemExit("the parent holds a jax client; parallel_trace would fall back to spawn")
    # as the runner's parallel flow does: a compile worker starts while the children trace
    before = (lambda: prestart_compile_worker(CompileSettings.from_options(options(cache), "bench"))) if prestart else None
    results = parallel_trace(jobs, options=options(cache), timeout=600, before_children=before)
    return time.perf_counter() - t0, results


def phase_parallel(cache: str, n: int, model_kind: str = "mlp") -> dict[str, Any]:
    from neuron_args.cache import CompileCache
    from neuron_args.deferred import parallel_compile

    trace_s, results = _capture(cache, n, prestart=True, model_kind=model_kind)
    t0 = time.perf_counter()
    report = parallel_compile(cache, quiet=True)
    compile_s = time.perf_counter() - t0
    complete = sum(e.status == "complete" for e in CompileCache(cache).entries())
    return {"seconds": trace_s + compile_s, "trace": trace_s, "compile": compile_s, "complete": complete,
            "trace_children": [r.seconds for r in results], "per_graph": [g.compile_seconds for g in report.graphs]}


def phase_capture(cache: str, n: int, model: str = "mlp") -> dict[str, Any]:
    from neuron_args.cache import CompileCache

    trace_s, _ = _capture(cache, n, model_kind=model)
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


def phase_compile(cache: str, workers: int, prestart: bool = False) -> dict[str, Any]:
    from neuron_args.cache import CompileCache
    from neuron_args.compilers import workers as warm
    from neuron_args.deferred import parallel_compile

    # As in a real warmup, the parent already has torch + Dynamo imported (timed here); the pool
    # workers' body (compile_entry in neuron_args.compilers.base) itself needs neither.
    t0 = time.perf_counter()
    import neuron_args.runner  # noqa: F401

    import_s = time.perf_counter() - t0
    if prestart:  # a process that compiled before (a pytest session, a second warmup): its workers are up
        assert warm.enabled() and warm.shared_pool().prestart(workers) == workers
    t0 = time.perf_counter()
    report = parallel_compile(cache, workers=workers, quiet=True)
    seconds = time.perf_counter() - t0
    entries = CompileCache(cache).entries()
    complete = sum(e.status == "complete" for e in entries)
    return {"seconds": seconds, "complete": complete, "per_graph": [g.compile_seconds for g in report.graphs],
            "backends_import": import_s, "jax_startup": _log_seconds(entries, "jax startup seconds"),
            "xla_compile": _log_seconds(entries, "compile seconds")}


def phase_start() -> dict[str, Any]:
    from neuron_args.compilers import workers as warm

    import neuron_args.runner  # noqa: F401  (a runner process: torch and Dynamo loaded)

    t0 = time.perf_counter()
    assert warm.shared_pool().prestart(1) == 1
    return {"seconds": time.perf_counter() - t0}


def run_phase(ns: argparse.Namespace) -> int:
    if ns.phase == "start":
        result = phase_start()
    elif ns.phase == "sequential":
        result = phase_sequential(ns.cache, ns.graphs, ns.model)
    elif ns.phase == "parallel":
        result = phase_parallel(ns.cache, ns.graphs, ns.model)
    elif ns.phase == "capture":
        result = phase_capture(ns.cache, ns.graphs, ns.model)
    else:
        result = phase_compile(ns.cache, ns.workers, ns.prestart)
    print("RESULT " + json.dumps(result), flush=True)
    return 0


# -- orchestrator ----------------------------------------------------------------------------------
#: The ways the local compiler runs, compared side by side in every run: warm workers (started by the
#: timed call itself), the same with the workers already up (``prestarted``: parallel_compile only),
#: and one process per graph (as before the warm workers).
MODES = {"warm": {}, "one-shot": {"NEURON_ARGS_WARM_WORKERS": "0"}}
COMPILE_MODES = ("warm", "prestarted", "one-shot")
#: The modes of part 3 (the compile-bound flows).
DEEP_MODES = ("warm",)
#: The models of part 2 and 3: the 8 small MLPs (as ever), and compile-bound graphs (one-shot skipped).
MODELS = ("mlp", "deep")


def spawn(phase: str, cache: Path, n: int, workers: int | None = None, mode: str = "warm",
          model: str = "mlp") -> dict[str, Any]:
    argv = [sys.executable, str(Path(__file__).resolve()), "--phase", phase, "--cache", str(cache),
            "--graphs", str(n), "--model", model]
    if workers is not None:
        argv += ["--workers", str(workers)]
    if mode == "prestarted":
        argv.append("--prestart")
        mode = "warm"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    for name in ("NEURON_ARGS_COMPILE_WORKERS", "NEURON_ARGS_TRACE_WORKERS", "NEURON_ARGS_WARM_WORKERS"):
        env.pop(name, None)
    env.update(MODES[mode])
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


def _med(runs: list[dict[str, Any]], field: str = "seconds") -> float:
    return statistics.median(r[field] for r in runs)


def _compile_scaling(model: str, n: int, captures: list[dict[str, Any]],
                     workers_runs: dict[tuple[int, str, str], list[dict[str, Any]]]) -> dict[str, tuple[float, str]]:
    """Part 2's rows for one model: ``parallel_compile`` with 1 and 2 workers in each mode; the speed-ups."""
    print(f"\n2. parallel_compile of {n} captured graphs ({model}), 1 vs 2 workers".ljust(63) + "  median      min")
    row("capture (parallel_trace, for the copies)", [r["seconds"] for r in captures],
        f"pending {captures[-1]['pending']}/{n}")
    speedups = {}
    for mode in COMPILE_MODES:
        w1, w2 = workers_runs.get((1, mode, model)), workers_runs.get((2, mode, model))
        if not w1 or not w2:
            continue
        row(f"parallel_compile workers=1 ({mode})", [r["seconds"] for r in w1], f"complete {w1[-1]['complete']}/{n}")
        row(f"parallel_compile workers=2 ({mode})", [r["seconds"] for r in w2], f"complete {w2[-1]['complete']}/{n}")
        speedups[mode] = (_med(w1) / _med(w2), ", ".join(f"{a['seconds'] / b['seconds']:.2f}" for a, b in zip(w1, w2)))
        for w, rs in ((1, w1), (2, w2)):
            last = rs[-1]
            print(f"    per graph (last rep), workers={w}: compiler wall median {statistics.median(last['per_graph']):.2f} s,"
                  f" of which jax start-up {statistics.median(last['jax_startup']):.2f} s and XLA compile "
                  f"{statistics.median(last['xla_compile']):.2f} s")
    for mode, (value, reps_text) in speedups.items():
        print(f"  speed-up workers=1 / workers=2 ({mode}): {value:.2f}x (target >= 1.8: "
              f"{'met' if value >= 1.8 else 'MISSED'}); per rep: {reps_text}")
    return speedups


def orchestrate(n: int, reps: int, compare_only: bool = False) -> int:
    print(f"bench_deferred: {n} graphs (MLP at batch 1..{n}), {reps} rep(s) per phase; {load()} (start)")
    flows = [(phase, mode) for phase in ("sequential", "parallel") for mode in MODES]
    runs: dict[tuple[str, str], list[dict[str, Any]]] = {f: [] for f in flows}
    captures: dict[str, list[dict[str, Any]]] = {model: [] for model in MODELS}
    compiles = [(w, mode, model) for model in MODELS for mode in COMPILE_MODES for w in (1, 2)
                if model == "mlp" or mode != "one-shot"]
    workers_runs: dict[tuple[int, str, str], list[dict[str, Any]]] = {c: [] for c in compiles}
    deep_flows: dict[tuple[str, str], list[dict[str, Any]]] = {(p, m): [] for p in ("sequential", "parallel")
                                                               for m in DEEP_MODES}
    loads: list[str] = []
    starts: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-deferred-") as tmp:
        root = Path(tmp)
        for rep in range(reps):
            starts.append(spawn("start", root / f"start-{rep}", n))
            # rotate which flow goes first so a load drift does not favour one
            for phase, mode in flows[rep % len(flows):] + flows[:rep % len(flows)]:
                runs[phase, mode].append(spawn(phase, root / f"{phase}-{mode}-{rep}", n, mode=mode))
                loads.append(f"after {phase} ({mode}) rep {rep}: {load()}")
            if compare_only:
                continue
            deep = list(deep_flows)
            for phase, mode in deep if rep % 2 == 0 else deep[::-1]:
                deep_flows[phase, mode].append(spawn(phase, root / f"deep-{phase}-{mode}-{rep}", n, mode=mode,
                                                     model="deep"))
                loads.append(f"after {phase} ({mode}, deep model) rep {rep}: {load()}")
            for model in MODELS:
                captured = root / f"captured-{model}-{rep}"
                captures[model].append(spawn("capture", captured, n, model=model))
                for workers, mode, _ in [c for c in (compiles if rep % 2 == 0 else compiles[::-1]) if c[2] == model]:
                    copy = root / f"captured-{model}-{rep}-w{workers}-{mode}"
                    shutil.copytree(captured, copy)
                    workers_runs[workers, mode, model].append(spawn("compile", copy, n, workers, mode, model))
                    loads.append(f"after compile workers={workers} ({mode}, {model}) rep {rep}: {load()}")

    print("\n1. warmup wall time of the whole set (timed inside each phase process)".ljust(63) + "  median      min")
    for mode in MODES:
        seq, par = runs["sequential", mode], runs["parallel", mode]
        print(f"  local compiler: {mode}" + (f" ({', '.join(f'{k}={v}' for k, v in MODES[mode].items())})"
                                              if MODES[mode] else " workers"))
        row("A sequential in-process (torch.compile'd call per shape)", [r["seconds"] for r in seq],
            f"complete {seq[-1]['complete']}/{n}")
        row("B parallel_trace + parallel_compile", [r["seconds"] for r in par], f"complete {par[-1]['complete']}/{n}")
        row("    of which parallel_trace (2 children, 4 graphs each)", [r["trace"] for r in par])
        row("    of which parallel_compile (default workers)", [r["compile"] for r in par])
        print(f"  A per graph (last rep): {', '.join(f'{s:.2f}' for s in seq[-1]['per_graph'])} s")
        print(f"  ratio B / A: {_med(par) / _med(seq):.2f}; per rep: "
              + ", ".join(f"{b['seconds'] / a['seconds']:.2f}" for a, b in zip(seq, par)))
    seq, par = runs["sequential", "warm"], runs["parallel", "warm"]
    old_seq, old_par = runs["sequential", "one-shot"], runs["parallel", "one-shot"]
    figure(f"warmup of {n} static graphs: deferred flow (2 workers) / in-process", _med(par) / _med(seq),
           "<= 0.35", note=f"{_med(par):.1f} s vs {_med(seq):.1f} s; one process per graph: "
           f"{_med(old_par) / _med(old_seq):.2f} ({_med(old_par):.1f} s vs {_med(old_seq):.1f} s)")
    figure(f"in-process warmup of {n} graphs: one process per graph / warm workers", _med(old_seq) / _med(seq),
           None, "x", note=f"{_med(old_seq):.1f} s vs {_med(seq):.1f} s")
    figure(f"deferred warmup of {n} graphs: one process per graph / warm workers", _med(old_par) / _med(par),
           None, "x", note=f"{_med(old_par):.1f} s vs {_med(par):.1f} s")

    if not compare_only:
        speedups = {model: _compile_scaling(model, n, captures[model], workers_runs) for model in MODELS}
        every = [r for (_, mode, _), rs in workers_runs.items() if mode == "warm" for r in rs]
        row("(untimed above) parent import of neuron_args.runner", [r["backends_import"] for r in every],
            "torch + Dynamo; a worker pays it too if the parent has not")
        speedup, per_rep = speedups["mlp"]["warm"]
        mlp, deep = speedups["mlp"], speedups["deep"]
        figure("parallel_compile speed-up 1 -> 2 workers", speedup, ">= 1.8", "x",
               note=f"per rep: {per_rep}; one process per graph: {mlp['one-shot'][0]:.2f}x")
        figure("parallel_compile speed-up 1 -> 2 workers, workers already started", mlp["prestarted"][0],
               ">= 1.8", "x", note=f"per rep: {mlp['prestarted'][1]}")
        figure(f"parallel_compile speed-up 1 -> 2 workers, compile-bound graphs ({DEEP_LAYERS}-layer MLP)",
               deep["warm"][0], ">= 1.8", "x",
               note=f"per rep: {deep['warm'][1]}; workers already started: {deep['prestarted'][0]:.2f}x")
        figure(f"parallel_compile of {n} graphs, 1 worker: one process per graph / warm workers",
               _med(workers_runs[1, "one-shot", "mlp"]) / _med(workers_runs[1, "warm", "mlp"]), None, "x")
        print(f"\n3. warmup of {n} compile-bound graphs ({DEEP_LAYERS}-layer MLP), warm workers".ljust(63)
              + "  median      min")
        for mode in DEEP_MODES:
            seq, par = deep_flows["sequential", mode], deep_flows["parallel", mode]
            print(f"  local compiler: {mode}")
            row("A sequential in-process", [r["seconds"] for r in seq], f"complete {seq[-1]['complete']}/{n}")
            row("B parallel_trace + parallel_compile", [r["seconds"] for r in par],
                f"complete {par[-1]['complete']}/{n}")
            row("    of which parallel_trace", [r["trace"] for r in par])
            row("    of which parallel_compile", [r["compile"] for r in par])
            print(f"  ratio B / A: {_med(par) / _med(seq):.2f}; per rep: "
                  + ", ".join(f"{b['seconds'] / a['seconds']:.2f}" for a, b in zip(seq, par)))
        seq, par = deep_flows["sequential", "warm"], deep_flows["parallel", "warm"]
        figure(f"warmup of {n} compile-bound graphs ({DEEP_LAYERS}-layer MLP): deferred flow / in-process",
               _med(par) / _med(seq), "<= 0.35", note=f"{_med(par):.1f} s vs {_med(seq):.1f} s")
    print("\n4. a runner process waits for its first warm compile worker (prestart(1), wall)".ljust(63)
          + "  median      min")
    row("first worker ready", [r["seconds"] for r in starts])
    figure("first warm compile worker ready (T)", _med(starts), None, "s")
    print("\nload during the run:\n  " + "\n  ".join(loads))
    print(f"bench_deferred: {load()} (end)")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="part 1 only (same as --flows-only), one rep")
    parser.add_argument("--graphs", type=int, default=8, help="number of graphs (>= 8 for the reported figure)")
    parser.add_argument("--reps", type=int, default=None, help="repetitions of every phase (default 1)")
    parser.add_argument("--flows-only", action="store_true", help="only part 1 (skip the workers comparison)")
    parser.add_argument("--phase", choices=("sequential", "parallel", "capture", "compile", "start"),
                        help=argparse.SUPPRESS)
    parser.add_argument("--cache", help=argparse.SUPPRESS)
    parser.add_argument("--workers", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--prestart", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--model", choices=("mlp", "deep"), default="mlp", help=argparse.SUPPRESS)
    ns = parser.parse_args()
    if ns.phase:
        return run_phase(ns)
    return orchestrate(ns.graphs, ns.reps or 1, ns.flows_only or ns.quick)


if __name__ == "__main__":
    raise SystemExit(main())
