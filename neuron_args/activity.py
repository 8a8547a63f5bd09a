"""What this process did so far, in one object: :data:`ACTIVITY`.

Cache counters, graph records, executables loaded, entries verified, warnings said once, the
manifest ledger's per-process files, the serve block that is open: everything a test or the pytest
plugin reads as "this process" lives here, so it is read with :meth:`Activity.snapshot` and started
over with :meth:`Activity.reset`, never through module globals. Lazy per-process singletons (jax's
clients, torchax, compiler versions) are ``functools.cache`` functions in their own modules; those
a test must be able to start over register with :func:`cleared_on_reset`.

A fresh process starts empty. A forked child inherits the parent's activity as it is, except what
the code that forks clears (``parallel_trace`` children clear their records) and the ledger's
files, which are keyed by pid (:class:`LedgerActivity`). This module imports nothing of the
package, so every module can import it.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

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

    @classmethod
    def since(cls, before: Mapping[str, int]) -> CacheStats:
        """This process's activity since ``before`` (an earlier ``ACTIVITY.stats.snapshot()``)."""
        now = ACTIVITY.stats.snapshot()
        return cls(**{k: now[k] - before[k] for k in now})


@dataclass
class LedgerActivity:
    """The manifest ledger's per-process state (``neuron_args.manifest.ledger``).

    The file sets belong to ``pid``: the first write of another pid (a forked child) starts them
    over, so a child truncates and writes its own ``<pid>.jsonl``.
    """

    pid: int | None = None  # the process the file sets below belong to
    started_paths: set[str] = field(default_factory=set)  # ledger files this pid has already truncated
    torn_paths: set[str] = field(default_factory=set)  # files whose last write stopped half-way
    failure_logged_pid: int | None = None  # the pid that already warned about a failed write
    tp_group: tuple[tuple[int, ...], int] | None = None  # (group_ranks, rank_in_group); forked children keep it
    recorded: set[tuple[str, str, int]] = field(default_factory=set)  # (ledger dir, key, rank) written

    def reset(self) -> None:
        self.pid = self.failure_logged_pid = self.tp_group = None
        self.started_paths.clear()
        self.torn_paths.clear()
        self.recorded.clear()


@dataclass
class Activity:
    """Everything this process compiled, loaded, served and said; reset in place (aliases stay valid)."""

    stats: CacheStats = field(default_factory=CacheStats)
    #: key -> ``seams.records.GraphRecord``: one row per (graph, argument set) a seam resolved
    records: dict[str, Any] = field(default_factory=dict)
    #: ``runner.WarmedGraph`` a warmup found already warmed by its runner, in order
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
    native_args: dict[str, list[str]] = field(default_factory=dict)
    #: warnings already given (see :meth:`say_once`)
    said: set[str] = field(default_factory=set)
    ledger: LedgerActivity = field(default_factory=LedgerActivity)
    #: the ``NeuronRunner`` whose ``serve()`` is open (its compiled graphs count their calls), else None
    serving: Any = None
    #: ``serve(assert_cache_hit=True)`` sets True for its block: a miss raises whatever the environment
    #: says; None: ``$NEURON_LIBTORCH_ASSERT_CACHE_HIT`` decides (``cache.assert_cache_hit_enabled``)
    assert_hit: bool | None = None

    def say_once(self, what: str) -> bool:
        """True the first time ``what`` is asked in this process (then give the warning)."""
        if what in self.said:
            return False
        self.said.add(what)
        return True

    def snapshot(self) -> dict[str, Any]:
        """A copy in plain builtins: ``stats``, ``records`` (key -> dict), ``reused``, ``loaded`` keys,
        ``eager_outputs``, ``serving`` (a bool)."""
        return {
            "stats": self.stats.snapshot(),
            "records": {key: rec.as_dict() for key, rec in self.records.items()},
            "reused": list(self.reused),
            "loaded": sorted(self.loaded),
            "eager_outputs": dict(self.eager_outputs),
            "eager_fallbacks": dict(self.eager_fallbacks),
            "serving": self.serving is not None,
        }

    def reset(self) -> None:
        """Start over as a fresh process would (tests); caches registered with :func:`cleared_on_reset` too."""
        self.stats.reset()
        for held in (self.records, self.reused, self.loaded, self.eager_outputs, self.eager_fallbacks, self.verified,
                     self.corrupt, self.native_args, self.said):
            held.clear()
        self.ledger.reset()
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

__all__ = ["ACTIVITY", "Activity", "CacheStats", "LedgerActivity", "cleared_on_reset"]
