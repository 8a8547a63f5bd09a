"""Run every benchmark and write each figure with its target: ``{name, value, target, met}``.

    python benchmarks/run.py --json PATH [--quick] [--only bench_serve,bench_core]

Each script runs in its own process (one after another: they would disturb each other's timings)
with ``NEURON_ARGS_BENCH_JSON`` pointing at a temp file where ``benchmarks/figures.py`` writes its
figures; their console output is passed through. PATH gets one JSON object:
``{"figures": [{"script", "name", "value", "target", "met", "unit", "note"}], "failed": [...],
"load": ...}``. Exit status 0 unless a script failed (a missed target is a figure, not a failure).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))

from figures import ENV  # noqa: E402

#: script -> arguments for a full run and for --quick
SCRIPTS: dict[str, tuple[list[str], list[str]]] = {
    "bench_serve": ([], ["--quick"]),
    "bench_compile": (["--skip-decoder"], ["--quick", "--skip-decoder"]),
    "bench_core": ([], ["--quick"]),
    "bench_manifest": ([], ["--repeat", "3"]),  # the size (2,000 graphs x 64 ranks) in both
    "bench_deferred": ([], ["--graphs", "8"]),
    "bench_session": ([], []),
    "bench_lowering": ([], ["--quick"]),
    "bench_orchestration": ([], ["--reps", "1", "--flows", "pool,cluster"]),  # N=64, W=8, T=2 s in both
    "bench_scale": ([], ["--reps", "1"]),
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", required=True, type=Path, help="where to write the figures")
    parser.add_argument("--quick", action="store_true", help="each script's short form")
    parser.add_argument("--only", default="", help="comma-separated script names (default: all)")
    ns = parser.parse_args()
    chosen = [s for s in SCRIPTS if not ns.only or s in ns.only.split(",")]
    figures, failed = [], []
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])  # pytest of this venv
    start = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="bench-run-") as tmp:
        for script in chosen:
            out = Path(tmp) / f"{script}.json"
            argv = [sys.executable, str(HERE / f"{script}.py"), *SCRIPTS[script][1 if ns.quick else 0]]
            print(f"== {script} {' '.join(argv[2:])}", flush=True)
            t0 = time.perf_counter()
            code = subprocess.run(argv, cwd=REPO, env={**env, ENV: str(out)}).returncode
            print(f"== {script}: exit {code} in {time.perf_counter() - t0:.0f} s\n", flush=True)
            if code != 0:
                failed.append(script)
            for fig in json.loads(out.read_text()) if out.exists() else []:
                figures.append({"script": script, **fig})
    ns.json.parent.mkdir(parents=True, exist_ok=True)
    ns.json.write_text(json.dumps({"figures": figures, "failed": failed,
                                   "load": {"start": start, "end": os.getloadavg(), "cores": os.cpu_count()}},
                                  indent=1) + "\n")
    width = max((len(f["name"]) for f in figures), default=10)
    print(f"{'figure'.ljust(width)}  {'value':>8}  {'target':>8}  met")
    for f in figures:
        met = {True: "yes", False: "NO", None: "-"}[f["met"]]
        print(f"{f['name'].ljust(width)}  {f['value']:>8.2f}  {f['target'] or '':>8}  {met}")
    print(f"figures written to {ns.json}" + (f"; FAILED scripts: {failed}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
