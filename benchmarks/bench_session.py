"""A pytest session on a warm persistent cache: what it costs beyond collecting, in each flow.

    python benchmarks/bench_session.py [--reps 1] [--cold]

``pytest examples`` (the tiny VLM's plugin tests) with ``--neuron-cache-dir`` pointing at one
persistent cache:

1. once to warm the cache (cold, untimed in the figures);
2. then, per repetition and in rotating order: ``--collect-only`` (interpreter, imports, plugin,
   collection), the warm session in-process, the warm session with ``--neuron-flow parallel``.

Figures: warm in-process / collect-only (target <= 3.0), warm parallel / warm in-process (target
<= 1.0). ``--cold`` adds, per repetition, a cold session in each flow, each on a cache of its own:
cold parallel / cold in-process (target <= 1.0). Each run is a fresh process; wall time by
``time.perf_counter`` around it; exit statuses are printed (a failing test does not stop the
timing). Asserts nothing on speed.

``--baseline DIR`` (a checkout of an earlier commit, e.g. ``git archive BASE | tar -x -C DIR``)
runs every timed session there too, interleaved with this tree's, each tree on its own caches,
and prints the earlier tree's figures beside this tree's (same venv: ``python -m pytest`` run
in DIR imports DIR's packages first; ``--baseline-env PYTHONPATH=D`` puts an earlier dependency,
installed with ``pip install --target D``, first in the baseline's sessions only).
"""
from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

from figures import figure, load  # noqa: E402



CPU: dict[str, list[float]] = {}  # user + system CPU seconds of each run, by name (load inflates wall time)


def session(cache: Path, *extra: str, repo: Path = REPO, name: str | None = None,
            env_extra: dict[str, str] | None = None) -> tuple[float, int]:
    argv = [sys.executable, "-m", "pytest", "examples", "-q", "-p", "no:randomly", "-p", "no:cacheprovider",
            f"--neuron-cache-dir={cache}", *extra]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NEURON_", "VLLM_NEURON"))} | (env_extra or {})
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(argv, cwd=repo, env=env, capture_output=True, text=True, timeout=1800)
    seconds = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if name is not None:
        CPU.setdefault(name, []).append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
    return seconds, proc.returncode


