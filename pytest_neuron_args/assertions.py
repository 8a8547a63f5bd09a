"""Checks that explain themselves: compile-count expectations and manifest completeness / ranks. Every failure
says what was expected, what was found and which graphs are involved, so a red test reads like a diagnosis.
"""
from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from neuron_args.activity import ACTIVITY
from neuron_args.graph_outcome import GraphOutcome
from neuron_args.manifest.show import manifest_graphs, recorded_cache_dir, recorded_graph_types
from neuron_args.text import format_shapes
from neuron_args.untrusted import MANIFEST_LIMIT, read_json
from pytest_neuron_args.ranks import unsharded_reason

COUNT_NAMES = ("compiles", "misses", "hits", "captures")
#: what a graph did inside an ``expect`` block: its list in ``Expectation.graphs``, the count telling it, its title
_ACTIVITIES = (("compiled", "compiles", "graphs compiled inside the block"),
               ("loaded", "loads", "graphs loaded from the cache inside the block"),
               ("captured", "captures", "graphs captured (pending) inside the block"))
_HEX = re.compile(r"^[0-9a-f]{8,64}$")


def _graph_line(rec: Mapping[str, Any]) -> str:
    shapes = format_shapes(rec.get("input_shapes") or [], empty="-")
    return (f"  {rec.get('graph_type') or '(no graph type)'}  key {rec['key']}  inputs {shapes}  "
            f"args {list(rec.get('compiler_args') or [])}")


def _counts_since(before: Mapping[str, int]) -> dict[str, int]:
    now = ACTIVITY.stats.snapshot()
    return {name: now[name] - before[name] for name in COUNT_NAMES}


def graph_activity(before: Mapping[str, GraphOutcome]) -> dict[str, list[dict[str, Any]]]:
    """Graphs compiled, loaded from the cache or captured since ``before`` (a copy of ``ACTIVITY.records``)."""
    deltas = [(now, now.since(before.get(key))) for key, now in list(ACTIVITY.records.items())]
    return {what: [now.to_json() for now, delta in deltas if getattr(delta, count) > 0]
            for what, count, _ in _ACTIVITIES}


class CompileCounter:
    """This process's compile-cache ``counts`` since set-up and ``expect(...)`` blocks (as vLLM's counter)."""

    def __init__(self) -> None:
        self._start = ACTIVITY.stats.snapshot()

    @property
    def counts(self) -> dict[str, int]:
        return _counts_since(self._start)

    def expect(self, *, compiles: int | None = None, misses: int | None = None, hits: int | None = None,
               captures: int | None = None) -> Expectation:
        """A ``with`` block that fails, naming the graphs involved, when its counts differ from those given (a
        block that raises is not checked: its error wins)."""
        expected = {name: value for name, value in zip(COUNT_NAMES, (compiles, misses, hits, captures))
                    if value is not None}
        if not expected:
            raise TypeError("neuron_compile_counter.expect() needs at least one of compiles=, misses=, hits=, "
                            "captures=")
        return Expectation(expected)


