"""What this process compiled or loaded, graph by graph (read by the runner and the pytest plugin)."""
from __future__ import annotations

import dataclasses

from neuron_args.activity import ACTIVITY, note
from neuron_args.graph_outcome import GraphOutcome
from neuron_args.text import format_shapes, human_size, render_table

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


def table(rows: list[GraphOutcome]) -> str:
    """The per-graph table the main jobs print (type, inputs, -O, key, compile time, size, serve hits/misses)."""
    head = ["graph type", "inputs", "-O", "key", "compile", "size", "serve hits/misses"]
    body = []
    for r in sorted(rows, key=lambda r: (r.graph_type or "", r.input_shapes or [])):
        done = "captured" if r.captures else "cached"
        compile_s = done if r.compile_seconds is None else f"{r.compile_seconds:.1f}s"
        calls = f"{r.serve_hits}/{r.serve_misses}"
        body.append([r.graph_type or "-", format_shapes(list(r.input_shapes or []), empty="", sep=" / "),
                     str(r.optimization_level or "-"), r.key[:12], compile_s, human_size(r.executable_size), calls])
    return render_table(head, body)


def clear() -> None:
    RECORDS.clear()