def cpu_ratio(a: str, b: str, tree: str = "") -> float:
    """Median CPU seconds of run ``a`` over run ``b`` (of ``tree``: "" or "baseline "): on a loaded machine it
    moves much less than the wall-time ratio."""
    return statistics.median(CPU[tree + a]) / statistics.median(CPU[tree + b])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=1)
    parser.add_argument("--cold", action="store_true", help="also time a cold session in each flow")
    parser.add_argument("--baseline", type=Path, help="an earlier tree to time beside this one (interleaved)")
    parser.add_argument("--baseline-env", action="append", default=[], metavar="NAME=VALUE",
                        help="set in the baseline tree's sessions only (e.g. PYTHONPATH=DIR of its earlier dependencies)")
    ns = parser.parse_args()
    base_env = dict(item.split("=", 1) for item in ns.baseline_env)
    print(f"bench_session: {load()} (start)")
    trees = {"": REPO} if ns.baseline is None else {"": REPO, "baseline ": ns.baseline.resolve()}
    names = ["collect", "in-process", "parallel"] + (["cold in-process", "cold parallel"] if ns.cold else [])
    args = {"collect": ("--collect-only",), "in-process": (), "parallel": ("--neuron-flow", "parallel"),
            "cold in-process": (), "cold parallel": ("--neuron-flow", "parallel")}
    runs: dict[str, list[float]] = {t + n: [] for t in trees for n in names}
    codes: dict[str, list[int]] = {k: [] for k in runs}
    with tempfile.TemporaryDirectory(prefix="bench-session-") as tmp:
        caches = {t: Path(tmp) / f"{t.strip() or 'this'}-cache" for t in trees}
        envs = {"": None, "baseline ": base_env}
        for t, repo in trees.items():
            cold, code = session(caches[t], repo=repo, env_extra=envs[t])
            print(f"  {t}cold session (warms the cache): {cold:.1f} s (exit {code})")
        order = [t + n for n in names for t in trees]
        for rep in range(ns.reps):
            for key in order[rep % len(order):] + order[:rep % len(order)]:
                t = "baseline " if key.startswith("baseline ") else ""
                name = key.removeprefix(t)
                where = Path(tmp) / f"{key.replace(' ', '-')}-{rep}" if name.startswith("cold") else caches[t]
                seconds, code = session(where, *args[name], repo=trees[t], name=key, env_extra=envs[t])
                runs[key].append(seconds)
                codes[key].append(code)
                print(f"  rep {rep}: {key:<20} {seconds:6.1f} s (exit {code}); {load()}", flush=True)
    if ns.baseline is not None:
        b = {k.removeprefix("baseline "): statistics.median(v) for k, v in runs.items() if k.startswith("baseline ")}
        print(f"\n  baseline {ns.baseline}: warm / collect-only {b['in-process'] / b['collect']:.2f} "
              f"({b['in-process']:.1f} s vs {b['collect']:.1f} s; CPU {statistics.median(CPU['baseline in-process']):.1f}"
              f" vs {statistics.median(CPU['baseline collect']):.1f} s); warm parallel / in-process "
              f"{b['parallel'] / b['in-process']:.2f} (of CPU seconds {cpu_ratio('parallel', 'in-process', 'baseline '):.2f})"
              + (
                  f"; cold parallel / in-process {b['cold parallel'] / b['cold in-process']:.2f} "
                  f"({b['cold parallel']:.1f} s vs {b['cold in-process']:.1f} s; CPU "
                  f"{statistics.median(CPU['baseline cold parallel']):.1f} vs "
                  f"{statistics.median(CPU['baseline cold in-process']):.1f} s)" if ns.cold else ""))
        runs = {k: v for k, v in runs.items() if not k.startswith("baseline ")}
    m = {k: statistics.median(v) for k, v in runs.items()}
    print(f"\n  {'pytest examples, warm persistent cache':<50} {'median':>8} {'min':>8}")
    for name, label in (("collect", "--collect-only"), ("in-process", "warm, in-process flow"),
                        ("parallel", "warm, --neuron-flow parallel")):
        print(f"  {label:<50} {m[name]:>8.1f} {min(runs[name]):>8.1f} s  exit {codes[name]}; "
              f"CPU {statistics.median(CPU[name]):.1f} s (user + system, children included)")
    if ns.cold:
        for name in ("cold in-process", "cold parallel"):
            print(f"  {name + ' (an empty cache)':<50} {m[name]:>8.1f} {min(runs[name]):>8.1f} s  exit {codes[name]}; "
                  f"CPU {statistics.median(CPU[name]):.1f} s")
        cold_ratio = m["cold parallel"] / m["cold in-process"]
        print(f"  ratio cold parallel / cold in-process: {cold_ratio:.2f} (target <= 1.0)")
        figure("pytest examples --neuron-flow parallel / in-process, cold cache", cold_ratio, "<= 1.0",
               note=f"{m['cold parallel']:.1f} s vs {m['cold in-process']:.1f} s")
    warm = m["in-process"] / m["collect"]
    par = m["parallel"] / m["in-process"]
    print(f"  ratio warm in-process / collect-only: {warm:.2f} (target <= 3.0); of CPU seconds "
          f"{statistics.median(CPU['in-process']) / statistics.median(CPU['collect']):.2f}")
    print(f"  ratio warm parallel / warm in-process: {par:.2f} (target <= 1.0); of CPU seconds "
          f"{cpu_ratio('parallel', 'in-process'):.2f}")
    figure("pytest examples on a warm cache / --collect-only", warm, "<= 3.0",
           note=f"{m['in-process']:.1f} s vs {m['collect']:.1f} s")
    figure("pytest examples --neuron-flow parallel / in-process, warm cache", par, "<= 1.0",
           note=f"{m['parallel']:.1f} s vs {m['in-process']:.1f} s")
    print(f"bench_session: {load()} (end)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
