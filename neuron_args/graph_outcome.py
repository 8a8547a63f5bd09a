"""One compiled graph (one cache key) and what happened to it: the one record every layer passes on.

Seams record one per key, a warmup one per bucket and key; the pytest plugin takes differences and merges them.
Across a process boundary (xdist, ``--neuron-tp`` ranks) it travels as JSON, checked once by
:meth:`GraphOutcome.from_json` (untrusted).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

#: counts summed when two outcomes of one key merge
COUNTERS = ("compiles", "captures", "loads", "serve_hits", "serve_misses", "failures")
_TEXT = ("graph_type", "seam", "target", "error", "bucket", "how", "origin")
#: the fields a merge takes from the other outcome when this one lacks them
_FACTS = ("graph_type", "input_shapes", "optimization_level", "compiler_args", "compile_seconds", "executable_size",
          "error")


@dataclass(frozen=True)
class GraphOutcome:
    """One graph (cache key): what it is (type, inputs, arguments) and what this process or session did with it.

    Serve counts, ``input_shapes`` and ``compiler_args`` are None where unknown (another process's graph). ``bucket``,
    ``how`` (compiled | loaded | captured), ``counts`` (its first warmup's cache counts) and ``origin`` (the test that
    warmed it first) are a warmup's; a parallel compile's ``how``: compiled | failed | already-complete | cancelled."""

    key: str
    graph_type: str | None = None
    input_shapes: list[str] | None = None
    compiler_args: list[str] | None = None
    optimization_level: int | None = None
    seam: str | None = None
    target: str | None = None
    compile_seconds: float | None = None
    executable_size: int | None = None
    compiles: int = 0  # executables built here (cache misses)
    captures: int = 0  # pending entries written by the capture seam
    loads: int = 0  # resolved from an existing cache entry
    serve_hits: int | None = 0  # calls while a runner serves
    serve_misses: int | None = 0  # misses while a runner served
    failures: int = 0  # builds of this key that raised (a CompileError: the compiler failed, a full disk...)
    error: str | None = None  # the last failure's first line
    bucket: str | None = None
    how: str | None = None
    counts: dict[str, int] = field(default_factory=dict)
    origin: str | None = None
    used_base_args: bool = False  # a parallel compile's: the entry recorded no arguments (an older cache)

    @property
    def status(self) -> str:
        """``how`` when a step set it, else how the graph got into the session: compiled, loaded, failed, missed,
        captured, else ``-``."""
        if self.how is not None:
            return self.how
        for status, count in (("compiled", self.compiles), ("loaded", self.loads), ("failed", self.failures),
                              ("missed", self.serve_misses), ("captured", self.captures)):
            if count:
                return status
        return "-"

    @property
    def sort_key(self) -> tuple[Any, ...]:
        """Graph type, then input shapes compared as numbers (``(2, 8)`` before ``(16, 8)``), then key."""
        numbers = [tuple(int(d) for d in s.replace(",", " ").split() if d.isdigit()) for s in self.input_shapes or []]
        return self.graph_type is None, str(self.graph_type or ""), numbers, self.key

    def merged(self, other: GraphOutcome) -> GraphOutcome:
        """``other`` (the same key, later or from another process) merged in: counts summed, facts kept once
        known (``other``'s where this one has none); an unknown serve count stays unknown only if both are."""
        change: dict[str, Any] = {}
        for name in COUNTERS:
            mine, theirs = getattr(self, name), getattr(other, name)
            if theirs is not None:
                change[name] = (mine or 0) + theirs
        for name in _FACTS:
            if getattr(self, name) in (None, []) and getattr(other, name) not in (None, []):
                change[name] = getattr(other, name)
        return dataclasses.replace(self, **change)

    def since(self, before: GraphOutcome | None) -> GraphOutcome:
        """What happened to the graph after ``before``: counts subtracted; compile time only when it compiled since."""
        before = before or GraphOutcome(self.key)
        change: dict[str, Any] = {name: getattr(self, name) - (getattr(before, name) or 0)
                                  for name in COUNTERS if getattr(self, name) is not None}
        return dataclasses.replace(self, **change, compile_seconds=self.compile_seconds if change["compiles"] > 0 else None,
                                   error=self.error if change["failures"] > 0 else None)

    def served_once(self) -> GraphOutcome:
        """This outcome with one more serve hit: the serving hot path, so a field copy, not ``dataclasses.replace``
        (which runs ``__init__``: measured under load, ~22 µs a call against ~4 µs)."""
        new = object.__new__(GraphOutcome)
        new.__dict__.update(self.__dict__, serve_hits=(self.serve_hits or 0) + 1)
        return new

    def to_json(self) -> dict[str, Any]:
        """Plain builtins (with the ``compiled``/``captured`` flags older readers use): a text field holding a str
        subclass (a :class:`~neuron_args.target.Target`) leaves as a plain str, which xdist's execnet can send."""
        data = dataclasses.asdict(self)
        data.update({name: str(data[name]) for name in _TEXT if data[name] is not None})
        return {**data, "compiled": self.compiles > 0, "captured": self.captures > 0}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> GraphOutcome:
        """An outcome from another process or an older plugin, every field checked (a ValueError names the graph
        and the field); a missing count is 0 (a ``compiled``/``captured`` flag counts one)."""
        if not isinstance(data, Mapping) or not isinstance(data.get("key"), str):
            raise ValueError(f"not a graph outcome (no key): {str(data)[:200]}")
        given = {name: data[name] for name in _FIELDS if data.get(name) is not None}
        given.setdefault("compiles", int(bool(data.get("compiled"))))
        given.setdefault("captures", int(bool(data.get("captured"))))
        for name, value in given.items():
            kind, item, kind_name = _FIELDS[name]
            items = list(value.values() if isinstance(value, dict) else value) if item is not None else []
            if not _is(value, kind) or not all(_is(v, item) for v in items):
                raise ValueError(f"graph {data['key']}: {name} must be {kind_name}, got {value!r}")
        return cls(**{**given, "serve_hits": data.get("serve_hits"), "serve_misses": data.get("serve_misses")})

    @classmethod
    def of(cls, value: GraphOutcome | Mapping[str, Any]) -> GraphOutcome:
        """``value`` itself, or parsed from its JSON form (the public functions that take either)."""
        return value if isinstance(value, GraphOutcome) else cls.from_json(value)


def _is(value: Any, kind: Any) -> bool:
    return isinstance(value, kind) and (kind is bool or not isinstance(value, bool))


#: how :meth:`GraphOutcome.from_json` checks a field, by its annotation less ``| None``: (kind, kind of its items, the
#: kind's name in an error)
_CHECKS: dict[str, tuple[type | tuple[type, ...], type | None, str]] = {
    "str": (str, None, "str"), "int": (int, None, "int"), "float": ((int, float), None, "a number"),
    "bool": (bool, None, "bool"), "list[str]": (list, str, "a list of strings"),
    "dict[str, int]": (dict, int, "a map of names to integers")}
_FIELDS = {f.name: _CHECKS[str(f.type).removesuffix(" | None")] for f in dataclasses.fields(GraphOutcome)}


__all__ = ["COUNTERS", "GraphOutcome"]
