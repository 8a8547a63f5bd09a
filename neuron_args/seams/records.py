"""What this process compiled or loaded, graph by graph (read by the runner and the pytest plugin)."""
from __future__ import annotations

import dataclasses
import itertools
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from neuron_args.activity import ACTIVITY, note
from neuron_args.graph_outcome import GraphOutcome
from neuron_args.text import human_size, render_table

#: this process's outcomes, by key (``ACTIVITY.records``: ``ACTIVITY.reset()`` clears them)
RECORDS: dict[str, GraphOutcome] = ACTIVITY.records


def record(rec: GraphOutcome) -> GraphOutcome:
    """Merge ``rec`` into the process's records (one per key; the latest compile time, size and error win); the open
    :func:`~neuron_args.activity.tally` blocks list it as given."""
    note("outcomes", rec)
    old = RECORDS.get(rec.key)
    if old is not None:
        latest = {name: getattr(rec, name) for name in ("compile_seconds", "executable_size", "error")}
        rec = dataclasses.replace(old.merged(rec), **{name: v for name, v in latest.items() if v is not None})
    RECORDS[rec.key] = rec
    return rec


def records() -> list[GraphOutcome]:
    return list(RECORDS.values())


def shapes_text(shapes: Sequence[str] | None, limit: int = 4) -> str:
    """``(1, 8) (2, 64, 16)x4``: runs of equal shapes (a model's KV buffers) collapsed, then at most ``limit`` items."""
    if shapes is None:
        return "-"
    if not shapes:
        return "()"
    runs = [(shape, len(list(same))) for shape, same in itertools.groupby(shapes)]
    items = [f"({shape})x{n}" if n > 2 else " ".join([f"({shape})"] * n) for shape, n in runs]
    if len(items) > limit:
        hidden = sum(n for _, n in runs[limit - 1:])
        items = items[:limit - 1] + [f"+{hidden} more"]
    return " ".join(items)


def _serve_cell(row: GraphOutcome, serve_calls: Mapping[str, int], rows_per_type: Mapping[Any, int]) -> str:
    if row.serve_hits is not None or row.serve_misses is not None:
        return f"{row.serve_hits or 0}/{row.serve_misses or 0}"
    calls = serve_calls.get(row.graph_type)  # a graph another process built: serve calls per graph type only
    if calls and rows_per_type.get(row.graph_type) == 1:
        return f"{calls}/-"
    return "-"


def table_rows(rows: Iterable[GraphOutcome], serve_calls: Mapping[str, int] | None = None
               ) -> tuple[tuple[str, ...], list[tuple[str, ...]]]:
    """The per-graph table the main jobs print and the pytest plugin's summaries show: header and cells, in
    ``sort_key`` order; ``serve_calls`` (per graph type) fill the serve cell of a graph with unknown serve counts."""
    rows = sorted(rows, key=lambda row: row.sort_key)
    per_type = Counter(row.graph_type for row in rows)
    header = ("graph type", "inputs", "-O", "key", "how", "compile", "size", "loads", "serve hit/miss")
    body = []
    for row in rows:
        level, seconds = row.optimization_level, row.compile_seconds
        body.append((
            str(row.graph_type or "-"), shapes_text(row.input_shapes),
            "-" if level is None else str(level), row.key[:12], row.status,
            "-" if seconds is None else f"{seconds:.2f}s", human_size(row.executable_size),
            str(row.loads or 0), _serve_cell(row, serve_calls or {}, per_type),
        ))
    return header, body


def table(rows: Iterable[GraphOutcome], serve_calls: Mapping[str, int] | None = None, *, rule: bool = True) -> str:
    return render_table(*table_rows(rows, serve_calls), rule=rule)


def clear() -> None:
    RECORDS.clear()