class Expectation:
    """One ``expect`` block; after it, ``counts`` and ``graphs`` hold what happened inside."""

    def __init__(self, expected: Mapping[str, int]) -> None:
        self.expected = dict(expected)
        self.counts: dict[str, int] = {}
        self.graphs: dict[str, list[dict[str, Any]]] = {}
        self.reused: list[GraphOutcome] = []  # graphs a warmup in the block found warmed before
        self._before: tuple[dict[str, int], dict[str, GraphOutcome], int] | None = None

    def __enter__(self) -> Expectation:
        self._before = (ACTIVITY.stats.snapshot(), dict(ACTIVITY.records), len(ACTIVITY.reused))
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        __tracebackhide__ = True
        assert self._before is not None
        before_stats, before_records, before_reused = self._before
        self.counts = _counts_since(before_stats)
        self.graphs = graph_activity(before_records)
        # a warmup of graphs the session warmed before costs nothing now; count what their first warmup
        # did, so the block counts the same whether this test runs alone or after the one that warmed them
        self.reused = ACTIVITY.reused[before_reused:]
        for graph in self.reused:
            for name in COUNT_NAMES:
                self.counts[name] += int(graph.counts.get(name, 0))
        if exc_type is not None:
            return
        wrong = {name: (want, self.counts[name]) for name, want in self.expected.items()
                 if self.counts[name] != want}
        if wrong:
            raise AssertionError(self._message(wrong))

    def _message(self, wrong: Mapping[str, tuple[int, int]]) -> str:
        expected, got, graphs, reused = self.expected, self.counts, self.graphs, self.reused
        call = ", ".join(f"{k}={v}" for k, v in expected.items())
        lines = [f"neuron_compile_counter.expect({call}): the compile-cache counts inside the block differ"]
        lines += [f"  {name}: expected {want}, got {have}" for name, (want, have) in wrong.items()]
        lines.append("  (all counts in the block: " + ", ".join(f"{n} {got[n]}" for n in COUNT_NAMES) + ")")
        for what, _, title in _ACTIVITIES:
            found = graphs.get(what, [])
            if what == "captured" and not found:
                continue
            lines.append(f"{title} ({len(found)}):" if found else f"{title}: none")
            lines += [_graph_line(r) for r in found]
        if reused:
            lines.append(f"graphs warmed earlier in this session, not traced again inside the block ({len(reused)}); "
                         "counted as their first warmup:")
            lines += [f"  {g.graph_type} {g.bucket}  key {g.key}  inputs "
                      f"{format_shapes(g.input_shapes, empty='-')}: {g.how} when first warmed"
                      + (f" (by {g.origin})" if g.origin else "") for g in reused]
        else:
            lines.append("every graph the block warmed up was warmed for the first time in this session")
        unlisted = (got["misses"] - len(graphs.get("compiled", [])) - len(graphs.get("captured", []))
                    - sum(int(g.counts.get("misses", 0)) for g in reused))
        if unlisted > 0:
            lines.append(f"{unlisted} miss(es) compiled nothing: NEURON_LIBTORCH_ASSERT_CACHE_HIT turned them into "
                         "CacheMissError (the error names the graph, its key and the closest entry)")
        return "\n".join(lines)


