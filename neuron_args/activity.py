"""What this process did so far, in one object (:data:`ACTIVITY`), and the context-local :func:`tally` blocks in
which a warmup, serve or trace counts its own cache events. Imports nothing of the package.
"""
from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


@dataclass
class CacheStats:
    """Per-process counters. ``compiles`` counts executables built, ``captures`` pending entries written."""

    hits: int = 0
    misses: int = 0
    compiles: int = 0
    captures: int = 0

    def snapshot(self) -> dict[str, int]:
        return dict(hits=self.hits, misses=self.misses, compiles=self.compiles, captures=self.captures)

    def reset(self) -> None:
        self.hits = self.misses = self.compiles = self.captures = 0

    def add(self, counts: Mapping[str, int]) -> None:
        for name, n in counts.items():
            setattr(self, name, getattr(self, name) + n)


@dataclass
class Tally:
    """What one :func:`tally` block did (its outcomes as given: what one warmup bucket built, captured or loaded)."""

    counts: CacheStats = field(default_factory=CacheStats)
    assert_hit: bool | None = None  # None: the enclosing block's, else the open serve's, else the environment's
    held: bool = False  # its counts stay in it (see :func:`tally`)
    compile_reports: list[Any] = field(default_factory=list)  # the ``parallel_compile`` runs it started
    outcomes: list[Any] = field(default_factory=list)  # ``graph_outcome.GraphOutcome`` (seams.records.record)


_OPEN: contextvars.ContextVar[tuple[Tally, ...]] = contextvars.ContextVar("neuron_args_tallies", default=())


@contextlib.contextmanager
def tally(*, assert_hit: bool | None = None, held: bool = False) -> Iterator[Tally]:
    """Count this block's cache activity, also into the blocks around it and ``ACTIVITY.stats`` unless ``held``
    (:func:`commit` passes those on); ``assert_hit`` overrides the environment for the block."""
    block = Tally(assert_hit=assert_hit, held=held)
    token = _OPEN.set((*_OPEN.get(), block))
    try:
        yield block
    finally:
        _OPEN.reset(token)


def _add(counts: Mapping[str, int], blocks: tuple[Tally, ...]) -> None:
    for block in reversed(blocks):
        block.counts.add(counts)
        if block.held:
            return
    ACTIVITY.stats.add(counts)


def count(name: str) -> None:
    """One cache event (``hits``, ``misses``, ``compiles`` or ``captures``) of this context."""
    _add({name: 1}, _OPEN.get())


def commit(counts: CacheStats) -> None:
    """A held block's counts, passed on after all: into the blocks open around it and the process's totals."""
    _add(counts.snapshot(), _OPEN.get())


def note(kind: Literal["compile_reports", "outcomes"], item: Any) -> None:
    """Every open block lists ``item`` under ``kind``: ``compile_reports`` (a ``parallel_compile`` run started here,
    filling as graphs finish) or ``outcomes`` (a graph outcome recorded here)."""
    for block in _OPEN.get():
        getattr(block, kind).append(item)


def block_assert_hit() -> bool | None:
    """The hit assertion of the innermost open block that sets one (None: none does)."""
    return next((b.assert_hit for b in reversed(_OPEN.get()) if b.assert_hit is not None), None)


@dataclass
class LedgerActivity:
    """The manifest ledger's per-process state; a forked child's first write starts the file sets over."""

    pid: int | None = None  # the process the file sets below belong to
    started_paths: set[str] = field(default_factory=set)  # ledger files this pid has already truncated
    torn_paths: set[str] = field(default_factory=set)  # files whose last write stopped half-way
    failure_logged_pid: int | None = None  # the pid that already warned about a failed write
    tp_group: tuple[tuple[int, ...], int] | None = None  # (group_ranks, rank_in_group); forked children keep it
    recorded: set[tuple[str, str, int]] = field(default_factory=set)  # (ledger dir, key, rank) written


@dataclass
class Activity:
    """Everything this process compiled, loaded, served and said; reset in place (aliases of its maps stay valid)."""

    stats: CacheStats = field(default_factory=CacheStats)
    #: key -> ``graph_outcome.GraphOutcome``: one per (graph, argument set) a seam resolved
    records: dict[str, Any] = field(default_factory=dict)
    #: ``GraphOutcome`` of graphs a warmup found already warmed by its runner, in order
    reused: list[Any] = field(default_factory=list)
    #: executables loaded, by cache key (one load per process, even when Dynamo recompiles)
    loaded: dict[str, Callable[..., Any]] = field(default_factory=dict)
    #: NEFFs whose outputs come from eager PyTorch (no runtime binding): key -> graph type
    eager_outputs: dict[str, str | None] = field(default_factory=dict)
    #: frames of a neuron backend Dynamo's recompile limit stopped compiling -> "error" or "warn" (eager)
    eager_fallbacks: dict[str, str] = field(default_factory=dict)
    #: (cache root, key) of entries verified; corrupt entries moved aside, with why
    verified: set[tuple[str, str]] = field(default_factory=set)
    corrupt: dict[str, str] = field(default_factory=dict)
    #: native seam: the first argument set seen per key (the entry's metadata covers other processes)
    native_args: dict[str, Any] = field(default_factory=dict)  # key -> flags.CompilerArgs (this module imports none)
    #: warnings already given (see :meth:`say_once`)
    said: set[str] = field(default_factory=set)
    ledger: LedgerActivity = field(default_factory=LedgerActivity)
    #: the ``NeuronRunner`` whose ``serve()`` is open (its compiled graphs count their calls), else None
    serving: Any = None
    #: ``serve(assert_cache_hit=True)`` sets True while it is open, in every thread: a miss raises whatever the
    #: environment says; None: a block's own (:func:`tally`), else ``$NEURON_LIBTORCH_ASSERT_CACHE_HIT``
    assert_hit: bool | None = None

    def say_once(self, what: str) -> bool:
        """True the first time ``what`` is asked in this process (then give the warning)."""
        if what in self.said:
            return False
        self.said.add(what)
        return True

    def reset(self) -> None:
        """Start over as a fresh process would (tests); caches registered with :func:`cleared_on_reset` too."""
        self.stats.reset()
        for held in (self.records, self.reused, self.loaded, self.eager_outputs, self.eager_fallbacks, self.verified,
                     self.corrupt, self.native_args, self.said):
            held.clear()
        self.ledger = LedgerActivity()  # read through ACTIVITY.ledger at each use: nothing holds the old one
        self.serving = self.assert_hit = None
        for clear in _CLEARED_ON_RESET:
            clear()


_CLEARED_ON_RESET: list[Callable[[], None]] = []


def cleared_on_reset(fn: F) -> F:
    """Decorator over a ``functools.cache`` function: :meth:`Activity.reset` clears its cache."""
    _CLEARED_ON_RESET.append(fn.cache_clear)  # type: ignore[attr-defined]
    return fn


#: This process's activity (one per process; reset, never replaced, so aliases such as ``cache.STATS`` stay valid).
ACTIVITY = Activity()

__all__ = ["ACTIVITY", "Activity", "CacheStats", "LedgerActivity", "Tally", "block_assert_hit", "cleared_on_reset",
           "commit", "count", "note", "tally"]
