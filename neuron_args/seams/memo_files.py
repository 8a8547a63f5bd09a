"""The trace memo's files (``<cache>/.trace-memo/<fingerprint>.json``) without torch: ``cache prune-memo``'s needs."""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from neuron_args.atomic import STALE_AFTER
from neuron_args.cache import CompileCache
from neuron_args.errors import CorruptEntryError
from neuron_args.untrusted import RECORD_LIMIT, is_sha256, read_json

FORMAT = 3  # 2: output specs (a key component); 3: the TraceMemo fields as dataclasses.asdict gives them


def memo_path(cache: CompileCache, fp: str) -> Path:
    return cache.trace_memo_dir / f"{fp}.json"


def predicted_digest(d: Any, fp: str) -> str | None:
    """The graph digest a memo file's JSON predicts for ``fp``; None: not a memo of ``fp`` (signature unchecked)."""
    if not isinstance(d, dict) or d.get("format") != FORMAT or d.get("fingerprint") != fp \
            or not is_sha256(d.get("graph_sha256")):
        return None
    return d["graph_sha256"]


@dataclass(frozen=True)
class Pruned:
    """One memo file :func:`prune` removed (or would remove), and why."""

    path: Path
    reason: str  # "unreadable" | "no entry" | "unused"


def prune(cache: CompileCache, older_than_days: float | None = None, dry_run: bool = False) -> list[Pruned]:
    """Remove the memo files no warm trace can use, and those unread ``older_than_days`` (a read touches a file)."""
    folder = cache.trace_memo_dir
    try:
        files = sorted(p for p in folder.iterdir() if p.is_file())
    except (FileNotFoundError, NotADirectoryError):
        return []
    digests = set()
    for entry in cache.entries():
        try:
            comps = entry.info().key_components
        except CorruptEntryError:  # never loaded: moved aside when used
            continue
        if comps is not None and is_sha256(comps.get("graph")):
            digests.add(comps["graph"])
    now = time.time()
    out = []
    for path in files:
        try:
            mtime = path.stat().st_mtime
        except FileNotFoundError:  # removed meanwhile
            continue
        if path.name.startswith(".") and mtime > now - STALE_AFTER:
            continue  # a temporary of write_atomic perhaps still being written
        try:  # the graph digest the file predicts (None: not a memo this version reads)
            digest = predicted_digest(read_json(path, RECORD_LIMIT), path.stem) if path.suffix == ".json" else None
        except (OSError, ValueError):
            digest = None
        if digest is None:
            reason = "unreadable"
        elif digest not in digests:
            reason = "no entry"
        elif older_than_days is not None and mtime < now - older_than_days * 86400:
            reason = "unused"
        else:
            continue
        if not dry_run:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        out.append(Pruned(path, reason))
    return out
