"""What this process compiled or loaded, graph by graph (read by the runner and the pytest plugin)."""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

from neuron_args.activity import ACTIVITY
from neuron_args.text import format_shapes, human_size, render_table


@dataclass
class GraphRecord:
    """One (graph, argument set) variant a seam resolved in this process."""

    key: str
    seam: str
    graph_type: str | None
    input_shapes: list[str]
    compiler_args: list[str]
    optimization_level: int | None
    target: str
    compile_seconds: float | None = None
    executable_size: int | None = None
    compiles: int = 0  # executables built here (cache misses)
    captures: int = 0  # pending entries written by the capture seam
    loads: int = 0  # variants resolved from an existing cache entry
    serve_hits: int = 0  # calls while a runner serves
    serve_misses: int = 0  # variants that missed the cache while a runner served
    failures: int = 0  # builds of this key that raised (a CompileError: the compiler failed, a full disk...)
    error: str | None = None  # the last failure's first line
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def compiled(self) -> bool:
        return self.compiles > 0

    @property
    def captured(self) -> bool:
        return self.captures > 0

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "compiled": self.compiled, "captured": self.captured}


#: this process's records, by key (``ACTIVITY.records``: ``ACTIVITY.reset()`` clears them)
RECORDS: dict[str, GraphRecord] = ACTIVITY.records
_COUNTERS = ("compiles", "captures", "loads", "serve_hits", "serve_misses", "failures")


#: (key, compiles, captures, loads) of each :func:`record` while a :func:`watching` block is open
Event = tuple[str, int, int, int]
_watchers: list[list[Event]] = []


@contextlib.contextmanager
def watching() -> Iterator[list[Event]]:
    """The records merged during the block, as events: what one warmup bucket built, captured or loaded,
    found without scanning every record of the process before and after (a warmup of N buckets would
    scan N records per bucket)."""
    events: list[Event] = []
    _watchers.append(events)
    try:
        yield events
    finally:
        _watchers.remove(events)


def record(rec: GraphRecord) -> GraphRecord:
    """Merge ``rec`` into the process's records (one row per key)."""
    for events in _watchers:
        events.append((rec.key, rec.compiles, rec.captures, rec.loads))
    old = RECORDS.get(rec.key)
    if old is None:
        RECORDS[rec.key] = rec
        return rec
    for name in _COUNTERS:
        setattr(old, name, getattr(old, name) + getattr(rec, name))
    old.compile_seconds = old.compile_seconds if rec.compile_seconds is None else rec.compile_seconds
    old.executable_size = rec.executable_size or old.executable_size
    old.graph_type = old.graph_type or rec.graph_type
    old.error = rec.error or old.error
    return old


def records() -> list[GraphRecord]:
    return list(RECORDS.values())


def clear() -> None:
    RECORDS.clear()


def table(rows: list[GraphRecord]) -> str:
    """The per-graph table: graph type, input shapes, -O level, key, compile time, size, serve hits/misses."""
    head = ["graph type", "inputs", "-O", "key", "compile", "size", "serve hits/misses"]
    body = []
    for r in sorted(rows, key=lambda r: (r.graph_type or "", r.input_shapes)):
        compile_s = f"{r.compile_seconds:.1f}s" if r.compile_seconds is not None else ("captured" if r.captured else "cached")
        calls = f"{r.serve_hits}/{r.serve_misses}"
        body.append([r.graph_type or "-", format_shapes(list(r.input_shapes), empty="", sep=" / "),
                     str(r.optimization_level or "-"), r.key[:12], compile_s, human_size(r.executable_size), calls])
    return render_table(head, body)
