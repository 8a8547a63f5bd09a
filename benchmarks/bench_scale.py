"""Costs that must not grow with the number of graphs: a warm warmup per graph, manifest emit and ``cache ls`` per entry.

    python benchmarks/bench_scale.py [--part warmup,listing] [--buckets 8,64] [--entries 1000,10000] [--reps 3]

- ``warmup``: a ``NeuronRunner`` over tests/models.py's MLP with B static buckets (batch sizes 1..B) warms up
  on a warm cache (filled by a first warmup in a process of its own) in a fresh process per repetition,
  B = 8 and 64 alternated. Figures: seconds per graph at 64 / at 8 (target <= 1.2; the 8-bucket warmup carries
  the same one-time costs over fewer graphs) and, within one 64-bucket warmup, the time per bucket of its last
  8 / of its buckets 2-8 (a cost per graph that grows with the graphs before it shows there). Each phase also
  prints its cache counts (every graph must be a load: a warm cache compiles nothing).
- ``listing``: a cache of E complete entries written through the cache's own write path
  (``CacheEntry.reset``, ``write_atomic``, ``CacheEntry.write_metadata``, ``mark_complete``) and a ledger of
  E graphs written by ``record_graph``; ``emit_manifest`` and ``neuron-args cache ls`` timed at E = 1,000 and
  10,000, alternated in one process. Figures: per-entry cost at 10,000 / at 1,000 (target <= 1.2 each).

Prints a table; asserts nothing on speed.
"""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
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

BASE = ["--auto-cast=none", "-O1"]
FLAGS = "--auto-cast=none -O1"


# -- warmup: B buckets on a warm cache (each run a fresh process) -----------------------------------------------

def phase_warmup(cache: str, buckets: int) -> dict[str, Any]:
    sys.path.insert(0, str(REPO))
    import torch

    from neuron_args import NeuronRunner
    from neuron_args.graphs import GraphSpec
    from tests.models import make_mlp, mlp_inputs

    model = make_mlp()
    spec = GraphSpec("mlp", model, {f"b{b}": (lambda b=b: {"x": mlp_inputs(batch=b)[0]}) for b in range(1, buckets + 1)})
    runner = NeuronRunner(model, graphs=[spec], compiler_args=BASE, compiler="local", cache_dir=cache)
    stamps: list[float] = []
    with torch.inference_mode():
        t0 = time.perf_counter()
        report = runner.warmup(emit=False, progress=lambda step: stamps.append(time.perf_counter()))
        seconds = time.perf_counter() - t0
    return {"seconds": seconds, "graphs": len(report.graphs), "counts": report.counts.snapshot(),
            "per_bucket": [b - a for a, b in zip([t0, *stamps], stamps)]}


def spawn(argv: list[str]) -> dict[str, Any]:
    return run_phase(__file__, argv)


def part_warmup(tmp: Path, sizes: list[int], reps: int) -> None:
    caches = {}
    for b in sizes:  # one cache per size, warmed by a first (cold) warmup
        caches[b] = tmp / f"warm-{b}"
        cold = spawn(["--phase", "warmup", "--cache", str(caches[b]), "--buckets", str(b)])
        print(f"  cold warmup of {b} buckets: {cold['seconds']:.2f} s, counts {cold['counts']}", flush=True)
    per_graph: dict[int, list[float]] = {b: [] for b in sizes}
    late_early: list[float] = []  # the largest warmup's last 8 buckets / its buckets 2-8, per graph
    counts: dict[int, Any] = {}
    for rep in range(reps):
        for b in (sizes if rep % 2 == 0 else sizes[::-1]):
            result = spawn(["--phase", "warmup", "--cache", str(caches[b]), "--buckets", str(b)])
            if result["graphs"] != b:
                raise SystemExit(f"warm warmup of {b} buckets reported {result['graphs']} graphs")
            per_graph[b].append(result["seconds"] / b)
            counts[b] = result["counts"]
            steps = result["per_bucket"]
            if b == max(sizes) and len(steps) == b >= 16:
                late_early.append(statistics.median(steps[-8:]) / statistics.median(steps[1:8]))
    print(f"  {'buckets':>8} {'median ms/graph':>16} {'min ms/graph':>13}  cache counts (last run)")
    for b in sizes:
        print(f"  {b:>8} {statistics.median(per_graph[b]) * 1e3:16.1f} {min(per_graph[b]) * 1e3:13.1f}  {counts[b]}")
    small, large = sizes[0], sizes[-1]
    ratio = statistics.median(per_graph[large]) / statistics.median(per_graph[small])
    print(f"  per graph, {large} / {small} buckets: {ratio:.2f} (target <= 1.2)")
    figure(f"warm warmup per graph, {large} / {small} buckets", ratio, "<= 1.2")
    if late_early:  # the first graph carries the process's one-time costs (the runtime's start): growth shows here
        growth = statistics.median(late_early)
        print(f"  one {large}-bucket warmup, its last 8 buckets / its buckets 2-8, per graph: {growth:.2f} "
              f"(runs {', '.join(f'{r:.2f}' for r in late_early)})")
        figure(f"warm warmup, last 8 / buckets 2-8 of {large}, per graph", growth, "<= 1.2")


# -- listing: manifest emit and cache ls at E entries (one process) -------------------------------------------

