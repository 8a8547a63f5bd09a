"""Readable tables for the CLI: a manifest's graphs, and the entries of a compile cache (read through
:class:`neuron_args.cache.CompileCache`, the one owner of the entry layout; nothing here imports torch)."""
from __future__ import annotations

import itertools
import os
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from neuron_args.cache import CacheEntry, CompileCache, EntryStatus
from neuron_args.entry_metadata import EntryMetadata
from neuron_args.errors import CorruptEntryError
from neuron_args.flags import CompilerArgs
from neuron_args.manifest.config import MODEL_SEPARATOR
from neuron_args.text import format_shapes, human_size, render_table

__all__ = [
    "CacheEntryInfo",
    "cache_entries",
    "cache_entry_dict",
    "cache_table",
    "format_ranks",
    "is_baseline",
    "manifest_graph_rows",
    "manifest_graphs",
    "manifest_table",
    "opt_level",
    "status_counts",
    "validate_baseline",
]

SHORT_HASH = 12
_MAX_CELL = 48
#: a manifest graph's fields ``manifest show`` lists as they are (beside its graph type and -O level)
_ROW_FIELDS = ("graph_hash", "input_shapes", "output_shapes", "compiler_flags", "neff_size", "ranks")


def opt_level(flags: str | Sequence[str] | None) -> str:
    """``-O<n>`` from flags in any spelling (``-O3``, ``--optlevel=3``, ``--optlevel 3``), else ``-``."""
    if not flags:
        return "-"
    try:
        value = CompilerArgs(flags if isinstance(flags, str) else list(flags)).value("--optlevel")
    except Exception:  # unsplittable text: nothing to show
        return "-"
    return f"-O{value}" if value else "-"


def format_ranks(ranks: Any) -> str:
    """Sorted ranks with runs of three or more collapsed: ``[0,1,2,3,5]`` -> ``0-3,5``."""
    if not isinstance(ranks, list) or not ranks:
        return "-"
    try:
        values = sorted({int(r) for r in ranks})
    except (TypeError, ValueError):
        return ",".join(str(r) for r in ranks)
    parts: list[str] = []
    for _, run in itertools.groupby(enumerate(values), lambda item: item[1] - item[0]):  # consecutive values
        found = [value for _, value in run]
        parts += [f"{found[0]}-{found[-1]}"] if len(found) >= 3 else [str(value) for value in found]
    return ",".join(parts)


@dataclass(frozen=True)
class CacheEntryInfo:
    """What ``cache ls`` shows of one entry; of an ``s3://`` cache (``remote`` set) also where it is, the fields of
    a remote entry from its marker."""

    key: str
    graph_type: str | None
    opt_level: str
    status: EntryStatus
    lock_pid: int | None  # the builder's pid while ``compiling`` (when it wrote one)
    size: int | None  # None: a remote marker that does not parse
    compiler_args: list[str] | None = None
    created: str | None = None
    remote: bool | None = None  # None: a plain local cache; else whether the remote holds the entry
    local_status: str | None = None  # the local copy's status of the key, None when it has no folder for it

    @property
    def status_text(self) -> str:
        """``compiling (pid N)`` names the lock holder; otherwise the status itself."""
        return f"{self.status.value} (pid {self.lock_pid})" if self.lock_pid else self.status.value

    @property
    def where(self) -> str:
        if not self.remote:
            return "local only"
        return "remote+local" if self.local_status == EntryStatus.COMPLETE.value else "remote"


#: what a row of an ``s3://`` listing adds (in its JSON form only)
_REMOTE_FIELDS = ("compiler_args", "created", "remote", "local_status")


def _entry_row(entry: CacheEntry) -> CacheEntryInfo:
    status = entry.status
    try:
        md = entry.info()
    except CorruptEntryError:  # shown as corrupt, without its fields
        md = EntryMetadata()
    args: Any = md.compiler_args if md.compiler_args is not None else (md.key_components or {}).get("compiler_args")
    level = opt_level(list(args)) if isinstance(args, (tuple, list, str)) else "-"
    return CacheEntryInfo(entry.key, entry.graph_type, level, status,
                          entry.lock_pid() if status is EntryStatus.COMPILING else None, entry.size_bytes(),
                          None if md.compiler_args is None else list(md.compiler_args), md.created)


def cache_entries(cache: CompileCache) -> list[CacheEntryInfo]:
    """Every entry of a compile cache, sorted by graph type then key."""
    return sorted(map(_entry_row, cache.entries()), key=lambda e: (e.graph_type is None, e.graph_type or "", e.key))


