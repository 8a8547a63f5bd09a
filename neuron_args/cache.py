"""The compile cache: one folder per key, a completion marker written last, a per-key lock.

An entry is loaded only when complete, so a crash mid-compile leaves nothing that is used later.
Two processes building the same key serialize on ``<root>/<key>.lock``; the second finds the
entry complete and counts a hit. ``NEURON_LIBTORCH_ASSERT_CACHE_HIT`` turns a miss into a
:class:`CacheMissError` that names the closest entry and the components that differ.
"""
from __future__ import annotations

import contextlib
import datetime as _dt
import fcntl
import json
import os
import shutil
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from neuron_args.atomic import write_atomic
from neuron_args.cache_key import CacheKey, explain_components
from neuron_args.errors import CacheKeyArgsConflict, CacheMissError
from neuron_args.flags import canonical_compiler_args

CACHE_DIR_ENV = "NEURON_LIBTORCH_CACHE_DIR"
ASSERT_CACHE_HIT_ENV = "NEURON_LIBTORCH_ASSERT_CACHE_HIT"
METADATA_VERSION = 1
MARKER = "COMPLETE"
_TRUE = {"1", "true", "yes", "on"}


def assert_cache_hit_enabled() -> bool:
    """True when ``NEURON_LIBTORCH_ASSERT_CACHE_HIT`` holds a true value (1/true/yes/on)."""
    return os.environ.get(ASSERT_CACHE_HIT_ENV, "").strip().lower() in _TRUE


def default_cache_dir() -> Path:
    return Path(os.path.expanduser("~")) / ".cache" / "neuron-args" / "compile-cache"


def cache_root(options: Mapping[str, Any] | None = None) -> Path:
    """``options["cache_dir"]``, else ``$NEURON_LIBTORCH_CACHE_DIR``, else the per-user default."""
    given = (options or {}).get("cache_dir") or os.environ.get(CACHE_DIR_ENV)
    return Path(given).expanduser() if given else default_cache_dir()


def now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat()


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
        """This process's activity since ``before`` (an earlier ``STATS.snapshot()``)."""
        now = STATS.snapshot()
        return cls(**{k: now[k] - before[k] for k in now})


STATS = CacheStats()


class CacheEntry:
    """The files of one key."""

    def __init__(self, root: Path, key: str) -> None:
        self.root = root
        self.key = key
        self.path = root / key

    hlo_path = property(lambda self: self.path / "graph.hlo")
    executable_path = property(lambda self: self.path / f"graph_{self.key}.neff")
    metadata_path = property(lambda self: self.path / "metadata.json")
    marker_path = property(lambda self: self.path / MARKER)
    command_path = property(lambda self: self.path / "command.txt")
    log_path = property(lambda self: self.path / "log-neuron-cc.txt")

    @property
    def is_complete(self) -> bool:
        return self.marker_path.exists()

    @property
    def status(self) -> str:
        """``complete``, ``pending`` (captured, not compiled), ``incomplete`` or ``missing``."""
        if self.is_complete:
            return "complete"
        if not self.path.is_dir():
            return "missing"
        return "pending" if self.metadata().get("status") == "pending" else "incomplete"

    def metadata(self) -> dict[str, Any]:
        """The entry's metadata, ``{}`` when absent or unreadable."""
        try:
            return json.loads(self.metadata_path.read_text())
        except (OSError, ValueError):
            return {}

    def write_metadata(self, metadata: Mapping[str, Any]) -> None:
        write_atomic(self.metadata_path, json.dumps(dict(metadata), indent=2, sort_keys=True))

    def update_metadata(self, **fields: Any) -> dict[str, Any]:
        md = {**self.metadata(), **fields}
        self.write_metadata(md)
        return md

    def mark_complete(self) -> None:
        write_atomic(self.marker_path, now_iso())

    def reset(self) -> None:
        """Drop whatever an earlier, unfinished build left; the caller holds the key's lock."""
        if self.path.exists():
            shutil.rmtree(self.path)
        self.path.mkdir(parents=True)

    def size_bytes(self) -> int:
        return sum(p.stat().st_size for p in self.path.iterdir() if p.is_file()) if self.path.is_dir() else 0

    def __repr__(self) -> str:
        return f"CacheEntry({str(self.path)!r}, status={self.status!r})"


def new_metadata(
    key: CacheKey, *, seam: str, graph_type: str | None, compiler_args: Sequence[str] | None, target: str, **extra: Any
) -> dict[str, Any]:
    """The versioned metadata.json of a fresh entry (see docs/ARCHITECTURE.md)."""
    return {
        "metadata_version": METADATA_VERSION,
        "key": key.key,
        "seam": seam,
        "graph_type": graph_type,
        "compiler_args": None if compiler_args is None else list(compiler_args),
        "target": target,
        "key_components": key.components.as_dict(),
        "created": now_iso(),
        **extra,
    }


