"""What this process compiled or loaded, graph by graph (read by the runner and the pytest plugin)."""
from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator

from neuron_args.activity import ACTIVITY
from neuron_args.graph_outcome import GraphOutcome

#: this process's outcomes, by key (``ACTIVITY.records``: ``ACTIVITY.reset()`` clears them)
RECORDS: dict[str, GraphOutcome] = ACTIVITY.records


_watchers: list[list[GraphOutcome]] = []  # what each open watching() block was given


@contextlib.contextmanager
def watching() -> Iterator[list[GraphOutcome]]:
    """The outcomes recorded during the block, as given: what one warmup bucket built, captured or loaded,
    found without scanning every record of the process before and after (a warmup of N buckets would
    scan N records per bucket)."""
    events: list[GraphOutcome] = []
    _watchers.append(events)
    try:
        yield events
    finally:
        _watchers.remove(events)


def record(rec: GraphOutcome) -> GraphOutcome:
    """Merge ``rec`` into the process's records (one per key; the latest compile time and error win)."""
    for events in _watchers:
        events.append(rec)
    old = RECORDS.get(rec.key)
    if old is not None:
        rec = dataclasses.replace(old.merged(rec), compile_seconds=(
            old.compile_seconds if rec.compile_seconds is None else rec.compile_seconds),
            executable_size=rec.executable_size or old.executable_size, error=rec.error or old.error)
    RECORDS[rec.key] = rec
    return rec


def records() -> list[GraphOutcome]:
    return list(RECORDS.values())


def clear() -> None:
    RECORDS.clear()

