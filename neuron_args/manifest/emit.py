"""Emit: after warmup, local rank 0 turns its engine's ledger into ``<engine-id>/manifest.json`` (global ranks,
cache fields), written atomically and its ledger removed under the engine's folder lock, so no emit removes lines
another job still writes. Best-effort: a failure is logged, never raised into warmup or serving.
"""
from __future__ import annotations

import datetime as _dt
import functools
import json
import logging
import os
import shutil
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Callable

from neuron_args.atomic import write_atomic
from neuron_args.cache import CompileCache
from neuron_args.flags import manifest_compiler_flags
from neuron_args.manifest.config import config_block, environment_snapshot
from neuron_args.manifest.engine import get_server_prefix, manifest_root
from neuron_args.manifest.folder_lock import EngineHold, hold_engine
from neuron_args.manifest.ledger import (
    SHAPE_RE,
    Ledger,
    LedgerGraph,
    forget_recorded,
    ledger_dir,
    ledger_engines,
    rank_mapper,
    read_ledger,
)
from neuron_args.manifest.schema import GRAPH_FIELDS, MANIFEST_FILENAME, MANIFEST_VERSION
from neuron_args.remote_cache import is_remote, remote_url

__all__ = ["dumps_manifest", "emit_engines", "emit_manifest"]

logger = logging.getLogger("neuron_args.manifest")


def _enrich(cache: CompileCache | None, key: str) -> dict[str, Any]:
    """The cache-derived fields of one graph; those whose source is missing are left out (null in the manifest)."""
    entry = None if cache is None else cache.lookup(key)
    if entry is None:
        return {}
    found = entry.artifacts()
    shapes = found.output_shapes
    mtime = found.executable_mtime
    created = None if mtime is None else _dt.datetime.fromtimestamp(mtime, tz=_dt.timezone.utc).isoformat()
    return {
        "hlo_path": found.hlo_path,
        "neff_path": found.executable_path,
        "neff_size": found.executable_size,
        "created_timestamp": created,
        "output_shapes": list(shapes) if shapes is not None and all(SHAPE_RE.match(s) for s in shapes) else None,
    }


#: a graph's manifest flag line, cached by its recorded text or tokens (graphs share a few flag sets; shlex is slow)
_flags_line = functools.lru_cache(maxsize=256)(manifest_compiler_flags)


def _graph_entries(
    grouped: Mapping[str, LedgerGraph], cache: CompileCache | None, to_global: Callable[[int], int | None]
) -> tuple[list[dict], list[int]]:
    entries: list[dict] = []
    mapped = {local: to_global(local) for local in set().union(*(g.ranks for g in grouped.values()))}
    mapped_sets: dict[frozenset[int], list[int]] = {}  # most graphs share one rank set
    for key in sorted(grouped):
        record = grouped[key].record
        frozen = frozenset(grouped[key].ranks)
        if frozen not in mapped_sets:  # an unmapped rank is recorded as it is
            mapped_sets[frozen] = sorted({local if mapped[local] is None else mapped[local] for local in frozen})
        flags = record.get("compiler_flags")
        graph = {
            "graph_hash": key,
            **_enrich(cache, key),
            "input_shapes": list(record.get("input_shapes", [])),  # read_ledger checked: a list of shape strings
            "compiler_flags": _flags_line(tuple(flags) if isinstance(flags, list) else flags),
            "ranks": list(mapped_sets[frozen]),
            "input_snapshot_paths": [],
            "output_snapshot_paths": [],
        }
        entries.append({name: graph.get(name) for name in GRAPH_FIELDS})  # the schema's order; missing: null
    return entries, sorted(local for local, rank in mapped.items() if rank is None)


_VALUE = json.JSONEncoder(ensure_ascii=False, allow_nan=False).encode
_INDENTED = json.JSONEncoder(ensure_ascii=False, allow_nan=False, indent=2).encode


def dumps_manifest(doc: Mapping[str, Any]) -> str:
    """Manifest JSON text: indented, one field per line, a graph's lists on one line (line-diffable), and fast for
    thousands of graphs (the stdlib's indenting encoder is pure Python; here each graph field is C-encoded)."""
    parts = []
    for name, value in doc.items():
        if name == "graphs" and isinstance(value, list) and value:
            bodies = (",\n".join(f"      {_VALUE(k)}: {_VALUE(v)}" for k, v in graph.items()) for graph in value)
            parts.append(f"  {_VALUE(name)}: [\n" + ",\n".join(f"    {{\n{body}\n    }}" for body in bodies) + "\n  ]")
        else:
            parts.append(f"  {_VALUE(name)}: " + _INDENTED(value).replace("\n", "\n  "))
    return "{\n" + ",\n".join(parts) + ("\n}\n" if parts else "}\n")


def _with_cache_dir(block: dict, cache_dir: str | os.PathLike[str] | None, cache: CompileCache | None) -> dict:
    """The config block with ``neuron_config.cache_dir`` filled when the caller's has none (``manifest show`` finds
    graph types through it; an ``s3://`` cache: its local copy), and ``remote_cache`` when the cache mirrors one."""
    neuron = block.get("neuron_config")
    if cache is None or not (neuron is None or isinstance(neuron, dict)):
        return block
    block["neuron_config"] = neuron = dict(neuron or {})
    neuron.setdefault("cache_dir", str(cache.root if is_remote(cache_dir) else cache_dir))
    if (remote := remote_url(cache.root)) is not None:
        neuron["remote_cache"] = remote
    return block