class CompileCache:
    """A compile-cache directory."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root).expanduser().resolve()

    @classmethod
    def from_options(cls, options: Mapping[str, Any] | None = None) -> CompileCache:
        return cls(cache_root(options))

    def entry(self, key: CacheKey | str) -> CacheEntry:
        return CacheEntry(self.root, str(key))

    def entries(self) -> list[CacheEntry]:
        if not self.root.is_dir():
            return []
        return [CacheEntry(self.root, p.name) for p in sorted(self.root.iterdir()) if p.is_dir() and not p.name.startswith(".")]

    def find(self, prefix: str) -> CacheEntry:
        """The entry whose key starts with ``prefix`` (unique), for the CLI."""
        matches = [e for e in self.entries() if e.key.startswith(prefix)]
        if len(matches) != 1:
            raise KeyError(f"{len(matches)} entries in {self.root} match key prefix {prefix!r}")
        return matches[0]

    @contextlib.contextmanager
    def lock(self, key: CacheKey | str) -> Iterator[None]:
        """Exclusive per-key lock across processes (released when the holder dies, too)."""
        self.root.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.root / f".{key}.lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def get_or_build(
        self,
        key: CacheKey,
        build: Callable[[CacheEntry], None],
        *,
        graph_type: str | None = None,
        assert_hit: bool | None = None,
    ) -> tuple[CacheEntry, bool]:
        """Return ``(entry, hit)``; on a miss run ``build`` under the key's lock, then mark complete.

        ``build`` fills a fresh entry folder (graph, executable, metadata). A miss under
        ``NEURON_LIBTORCH_ASSERT_CACHE_HIT`` raises :class:`CacheMissError` instead.
        """
        entry = self.entry(key)
        if entry.is_complete:
            STATS.hits += 1
            return entry, True
        if assert_cache_hit_enabled() if assert_hit is None else assert_hit:
            STATS.misses += 1
            raise self.miss_error(key, graph_type)
        with self.lock(key):
            if entry.is_complete:  # another process built it while we waited
                STATS.hits += 1
                return entry, True
            STATS.misses += 1
            entry.reset()
            build(entry)
            entry.mark_complete()
            STATS.compiles += 1
        return entry, False

    def closest(self, key: CacheKey, graph_type: str | None = None) -> tuple[CacheEntry, list[str]] | None:
        """The complete entry most like ``key``: same graph first, then same graph type, fewest differences."""
        target = key.components.as_dict()
        best: tuple[tuple[int, int, int], CacheEntry, list[str]] | None = None
        for entry in self.entries():
            if entry.key == key.key or not entry.is_complete:
                continue
            md = entry.metadata()
            comps = md.get("key_components")
            if not isinstance(comps, dict):
                continue
            diff = explain_components(comps, target)
            score = (
                0 if comps.get("graph") == target["graph"] else 1,
                0 if graph_type is not None and md.get("graph_type") == graph_type else 1,
                len(diff),
            )
            if best is None or score < best[0]:
                best = (score, entry, diff)
        return None if best is None else (best[1], best[2])

    def miss_error(self, key: CacheKey, graph_type: str | None) -> CacheMissError:
        """Explain a miss: the graph, the key, the closest entry and what differs, and the fix."""
        lines = [
            f"cache miss for graph type {graph_type!r} (key {key.key}) in {self.root} "
            f"while {ASSERT_CACHE_HIT_ENV} is set: this graph would compile at serve time."
        ]
        near = self.closest(key, graph_type)
        diff: list[str] = []
        if near is None:
            lines.append("  no warmed-up entry resembles it: the cache holds no complete entry for this graph.")
        else:
            entry, diff = near
            lines.append(
                f"  closest warmed-up entry: {entry.key} (graph type {entry.metadata().get('graph_type')!r}); "
                "it differs in:"
            )
            lines += [f"    {d}" for d in diff] or ["    nothing but the key"]
        label = repr(graph_type) if graph_type is not None else "<graph type>"
        if any(d.startswith("compiler_args") for d in diff):
            lines.append(
                f"  fix: run this call inside scoped_compiler_args(resolve_graph_compiler_args({label})) so it "
                "resolves the same arguments as warmup (or make the policy deterministic).")
        if any(d.startswith("input_specs") for d in diff) or not diff:
            lines.append(f"  fix: warm this graph type and shape up before serving (declare the bucket for {label}).")
        if any(d.startswith(("target", "tool_versions")) for d in diff):
            lines.append("  fix: warm up with the same target, compiler and tool versions as serve.")
        return CacheMissError("\n".join(lines))


def _assert_cache_key_args(
    entry: CacheEntry, compiler_args: Sequence[str] | None, *, graph_type: str | None = None
) -> None:
    """Native seam guard: its key leaves the arguments out, so one key must never get two sets.

    The first set is recorded in the entry's metadata, so the check holds across processes.
    """
    if not entry.is_complete:
        return
    recorded = entry.metadata().get("compiler_args")
    if recorded is None:
        return
    if canonical_compiler_args(list(recorded)) != canonical_compiler_args(list(compiler_args or [])):
        raise CacheKeyArgsConflict(
            f"cache key {entry.key} (graph type {graph_type!r}) was compiled with\n"
            f"    {list(recorded)}\n  and is now requested with\n    {list(compiler_args or [])}\n"
            "  The native cache keys on graph structure and I/O shapes, not on compiler flags, so one NEFF "
            "cannot serve both. Give the graph one argument set (a deterministic policy, the same scope at "
            "warmup and serve), or use the neuron_libtorch backend, whose key includes the arguments."
        )