def cache_table(entries: Sequence[CacheEntryInfo]) -> str:
    """``cache ls``'s table and summary; of an ``s3://`` cache also CREATED and WHERE, its remote entries counted."""
    s3 = any(e.remote is not None for e in entries)
    table = render_table(["GRAPH TYPE", "KEY", "-O", "STATUS", "SIZE", *(["CREATED", "WHERE"] if s3 else [])], [
        [e.graph_type or "-", e.key[:SHORT_HASH], e.opt_level, e.status_text, human_size(e.size),
         *([e.created or "-", e.where] if s3 else [])] for e in entries])
    counted = [e for e in entries if e.remote] if s3 else entries
    counts = status_counts([e.status for e in counted])
    shown = [f"{counts.pop(s)} {s}" for s in ("complete", "pending") if s in counts] + [
        f"{n} {s}" for s, n in counts.items()]
    copied = sum(e.where == "remote+local" for e in counted)
    where = (f"; {copied} also in the local copy; {len(entries) - len(counted)} only in the local copy" if s3 else "")
    return (f"{table}\n{len(counted)} {'remote ' * s3}entr{'y' if len(counted) == 1 else 'ies'} "
            f"({', '.join(shown) or 'none'}), {human_size(sum(e.size or 0 for e in counted))}{where}")


def _config_summary(doc: Mapping) -> str:
    config = doc.get("config") if isinstance(doc.get("config"), Mapping) else {}
    topology = config.get("topology") if isinstance(config.get("topology"), Mapping) else {}
    parts = [f"manifest v{doc.get('manifest_version', '?')}"]
    for name in ("model", "target", "dtype", "max_num_seqs", "max_model_len"):
        if config.get(name) is not None:
            several = name == "model" and MODEL_SEPARATOR in str(config[name])  # a session over several models
            parts.append(f"{'models' if several else name}={config[name]}")
    short = {"world_size": "world", "tensor_parallel_size": "tp", "pipeline_parallel_size": "pp",
             "data_parallel_size": "dp", "ep_degree": "ep"}
    parts += [f"{label}={topology[name]}" for name, label in short.items() if name in topology]
    return "  ".join(parts)


def numbered_graphs(doc: Mapping) -> list[tuple[int, Mapping]]:
    """``(index in graphs, graph)`` of each graph object a manifest (or baseline) lists; anything else in its
    ``graphs`` is skipped (the file is untrusted)."""
    graphs = doc.get("graphs")
    return [(i, g) for i, g in enumerate(graphs) if isinstance(g, Mapping)] if isinstance(graphs, list) else []


def manifest_graphs(doc: Mapping) -> list[Mapping]:
    """The graph objects of :func:`numbered_graphs`, without their indexes."""
    return [g for _, g in numbered_graphs(doc)]


def neuron_config(doc: Mapping) -> Mapping:
    """A manifest's (or baseline's) ``config.neuron_config``; ``{}`` when it has none (the file is untrusted)."""
    config = doc.get("config")
    neuron = config.get("neuron_config") if isinstance(config, Mapping) else None
    return neuron if isinstance(neuron, Mapping) else {}


def recorded_graph_types(doc: Mapping) -> dict[str, str]:
    """hash -> graph type, from ``config.neuron_config.graph_types`` (a baseline file carries it too)."""
    types = neuron_config(doc).get("graph_types")
    return {str(k): str(v) for k, v in types.items() if v} if isinstance(types, Mapping) else {}


def manifest_table(doc: Mapping, graph_types: Mapping[str, str | None] | None = None) -> str:
    """The config in one line, then one row per graph; ``graph_types``: hash -> type (else the manifest's own)."""
    rows = [[
        g["graph_type"] or "-",
        str(g["graph_hash"] if g["graph_hash"] is not None else "?")[:SHORT_HASH],
        format_shapes(g["input_shapes"], limit=_MAX_CELL),
        format_shapes(g["output_shapes"], limit=_MAX_CELL),
        g["opt_level"] or "-",
        human_size(g["neff_size"]),
        format_ranks(g["ranks"]),
    ] for g in manifest_graph_rows(doc, graph_types)]
    table = render_table(["GRAPH TYPE", "HASH", "INPUTS", "OUTPUTS", "-O", "NEFF", "RANKS"], rows)
    count = f"{len(rows)} graph{'s' if len(rows) != 1 else ''}"
    return f"{_config_summary(doc)}\n{count}\n{table}"


