"""The figures a benchmark script reports, in one machine-readable form (``benchmarks/run.py --json``).

A script calls :func:`figure` for each number it prints that the performance table tracks; when
``NEURON_ARGS_BENCH_JSON`` names a file (``run.py`` sets it per script) the figures are written
there as a JSON list when the script exits: ``{"name", "value", "target", "met", "unit", "note"}``.
``target`` is ``"<= 0.75"``-style text (or null for a figure reported without one).
"""
from __future__ import annotations

import atexit
import json
import operator
import os
from pathlib import Path
from typing import Any

ENV = "NEURON_ARGS_BENCH_JSON"
FIGURES: list[dict[str, Any]] = []
_OPS = {"<=": operator.le, ">=": operator.ge, "<": operator.lt, ">": operator.gt}


def met(value: float, target: str | None) -> bool | None:
    """Whether ``value`` meets ``target`` (``"<= 1.10"``); None without a target."""
    if not target:
        return None
    op, bound = target.split()
    return bool(_OPS[op](value, float(bound)))


def figure(name: str, value: float, target: str | None = None, unit: str = "ratio", note: str = "") -> None:
    FIGURES.append({"name": name, "value": round(float(value), 4), "target": target, "met": met(value, target),
                    "unit": unit, "note": note})


def _write() -> None:
    path = os.environ.get(ENV)
    if path:
        Path(path).write_text(json.dumps(FIGURES, indent=1) + "\n")


atexit.register(_write)