def _key(i: int) -> str:
    return hashlib.sha256(f"graph {i}".encode()).hexdigest()[:32]


def make_cache(root: Path, n: int) -> None:
    """E complete entries through the cache's write path: reset, graph and executable atomically, metadata, marker."""
    from neuron_args.atomic import write_atomic
    from neuron_args.cache import CompileCache, now_iso
    from tests.security.security_helpers import executable_fields

    cache = CompileCache(root)
    for i in range(n):
        key = _key(i)
        entry = cache.entry(key)
        with cache.lock(key):
            entry.reset()
            write_atomic(entry.hlo_path, b"HloModule g%d\n" % i + b"h" * 200)
            write_atomic(entry.executable_path, b"x" * (512 + i % 7))
            entry.write_metadata({
                "metadata_version": 1, "key": key, "seam": "neuron_libtorch", "graph_type": f"decode_{i % 6}",
                "compiler_args": FLAGS.split(), "target": "trn2", "status": "compiled",
                "input_shapes": [f"{1 + i % 64}, 32"], "output_shapes": [f"{1 + i % 64}, 16"],
                "compiler": {"name": "local", "version": "x", "format": "xla-cpu-executable"},
                "created": now_iso(), **executable_fields(entry.executable_path)})
            entry.mark_complete()


def make_ledger(n: int) -> None:
    from neuron_args.manifest.ledger import record_graph

    for i in range(n):
        record_graph(key=_key(i), input_shapes=[f"{1 + i % 64}, 32"], compiler_flags=FLAGS, graph_type=f"decode_{i % 6}")


def part_listing(tmp: Path, sizes: list[int], reps: int) -> None:
    from neuron_args.activity import ACTIVITY
    from neuron_args.cli import main as cli_main
    from neuron_args.manifest.emit import emit_manifest
    from neuron_args.manifest.engine import get_server_prefix
    from neuron_args.manifest.ledger import ledger_dir

    os.environ.pop("NEURON_VISIBLE_DEVICES", None)
    sources = {}
    for n in sizes:
        make_cache(tmp / f"cache-{n}", n)
        os.environ["VLLM_NEURON_MANIFEST_DIR"] = str(tmp / f"ledger-{n}")
        ACTIVITY.reset()
        make_ledger(n)
        sources[n] = ledger_dir(tmp / f"ledger-{n}", get_server_prefix())
    times: dict[str, dict[int, list[float]]] = {"emit": {n: [] for n in sizes}, "ls": {n: [] for n in sizes}}
    for rep in range(reps):
        for n in (sizes if rep % 2 == 0 else sizes[::-1]):
            root = tmp / f"manifests-{n}"
            os.environ["VLLM_NEURON_MANIFEST_DIR"] = str(root)
            target = ledger_dir(root, get_server_prefix())
            shutil.rmtree(target, ignore_errors=True)
            shutil.copytree(sources[n], target)
            t0 = time.perf_counter()
            path = emit_manifest(cache_dir=tmp / f"cache-{n}")
            times["emit"][n].append(time.perf_counter() - t0)
            if path is None or len(json.loads(path.read_text())["graphs"]) != n:
                raise SystemExit(f"emit of {n} graphs failed")
            out = io.StringIO()
            t0 = time.perf_counter()
            with contextlib.redirect_stdout(out):
                code = cli_main(["cache", "ls", str(tmp / f"cache-{n}")])
            times["ls"][n].append(time.perf_counter() - t0)
            if code != 0 or f"{n} entries ({n} complete" not in out.getvalue():
                raise SystemExit(f"cache ls of {n} entries: exit {code}, {out.getvalue()[-300:]}")
    small, large = sizes[0], sizes[-1]
    print(f"  {'what':<14} " + " ".join(f"{f'{n} entries, us/entry':>24}" for n in sizes) + "  ratio")
    for what, label in (("emit", "manifest emit"), ("ls", "cache ls")):
        per = {n: statistics.median(times[what][n]) / n * 1e6 for n in sizes}
        ratio = per[large] / per[small]
        print(f"  {label:<14} " + " ".join(f"{per[n]:24.1f}" for n in sizes) + f"  {ratio:.2f}")
        figure(f"{label} per entry, {large} / {small} entries", ratio, "<= 1.2")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--part", default="warmup,listing")
    parser.add_argument("--buckets", default="8,64")
    parser.add_argument("--entries", default="1000,10000")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--phase", choices=("warmup",))
    parser.add_argument("--cache")
    ns = parser.parse_args()
    if ns.phase == "warmup":
        return answer(phase_warmup(ns.cache, int(ns.buckets)))
    parts = ns.part.split(",")
    print(f"bench_scale: {', '.join(parts)}; {load()}", flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-scale-") as folder:
        tmp = Path(folder)
        if "warmup" in parts:
            print(f"warm warmup, buckets {ns.buckets}, {ns.reps} reps", flush=True)
            part_warmup(tmp, [int(b) for b in ns.buckets.split(",")], ns.reps)
        if "listing" in parts:
            print(f"manifest emit and cache ls, entries {ns.entries}, {ns.reps} reps", flush=True)
            part_listing(tmp, [int(n) for n in ns.entries.split(",")], ns.reps)
    print(f"  ({load()})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