def recorded_cache_dir(doc: Mapping) -> Path | None:
    """``config.neuron_config.cache_dir`` when the manifest recorded one (a baseline's placeholder is none)."""
    value = neuron_config(doc).get("cache_dir")
    if not isinstance(value, str) or not value or value == BASELINE_CACHE_DIR_PLACEHOLDER:
        return None
    return Path(value).expanduser()


#: What the plugin's baseline form (``pytest_neuron_args.baseline.normalize``) leaves out or masks (it imports
#: them from here, so reading a baseline never imports pytest).
BASELINE_VOLATILE_GRAPH_FIELDS = ("created_timestamp", "neff_size", "hlo_path", "neff_path")
BASELINE_CACHE_DIR_PLACEHOLDER = "<cache_dir>"
BASELINE_DIRNAME = ".neuron-baseline"


def is_baseline(doc: Mapping, path: str | os.PathLike[str] | None = None) -> bool:
    """Whether ``doc`` is a manifest baseline (the plugin's ``.neuron-baseline/*.json``): a masked cache dir, else
    no ``environment`` and (in a ``.neuron-baseline`` folder, or) no graph with a volatile field."""
    if neuron_config(doc).get("cache_dir") == BASELINE_CACHE_DIR_PLACEHOLDER:
        return True
    if "environment" in doc:
        return False
    if path is not None and BASELINE_DIRNAME in Path(path).parts:
        return True
    graphs = manifest_graphs(doc)
    return bool(graphs) and not any(f in g for g in graphs for f in BASELINE_VOLATILE_GRAPH_FIELDS)


def validate_baseline(doc: Mapping) -> list[str]:
    """Problems with a baseline: the manifest schema's less the fields the baseline form leaves out, plus what
    that form promises (those fields absent, the cache dir masked, graph types only of its own graphs)."""
    from neuron_args.manifest.schema import validate_manifest

    omitted = {"environment", *BASELINE_VOLATILE_GRAPH_FIELDS}
    problems = [p for p in validate_manifest(doc)
                if not any(p.endswith(f"'{name}' is a required property") for name in omitted)]
    if "environment" in doc:
        problems.append("environment: a baseline leaves out the package snapshot (it changes between runs)")
    for index, graph in numbered_graphs(doc):
        present = [f for f in BASELINE_VOLATILE_GRAPH_FIELDS if f in graph]
        if present:
            problems.append(f"graphs[{index}]: a baseline leaves out {', '.join(present)} "
                            "(they change between runs of the same build)")
    neuron = neuron_config(doc)
    if "cache_dir" in neuron and neuron["cache_dir"] != BASELINE_CACHE_DIR_PLACEHOLDER:
        problems.append(f"config.neuron_config.cache_dir: a baseline masks it as "
                        f"{BASELINE_CACHE_DIR_PLACEHOLDER!r}, got {neuron['cache_dir']!r}")
    types = neuron.get("graph_types")
    if isinstance(types, Mapping):
        hashes = {g.get("graph_hash") for g in manifest_graphs(doc)}
        extra = sorted(k for k in types if k not in hashes)
        if extra:
            problems.append(f"config.neuron_config.graph_types: {len(extra)} key(s) not among the baseline's "
                            f"graphs ({', '.join(k[:SHORT_HASH] for k in extra[:3])})")
    return problems


def manifest_graph_rows(doc: Mapping, graph_types: Mapping[str, str | None] | None = None) -> list[dict]:
    """``manifest show --json``'s graphs (the table's columns, full values); ``graph_types`` as in the table's."""
    types = {**recorded_graph_types(doc), **{k: v for k, v in (graph_types or {}).items() if v}}
    rows = []
    for g in manifest_graphs(doc):
        h = g.get("graph_hash")
        level = opt_level(g.get("compiler_flags"))
        graph_type = types.get(h) if isinstance(h, str) else None
        rows.append({**{name: g.get(name) for name in _ROW_FIELDS}, "graph_type": graph_type,
                     "opt_level": None if level == "-" else level})
    return rows


def status_counts(statuses: Sequence[EntryStatus]) -> dict[str, int]:
    """``{"complete": 2, "compiling": 1, ...}``."""
    return dict(sorted(Counter(status.value for status in statuses).items()))


def cache_entry_dict(entry: CacheEntryInfo) -> dict:
    """One ``cache ls --json`` entry."""
    fields = {k: v for k, v in vars(entry).items() if entry.remote is not None or k not in _REMOTE_FIELDS}
    return {**fields, "opt_level": None if entry.opt_level == "-" else entry.opt_level,
            "status": entry.status.value, "lock_pid": entry.lock_pid or None}
