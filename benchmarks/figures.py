"""The figures a benchmark script reports, in one machine-readable form (``benchmarks/run.py --json``).

A script calls :func:`figure` for each number it prints that the performance table tracks; when
``NEURON_ARGS_BENCH_JSON`` names a file (``run.py`` sets it per script) the figures are written
there as a JSON list when the script exits: ``{"name", "value", "target", "met", "unit", "note"}``.
``target`` is ``"<= 0.75"``-style text (or null for a figure reported without one).
"""
from __future__ import annotations

import atexit
import contextlib
import json
import operator
import os
import time
from collections.abc import Callable
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


def load() -> str:
    """The machine's load, printed beside every table (a figure means little without it)."""
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f} {five:.2f} {fifteen:.2f} on {os.cpu_count()} cores"


def per_call_us(fns: dict[str, Callable[[], Any]], calls: int, reps: int,
                around: dict[str, Callable[[], Any]] | None = None) -> dict[str, list[float]]:
    """µs per call of each function, interleaved repetition by repetition (so a load spike hits all alike).

    ``around[name]()`` is a context manager held while ``name``'s batch runs (and is not timed).
    """
    out: dict[str, list[float]] = {name: [] for name in fns}
    around = around or {}
    for _ in range(reps):
        for name, fn in fns.items():
            with around.get(name, contextlib.nullcontext)():
                t0 = time.perf_counter()
                for _ in range(calls):
                    fn()
                out[name].append((time.perf_counter() - t0) / calls * 1e6)
    return out
