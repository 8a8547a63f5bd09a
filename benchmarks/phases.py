"""A benchmark's phases, each in a fresh process of its own script: started here, answered by one ``RESULT {json}`` line."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
PREFIX = "RESULT "


def answer(result: dict[str, Any]) -> int:
    """What a phase prints last (its process's exit status 0 follows)."""
    print(PREFIX + json.dumps(result), flush=True)
    return 0


def run_phase(script: str | os.PathLike[str], argv: list[str], env: dict[str, str] | None = None,
              timeout: float = 3600) -> dict[str, Any]:
    """Run ``script argv`` with this interpreter (the repository first on PYTHONPATH, ``env`` over the
    environment) and return the JSON of its last ``RESULT`` line; exit with its output when it failed."""
    merged = {**os.environ, **(env or {})}
    merged["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), merged.get("PYTHONPATH")]))
    proc = subprocess.run([sys.executable, str(script), *argv], capture_output=True, text=True, env=merged,
                          timeout=timeout)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(PREFIX)]
    if proc.returncode != 0 or not lines:
        raise SystemExit(f"{Path(script).name} {' '.join(argv)} failed (exit {proc.returncode}):\n"
                         f"{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    return json.loads(lines[-1][len(PREFIX):])