class ManifestView:
    """An emitted manifest with the checks a test asks of it: ``expected_graphs`` (graph type -> declared buckets)
    for ``assert_complete``; ``rank_weights`` (rank -> weight digests) and ``single_rank_layout`` (the model's
    outside a TP group) let ``assert_ranks`` tell a model that ignores its rank."""

    def __init__(self, doc: Mapping[str, Any], path: str | os.PathLike[str] | None = None, *,
                 cache_dir: str | os.PathLike[str] | None = None,
                 expected_graphs: Mapping[str, int] | None = None,
                 rank_weights: Mapping[int, Mapping[str, str]] | None = None,
                 single_rank_layout: str | None = None) -> None:
        self.doc = dict(doc)
        self.rank_weights = {int(r): dict(w) for r, w in (rank_weights or {}).items()}
        self.single_rank_layout = single_rank_layout
        self.path = Path(path) if path is not None else None
        self.expected_graphs = dict(expected_graphs or {})
        self.cache_dir = Path(cache_dir) if cache_dir is not None else recorded_cache_dir(self.doc)
        known = recorded_graph_types(self.doc)
        self.graph_types = {key: known.get(key) or self._cached_graph_type(key) for key in self.keys}

    @classmethod
    def load(cls, path: str | os.PathLike[str], **kwargs: Any) -> ManifestView:
        return cls(read_json(path, MANIFEST_LIMIT), path, **kwargs)  # a manifest is untrusted input

    @property
    def graphs(self) -> list[Mapping[str, Any]]:
        return manifest_graphs(self.doc)

    @property
    def keys(self) -> list[str]:
        return [str(g.get("graph_hash")) for g in self.graphs]

    def graphs_of(self, graph_type: str) -> list[dict[str, Any]]:
        return [g for g in self.graphs if self.graph_types.get(str(g.get("graph_hash"))) == graph_type]

    def _cached_graph_type(self, key: str) -> str | None:
        from neuron_args.cache import CompileCache

        entry = None if self.cache_dir is None else CompileCache(self.cache_dir).lookup(key)
        return None if entry is None else entry.graph_type

    def where(self) -> str:
        return f"manifest {self.path}" if self.path is not None else "the manifest"

    def _graph_head(self, graph: Mapping[str, Any]) -> str:
        """``  decode  4d0a12345678  inputs (1, 8)``: a graph as the failure messages name it."""
        key = str(graph.get("graph_hash"))
        shapes = format_shapes(graph.get("input_shapes") or [], empty="-")
        return f"  {self.graph_types.get(key) or '?'}  {key[:12]}  inputs {shapes}"

    def holdings(self) -> list[str]:
        """One line per graph: type, short key, shapes, flags, ranks."""
        return [f"{self._graph_head(g)}  flags {g.get('compiler_flags') or '-'}  ranks {g.get('ranks')}"
                for g in self.graphs] or ["  (no graphs)"]

    def validate(self) -> list[str]:
        from neuron_args.manifest.schema import validate_manifest

        return validate_manifest(self.doc)

    def assert_valid(self) -> None:
        __tracebackhide__ = True
        problems = self.validate()
        if problems:
            raise AssertionError(f"{self.where()} is not a valid version-1 manifest:\n"
                                 + "\n".join(f"  {p}" for p in problems))

    def assert_complete(self, expected: str | Iterable[str] | None = None) -> None:
        """Every expected graph type (with all its declared buckets) or key (a prefix of 8+ hex digits) is in the
        manifest; default: the graph types the fixture warmed up."""
        __tracebackhide__ = True
        items = [expected] if isinstance(expected, str) else list(expected if expected is not None
                                                                   else self.expected_graphs)
        if not items:
            raise TypeError("assert_complete() needs the graph types or keys to expect")
        types_known = set(self.expected_graphs) | {t for t in self.graph_types.values() if t}
        missing = []
        for item in items:
            if item not in types_known and _HEX.match(item):
                if not any(k.startswith(item) for k in self.keys):
                    missing.append(f"  key {item}: no graph with this hash")
                continue
            want = max(1, self.expected_graphs.get(item, 1))
            have = len(self.graphs_of(item))
            if have < want:
                what = f"{want} graphs (one per declared bucket)" if want > 1 else "at least 1 graph"
                missing.append(f"  graph type {item!r}: expected {what}, found {have}")
        if missing:
            raise AssertionError("\n".join([
                f"{self.where()} is incomplete:", *missing,
                f"expected: {items}",
                f"the manifest holds {len(self.graphs)} graph(s):", *self.holdings(),
            ]))

    def assert_ranks(self, world_size: int | None = None, *, ranks: Iterable[int] | None = None,
                     replicated: bool = False) -> None:
        """Every graph was traced by every expected rank (``range(world_size)`` or ``ranks``), and no other; where
        the ranks' weights are known, several ranks must hold shards (``replicated=True`` accepts a model replicated
        on purpose)."""
        __tracebackhide__ = True
        if (world_size is None) == (ranks is None):
            raise TypeError("assert_ranks() takes a world size or ranks=[...], exactly one of them")
        expected = set(range(world_size)) if world_size is not None else {int(r) for r in ranks or []}
        if not self.graphs:
            raise AssertionError(f"{self.where()} holds no graphs, so no rank traced any; expected ranks "
                                 f"{sorted(expected)}")
        gaps = []
        for g in self.graphs:
            have = {r for r in g.get("ranks") or [] if isinstance(r, int)}
            off = [f", {what} ranks {sorted(rs)}" for what, rs in (("missing", expected - have),
                                                                  ("unexpected", have - expected)) if rs]
            if off:
                gaps.append(f"{self._graph_head(g)}: ranks {sorted(have)}" + "".join(off))
        if gaps:
            raise AssertionError("\n".join([
                f"{self.where()}: rank gap in {len(gaps)} of {len(self.graphs)} graph(s); expected every graph "
                f"on ranks {sorted(expected)}:", *gaps,
            ]))
        weights = {r: self.rank_weights[r] for r in expected if r in self.rank_weights}
        why = unsharded_reason(weights, self.single_rank_layout) if set(weights) == expected else None
        if len(expected) > 1 and not replicated and why:
            raise AssertionError(
                f"{self.where()}: ranks {sorted(expected)} built their {len(self.graphs)} graph(s) from no shard: "
                f"{why}. The model ignores its rank, so every rank runs the whole model. Build the shard in neuron_model from torch.distributed.get_rank() and "
                "get_world_size() (the rank processes initialize torch.distributed first; see examples/conftest.py), "
                "or pass assert_ranks(..., replicated=True) for a model replicated on purpose")

    def __repr__(self) -> str:
        return f"ManifestView({str(self.path)!r}, {len(self.graphs)} graphs)"


__all__ = ["CompileCounter", "Expectation", "ManifestView", "graph_activity"]
