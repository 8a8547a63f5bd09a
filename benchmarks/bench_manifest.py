"""Manifest costs: emit time of a large ledger vs only parsing it, and the per-line ledger write.

    python benchmarks/bench_manifest.py [--graphs 2000] [--ranks 64] [--repeat 3]

Emit reads 2,000 graphs x 64 ranks = 128,000 JSONL lines across 64 pid files, enriches every
graph from a fake compile-cache entry (ARCHITECTURE.md layout) and writes the manifest. The
baseline only reads the same files and ``json.loads`` each line: the ratio is what grouping,
rank mapping, enrichment, the environment snapshot and the atomic write add (target <= 2.0).
Prints a table; asserts nothing.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from figures import figure  # noqa: E402
from neuron_args.activity import ACTIVITY
from neuron_args.manifest import ledger
from neuron_args.manifest.emit import emit_manifest, environment_snapshot
from neuron_args.manifest.ledger import record_graph

FLAGS = ("--framework XLA --target trn2 --auto-cast=none --model-type transformer -O1 "
         "--lnc 2 --enable-saturate-infinity --enable-mixed-precision-accumulation "
         "--output /tmp/work/graph.neff")


def _key(i: int) -> str:
    return f"{i:032x}"


def _shapes(i: int) -> list[str]:
    bucket = 16 << (i % 6)
    return ["4,", f"4, {bucket}", f"4, {bucket}, 64", "", f"{bucket},"]


def make_cache(cache: Path, graphs: int) -> None:
    for i in range(graphs):
        key = _key(i)
        entry = cache / key
        entry.mkdir(parents=True)
        (entry / "graph.hlo").write_bytes(b"h" * 256)
        (entry / f"graph_{key}.neff").write_bytes(b"n" * 1024)
        metadata = {
            "metadata_version": 1, "key": key, "status": "compiled", "seam": "neuron_libtorch",
            "graph_type": f"decode_{i % 6}", "compiler_args": FLAGS.split(), "target": "trn2",
            "key_components": {"graph": "f" * 64, "input_specs": [{"shape": [4], "dtype": "int64"}],
                               "compiler_args": sorted(FLAGS.split()), "target": "trn2",
                               "tool_versions": {"neuronx-cc": "2.21", "jax": "0.10.2"}},
            "input_shapes": _shapes(i), "output_shapes": ["4", "4, 49152"],
            "compiler": {"name": "neuronx-cc", "version": "2.21", "format": "neff"},
            "created": "2026-01-01T00:00:00+00:00", "compiled": "2026-01-01T00:00:09+00:00",
            "compile_seconds": 9.1,
        }
        (entry / "metadata.json").write_text(json.dumps(metadata, indent=2))
        (entry / "COMPLETE").write_text("")


def make_ledger(source: Path, graphs: int, ranks: int) -> int:
    source.mkdir(parents=True)
    total = 0
    for rank in range(ranks):
        lines = [ledger._encode(_key(i), rank, _shapes(i), FLAGS, f"decode_{i % 6}") for i in range(graphs)]
        (source / f"{40000 + rank}.jsonl").write_bytes(b"".join(lines))
        total += len(lines)
    return total


def parse_only(folder: Path) -> int:
    """The baseline: read every ledger file and ``json.loads`` each line, nothing else."""
    count = 0
    for name in sorted(os.listdir(folder)):
        with open(folder / name, encoding="utf-8") as handle:
            for line in handle:
                json.loads(line)
                count += 1
    return count


def _best(samples: list[float]) -> tuple[float, float]:
    return min(samples), statistics.median(samples)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--graphs", type=int, default=2000)
    parser.add_argument("--ranks", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--writes", type=int, default=20000)
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="bench-manifest-"))
    try:
        root = work / "manifests"
        cache = work / "cache"
        source = work / "ledger-source"
        os.environ["VLLM_NEURON_MANIFEST_DIR"] = str(root)
        os.environ.pop("NEURON_VISIBLE_DEVICES", None)
        make_cache(cache, args.graphs)
        lines = make_ledger(source, args.graphs, args.ranks)
        ledger_dir = root / "ledger" / "nodev"

        # interleaved pairs, wall and CPU time: robust to a busy machine
        parse_times, emit_times, parse_cpu, emit_cpu = [], [], [], []
        for _ in range(args.repeat):
            shutil.rmtree(ledger_dir, ignore_errors=True)
            shutil.copytree(source, ledger_dir)
            parse_only(ledger_dir)  # warm the page cache for both
            start, cpu = time.perf_counter(), time.process_time()
            assert parse_only(ledger_dir) == lines
            parse_times.append(time.perf_counter() - start)
            parse_cpu.append(time.process_time() - cpu)
            start, cpu = time.perf_counter(), time.process_time()
            path = emit_manifest(cache_dir=cache)
            emit_times.append(time.perf_counter() - start)
            emit_cpu.append(time.process_time() - cpu)
            assert path is not None and not ledger_dir.exists()
        doc = json.loads(path.read_text())
        assert len(doc["graphs"]) == args.graphs and len(doc["graphs"][0]["ranks"]) == args.ranks
        start = time.perf_counter()
        environment_snapshot()
        env_time = time.perf_counter() - start

        # per-line ledger write cost (feature on), and the cost of the gate when off
        write_root = work / "writes"
        os.environ["VLLM_NEURON_MANIFEST_DIR"] = str(write_root)
        shapes = _shapes(3)
        record_graph(key=_key(0), input_shapes=shapes, compiler_flags=FLAGS)  # first write truncates
        start = time.perf_counter()
        for i in range(args.writes):
            record_graph(key=_key(i), input_shapes=shapes, compiler_flags=FLAGS, graph_type="decode")
        write_us = (time.perf_counter() - start) / args.writes * 1e6
        assert ACTIVITY.ledger.failure_logged_pid is None
        del os.environ["VLLM_NEURON_MANIFEST_DIR"]
        start = time.perf_counter()
        for i in range(args.writes):
            record_graph(key=_key(i), input_shapes=shapes, compiler_flags=FLAGS)
        off_us = (time.perf_counter() - start) / args.writes * 1e6

        parse_min, parse_med = _best(parse_times)
        emit_min, emit_med = _best(emit_times)
        wall_ratios = [e / p for e, p in zip(emit_times, parse_times)]
        cpu_ratios = [e / p for e, p in zip(emit_cpu, parse_cpu)]
        size = path.stat().st_size if path.exists() else 0
        print(f"manifest benchmark: {args.graphs} graphs x {args.ranks} ranks = {lines} ledger lines "
              f"in {args.ranks} files; python {sys.version.split()[0]}; {args.repeat} interleaved runs")
        rows = [
            ("parse only (read + json.loads), wall", f"{parse_min * 1e3:9.1f} ms", f"{parse_med * 1e3:9.1f} ms"),
            ("emit_manifest, wall", f"{emit_min * 1e3:9.1f} ms", f"{emit_med * 1e3:9.1f} ms"),
            ("  of which environment_snapshot", f"{env_time * 1e3:9.1f} ms", ""),
            ("emit / parse, wall (target <= 2.0)", f"{min(wall_ratios):9.2f}", f"{statistics.median(wall_ratios):9.2f}"),
            ("emit / parse, CPU time", f"{min(cpu_ratios):9.2f}", f"{statistics.median(cpu_ratios):9.2f}"),
            ("manifest.json size", f"{size / 1024:9.1f} KiB", ""),
            ("record_graph, feature on", f"{write_us:9.2f} us/line", ""),
            ("record_graph, feature off", f"{off_us:9.3f} us/call", ""),
        ]
        figure(f"manifest emit / parse, {args.graphs} graphs x {args.ranks} ranks", statistics.median(wall_ratios),
               "<= 2.0", note=f"best {min(wall_ratios):.2f}")
        width = max(len(r[0]) for r in rows)
        print(f"{'measure'.ljust(width)}  {'best':>15}  {'median':>12}")
        for name, best, median in rows:
            print(f"{name.ljust(width)}  {best:>15}  {median:>12}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
