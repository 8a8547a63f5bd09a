"""What this process compiled or loaded, graph by graph (read by the runner and the pytest plugin)."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


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
    compiled: bool = False  # built here (a miss) rather than loaded from the cache
    captured: bool = False  # written as a pending entry by the capture seam
    compile_seconds: float | None = None
    executable_size: int | None = None
    loads: int = 0  # times a variant was resolved from an existing cache entry
    extra: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


RECORDS: dict[str, GraphRecord] = {}


def record(rec: GraphRecord) -> GraphRecord:
    """Merge ``rec`` into the process's records (one row per key)."""
    old = RECORDS.get(rec.key)
    if old is None:
        RECORDS[rec.key] = rec
        return rec
    old.compiled |= rec.compiled
    old.captured |= rec.captured
    old.loads += rec.loads
    old.compile_seconds = old.compile_seconds if rec.compile_seconds is None else rec.compile_seconds
    old.executable_size = rec.executable_size or old.executable_size
    old.graph_type = old.graph_type or rec.graph_type
    return old


def records() -> list[GraphRecord]:
    return list(RECORDS.values())


def clear() -> None:
    RECORDS.clear()