def emit_manifest(
    *,
    cache_dir: str | os.PathLike[str] | None,
    config: Mapping[str, Any] | None = None,
    rank_map: Mapping[int, int] | Sequence[int] | None = None,
    local_rank: int = 0,
    failures: list[str] | None = None,
    root: str | os.PathLike[str] | None = None,
    engine_id: str | None = None,
    view: Ledger | None = None,
) -> Path | None:
    """Write ``<root>/<engine-id>/manifest.json`` from this engine's ledger (local rank 0 only); its path, or None.

    ``rank_map``: ledger (TP-local) ranks to global ones (a mapping, or the TP group's global ranks); ``cache_dir``
    None leaves the cache fields null; ``view``: these graphs instead of the ledger folder's, which is left alone.
    Never raises: a failure is logged, and appended to ``failures`` when given."""
    root = manifest_root() if root is None else Path(root)
    if root is None or local_rank != 0:
        return None
    stage = "resolve the engine id"
    hold = EngineHold()  # nothing held yet: released in every case below
    try:
        engine_id = get_server_prefix() if engine_id is None else engine_id
        stage = f"hold the manifest folder {root / engine_id}"
        hold = hold_engine(root, engine_id)  # none when this process holds it (a runner's job, a pytest session)
        source = ledger_dir(root, engine_id)
        stage = f"read the ledger {source}"
        ledger = read_ledger(source) if view is None else view
        if ledger.dropped:
            reasons = ", ".join(f"{n} {why}" for why, n in sorted(ledger.dropped.items()))  # "2 torn or non-JSON, ..."
            logger.warning("manifest: skipped %d ledger line(s) in %s (%s); the graphs they name are not in the "
                           "manifest", sum(ledger.dropped.values()), source, reasons)
        stage = f"map ranks with rank_map={rank_map!r}"
        to_global = rank_mapper(rank_map)
        cache = None if cache_dir is None else CompileCache(cache_dir)
        stage = f"enrich graphs from the compile cache {cache_dir}"
        graphs, unmapped = _graph_entries(ledger.graphs, cache, to_global)
        if unmapped:
            logger.warning("manifest: TP-local rank(s) %s are not in the TP group; recorded unmapped", unmapped)
        stage = "collect the config and environment"
        doc = {
            "manifest_version": MANIFEST_VERSION,
            "config": _with_cache_dir(config_block(config), cache_dir, cache),
            "graphs": graphs,
            "environment": environment_snapshot(),
        }
        target = root / engine_id / MANIFEST_FILENAME
        stage = f"write {target}"
        write_atomic(target, dumps_manifest(doc), durable=True)
    except Exception as exc:  # best-effort: never break warmup or serving
        reason = f"could not {stage} ({type(exc).__name__}: {exc})"
        logger.warning("manifest emit failed: %s; no manifest written this run. "
                       "Compilation and serving are unaffected.", reason)
        if failures is not None:
            failures.append(reason)
        return None
    else:
        if view is None:  # the ledger this manifest consumed
            forget_recorded(source)
            try:
                shutil.rmtree(source)
            except Exception as exc:
                if not isinstance(exc, FileNotFoundError):  # already gone: nothing to say
                    logger.warning("manifest written to %s, but its ledger %s could not be removed (%s: %s)",
                                   target, source, type(exc).__name__, exc)
    finally:
        hold.release()
    return target


def _with_graph_types(config: Mapping[str, Any] | None, graphs: Mapping[str, LedgerGraph]) -> dict[str, Any] | None:
    """A copy of ``config`` with ``neuron_config.graph_types`` set to the graph types of ``graphs``."""
    neuron_config = None if config is None else config.get("neuron_config")
    if not isinstance(neuron_config, Mapping):
        return config
    types = {key: g.graph_type for key, g in sorted(graphs.items()) if g.graph_type}
    return {**config, "neuron_config": {**neuron_config, "graph_types": types}}


def emit_engines(source: Path, target: Path, *, cache_dir: Path, config: Mapping[str, Any] | None,
                 keys: Iterable[str] | None = None, failures: list[str] | None = None) -> list[Path]:
    """Write ``<target>/<engine-id>/manifest.json`` for each engine of ``source``'s ledger (only ``keys``, if given);
    ``source == target`` consumes the ledger (a session's end), else it is read as a view (a test's) and left alone."""
    wanted = None if keys is None else set(keys)
    written = []
    for engine in ledger_engines(source):
        graphs = read_ledger(ledger_dir(source, engine)).graphs
        chosen = {k: g for k, g in graphs.items() if wanted is None or k in wanted}
        if not chosen:
            continue
        path = emit_manifest(cache_dir=cache_dir, config=_with_graph_types(config, chosen), root=target,
                             engine_id=engine, rank_map=list(range(max(max(g.ranks) for g in chosen.values()) + 1)),
                             failures=failures, view=None if source == target else Ledger(chosen))
        if path is not None:
            written.append(path)
    return written
