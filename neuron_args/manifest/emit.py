"""Emit: after warmup, local rank 0 turns its engine's ledger into ``<engine-id>/manifest.json``.

Steps: group ledger lines by key and map each writer's TP-local rank to its global rank; enrich
each graph from its compile-cache entry (:meth:`neuron_args.cache.CacheEntry.artifacts`): paths
relative to the cache root, NEFF size and mtime from one ``os.stat``, output shapes from the
entry's metadata; join the config and a package-version snapshot; write atomically (temp file in
the same folder + ``os.replace``, so relaunching overwrites and nothing accumulates); remove this
engine's ledger folder, and only it.

Best-effort throughout: any failure is logged once with its cause and :func:`emit_manifest`
returns None. Nothing here may break warmup or serving.
"""
from __future__ import annotations

import dataclasses
import datetime as _dt
import enum
import importlib.metadata
import json
import logging
import math
import os
import platform
import re
import shutil
import sys
from collections.abc import Mapping, Sequence, Set
from pathlib import Path, PurePath
from typing import Any, Callable

from neuron_args.atomic import write_atomic
from neuron_args.cache import CompileCache
from neuron_args.flags import manifest_compiler_flags
from neuron_args.text import clip
from neuron_args.manifest.engine import get_server_prefix, manifest_root
from neuron_args.manifest.ledger import (
    describe_dropped,
    forget_recorded,
    ledger_dir,
    read_ledger,
    registered_tp_group,
)
from neuron_args.manifest.schema import (
    CONFIG_FIELDS,
    MANIFEST_FILENAME,
    MANIFEST_VERSION,
    TOPOLOGY_DEFAULTS,
)

__all__ = [
    "build_config",
    "dumps_manifest",
    "emit_manifest",
    "environment_snapshot",
    "to_jsonable",
]

logger = logging.getLogger("neuron_args.manifest")


# ----------------------------------------------------------------------------- JSON coercion

_MAX_DEPTH = 48
_MAX_NODES = 200_000
_MAX_REPR = 2_000


def _safe_repr(obj: Any) -> str:
    try:
        text = repr(obj)
    except Exception as exc:  # a __repr__ that raises
        return f"<unrepresentable {type(obj).__qualname__}: {type(exc).__name__}>"
    return clip(text, _MAX_REPR)


def _qualified_name(obj: Any) -> str:
    module = getattr(obj, "__module__", None)
    name = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None)
    if not isinstance(name, str):
        return _safe_repr(obj)
    return f"{module}.{name}" if isinstance(module, str) and module != "builtins" else name


class _Coercer:
    """One :func:`to_jsonable` pass: tracks the containers on the current path (cycles) and a
    node budget (an accidental reference to something huge becomes reprs, not a hang)."""

    def __init__(self) -> None:
        self.active: set[int] = set()
        self.nodes = 0

    def key(self, key: Any) -> str:
        if isinstance(key, str) and not isinstance(key, enum.Enum):
            return str(key)
        value = self.convert(key, _MAX_DEPTH - 1)
        return value if isinstance(value, str) else json.dumps(value, sort_keys=True)

    def convert(self, obj: Any, depth: int) -> Any:
        self.nodes += 1
        if obj is None or obj is True or obj is False:
            return obj
        if isinstance(obj, enum.Enum):
            return obj.name if obj.name is not None else _safe_repr(obj)
        if isinstance(obj, str):
            return str(obj)
        if isinstance(obj, int):
            return int(obj)
        if isinstance(obj, float):
            return float(obj) if math.isfinite(obj) else repr(float(obj))
        special = self._special(obj)
        if special is not _NOTHING:
            return special
        if depth >= _MAX_DEPTH or self.nodes > _MAX_NODES:
            return _safe_repr(obj)
        if isinstance(obj, type) or callable(obj) and not dataclasses.is_dataclass(obj):
            return _qualified_name(obj)
        if id(obj) in self.active:
            return f"<cycle: {type(obj).__name__}>"
        self.active.add(id(obj))
        try:
            return self._container(obj, depth + 1)
        finally:
            self.active.discard(id(obj))

    def _special(self, obj: Any) -> Any:
        """Leaf types with a natural JSON form; ``_NOTHING`` when ``obj`` is not one."""
        cls = type(obj)
        module = cls.__module__ or ""
        if isinstance(obj, PurePath):
            return os.fspath(obj)
        if isinstance(obj, (_dt.datetime, _dt.date, _dt.time)):
            return obj.isoformat()
        if isinstance(obj, _dt.timedelta):
            return obj.total_seconds()
        if isinstance(obj, (bytes, bytearray, memoryview, complex)):
            return _safe_repr(obj if not isinstance(obj, memoryview) else bytes(obj))
        if module.startswith("torch"):
            torch = sys.modules.get("torch")
            if torch is not None:
                if isinstance(obj, (torch.dtype, torch.device)) or cls.__name__ in ("dtype", "device"):
                    return str(obj)  # "torch.bfloat16", "cpu"
                if isinstance(obj, torch.Tensor):
                    return f"tensor(shape={list(obj.shape)}, dtype={obj.dtype})"
        if module == "numpy" or module.startswith("numpy."):
            if hasattr(obj, "item") and getattr(obj, "shape", None) == ():
                return self.convert(obj.item(), _MAX_DEPTH - 1)
            if cls.__name__ == "ndarray":
                return f"ndarray(shape={list(obj.shape)}, dtype={obj.dtype})"
            if "dtype" in cls.__name__.lower():
                return str(obj)
        if isinstance(obj, logging.Logger):
            return f"<logger {obj.name}>"
        if type(obj).__name__ in ("Decimal", "Fraction"):
            return str(obj)
        return _NOTHING

    def _container(self, obj: Any, depth: int) -> Any:
        if isinstance(obj, Mapping):
            return {self.key(k): self.convert(v, depth) for k, v in list(obj.items())}
        if dataclasses.is_dataclass(obj):
            out: dict[str, Any] = {}
            for field in dataclasses.fields(obj):
                try:
                    value = getattr(obj, field.name)
                except AttributeError:  # an init=False field never set
                    continue
                out[field.name] = self.convert(value, depth)
            return out
        if isinstance(obj, (list, tuple)) or (
            isinstance(obj, Sequence) and not isinstance(obj, (str, bytes, bytearray))
        ):
            return [self.convert(v, depth) for v in list(obj)]
        if isinstance(obj, (Set, frozenset, set)):
            items = [self.convert(v, depth) for v in list(obj)]
            return sorted(items, key=lambda v: json.dumps(v, sort_keys=True, default=str))
        dump = getattr(obj, "model_dump", None)  # pydantic models
        if callable(dump) and hasattr(type(obj), "model_fields"):
            try:
                return self.convert(dump(), depth)
            except Exception:
                pass
        attrs = _public_attributes(obj)
        if attrs:  # no public state: its repr says more than {}
            return {name: self.convert(value, depth) for name, value in attrs.items()}
        return _safe_repr(obj)


_NOTHING = object()


def _public_attributes(obj: Any) -> dict[str, Any] | None:
    """``vars(obj)`` and ``__slots__`` values without private names; None when neither exists."""
    found: dict[str, Any] | None = None
    try:
        found = {k: v for k, v in vars(obj).items() if isinstance(k, str) and not k.startswith("_")}
    except TypeError:
        pass
    for cls in type(obj).__mro__:
        slots = cls.__dict__.get("__slots__", ())
        for name in (slots,) if isinstance(slots, str) else slots:
            if name.startswith("_") or name in ("__dict__", "__weakref__"):
                continue
            try:
                value = getattr(obj, name)
            except AttributeError:
                continue
            found = {} if found is None else found
            found.setdefault(name, value)
    return found


def to_jsonable(obj: Any) -> Any:
    """``obj`` as plain JSON data (dict / list / str / int / float / bool / None); never raises.

    Dataclasses and objects with attributes become dicts of their public fields, enums their
    name, ``torch.dtype`` its string (``"torch.bfloat16"``), paths strings, sets sorted lists,
    non-finite floats strings; a reference cycle becomes ``"<cycle: Type>"``; anything else its
    ``repr``. Used for ``config.neuron_config`` / ``config.vllm_config``, which hold whatever a
    runner's config objects hold.
    """
    try:
        return _Coercer().convert(obj, 0)
    except Exception:  # belt and braces: coercion must never break an emit
        return _safe_repr(obj)


# ----------------------------------------------------------------------------- config / env


def _positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"topology[{name!r}] must be a positive int, got {value!r}")
    return int(value)


def _optional_count(name: str, value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int or None, got {value!r}")
    return int(value)


def _dtype_string(dtype: Any) -> str | None:
    if dtype is None:
        return None
    value = to_jsonable(dtype)
    return value if isinstance(value, str) else str(dtype)


def build_config(
    *,
    model: str | None = None,
    target: str | None = None,
    dtype: Any = None,
    max_num_seqs: int | None = None,
    max_model_len: int | None = None,
    topology: Mapping[str, Any] | None = None,
    neuron_config: Any = None,
    vllm_config: Any = None,
) -> dict:
    """The manifest's ``config`` block: topology filled with the seed's keys (defaults 1 /
    False) and ``neuron_config`` / ``vllm_config`` JSON-coerced by :func:`to_jsonable`.

    Raises ValueError naming the field for an unknown topology key or a non-positive count.
    """
    given = dict(topology or {})
    unknown = sorted(set(given) - set(TOPOLOGY_DEFAULTS))
    if unknown:
        raise ValueError(
            f"build_config: unknown topology key(s) {unknown}; the manifest schema v1 records "
            f"{', '.join(TOPOLOGY_DEFAULTS)}"
        )
    topo: dict[str, Any] = {}
    for name, default in TOPOLOGY_DEFAULTS.items():
        value = given.get(name, default)
        if name == "has_collectives":
            if not isinstance(value, bool):
                raise ValueError(f"topology['has_collectives'] must be a bool, got {value!r}")
            topo[name] = value
        else:
            topo[name] = _positive_int(name, value)
    return {
        "model": None if model is None else os.fspath(model) if isinstance(model, PurePath) else str(model),
        "target": None if target is None else str(target),
        "dtype": _dtype_string(dtype),
        "max_num_seqs": _optional_count("max_num_seqs", max_num_seqs),
        "max_model_len": _optional_count("max_model_len", max_model_len),
        "topology": topo,
        "neuron_config": to_jsonable(neuron_config),
        "vllm_config": to_jsonable(vllm_config),
    }


def _config_block(config: Mapping[str, Any] | None) -> dict:
    if config is None:
        return build_config()
    unknown = sorted(str(k) for k in config if k not in CONFIG_FIELDS)
    if unknown:
        logger.warning(
            "manifest config: dropping unknown field(s) %s (schema v1 has %s); build the config "
            "with neuron_args.manifest.build_config()", unknown, ", ".join(CONFIG_FIELDS),
        )
    try:
        return build_config(**{k: config[k] for k in CONFIG_FIELDS if k in config})
    except Exception as exc:
        logger.warning(
            "manifest config could not be recorded (%s: %s); writing an empty config block",
            type(exc).__name__, exc,
        )
        return build_config()


def environment_snapshot() -> dict:
    """``{"python": "3.11.7", "<distribution>": "<version>", ...}`` of the running interpreter.

    A pip-freeze equivalent from ``importlib.metadata``; the first distribution of a name on
    ``sys.path`` wins, as it does for imports.
    """
    found: dict[str, str] = {}
    for dist in importlib.metadata.distributions():
        try:
            name = dist.metadata["Name"]
            version = dist.version
        except Exception:  # a broken dist-info folder
            continue
        if name and version and name not in found:
            found[name] = str(version)
    return {"python": platform.python_version(), **dict(sorted(found.items(), key=lambda kv: kv[0].lower()))}


# ----------------------------------------------------------------------------- ledger


def _rank_mapper(rank_map: Mapping[int, int] | Sequence[int] | None) -> Callable[[int], int | None]:
    """TP-local rank -> global rank, from (in order) ``rank_map``, the registered TP group,
    torch.distributed's default group, or identity. None for a rank the map does not cover."""
    if rank_map is not None:
        if isinstance(rank_map, Mapping):
            table = {int(k): int(v) for k, v in rank_map.items()}
            return table.get
        ranks = [int(r) for r in rank_map]
        return lambda local: ranks[local] if 0 <= local < len(ranks) else None
    registered = registered_tp_group()
    if registered is not None:
        group = registered[0]
        return lambda local: group[local] if 0 <= local < len(group) else None
    if "torch" in sys.modules:
        try:
            import torch.distributed as dist

            if dist.is_available() and dist.is_initialized():
                group = list(dist.get_process_group_ranks(dist.group.WORLD))
                return lambda local: group[local] if 0 <= local < len(group) else None
        except Exception as exc:
            logger.debug("manifest: torch.distributed group ranks unavailable: %s", exc)
    return lambda local: local


# ----------------------------------------------------------------------------- enrichment

SHAPE_RE = re.compile(r"([0-9]+(, [0-9]+)*,?)?\Z")  # the schema's shape string


def _shape_list(value: Any) -> list[str] | None:
    if isinstance(value, list) and all(isinstance(s, str) and SHAPE_RE.match(s) for s in value):
        return list(value)
    return None


def _enrich(cache: CompileCache | None, key: str) -> dict[str, Any]:
    """The cache-derived fields of one graph; each null when its source is missing."""
    entry = None if cache is None else cache.lookup(key)
    if entry is None:
        return {"hlo_path": None, "neff_path": None, "neff_size": None,
                "created_timestamp": None, "output_shapes": None}
    found = entry.artifacts()
    mtime = found.executable_mtime
    return {
        "hlo_path": found.hlo_path,
        "neff_path": found.executable_path,
        "neff_size": found.executable_size,
        "created_timestamp": None if mtime is None else _dt.datetime.fromtimestamp(mtime, tz=_dt.timezone.utc).isoformat(),
        "output_shapes": _shape_list(found.metadata.get("output_shapes")),
    }


def _flags_line(flags: Any) -> str:
    if flags is None:
        return ""
    return manifest_compiler_flags(flags if isinstance(flags, (str, list)) else str(flags))


def _memo_flags(memo: dict[str, str], flags: Any) -> str:
    if not isinstance(flags, str):
        return _flags_line(flags)
    line = memo.get(flags)
    if line is None:
        line = memo[flags] = _flags_line(flags)
    return line


def _graph_entries(
    grouped: Mapping[str, list], cache: CompileCache | None, to_global: Callable[[int], int | None]
) -> tuple[list[dict], list[int]]:
    entries: list[dict] = []
    unmapped: set[int] = set()
    flag_lines: dict[str, str] = {}  # graphs share a few flag sets; shlex is slow
    mapped_sets: dict[frozenset[int], list[int]] = {}  # most graphs share one rank set

    def global_ranks(local_ranks: set[int]) -> list[int]:
        ranks: set[int] = set()
        for local in local_ranks:
            mapped = to_global(local)
            if mapped is None:
                unmapped.add(local)
                mapped = local
            ranks.add(mapped)
        return sorted(ranks)

    for key in sorted(grouped):
        local_ranks, record, _ = grouped[key]
        frozen = frozenset(local_ranks)
        ranks = mapped_sets.get(frozen)
        if ranks is None:
            ranks = mapped_sets[frozen] = global_ranks(local_ranks)
        shapes = record.get("input_shapes")
        enriched = _enrich(cache, key)
        entries.append({
            "graph_hash": key,
            "hlo_path": enriched["hlo_path"],
            "neff_path": enriched["neff_path"],
            "neff_size": enriched["neff_size"],
            "created_timestamp": enriched["created_timestamp"],
            "input_shapes": [str(s) for s in shapes] if isinstance(shapes, list) else [],
            "output_shapes": enriched["output_shapes"],
            "compiler_flags": _memo_flags(flag_lines, record.get("compiler_flags")),
            "ranks": list(ranks),
            "input_snapshot_paths": [],
            "output_snapshot_paths": [],
        })
    return entries, sorted(unmapped)


# ----------------------------------------------------------------------------- writing


_VALUE = json.JSONEncoder(ensure_ascii=False, allow_nan=False).encode
_INDENTED = json.JSONEncoder(ensure_ascii=False, allow_nan=False, indent=2).encode


def dumps_manifest(doc: Mapping[str, Any]) -> str:
    """Manifest JSON text: indented, one field per line, lists of a graph on one line.

    Readable and line-diffable, and fast for thousands of graphs (the stdlib's indenting
    encoder is pure Python; this keeps each graph field on the C encoder).
    """
    key = _VALUE
    lines = ["{"]
    items = list(doc.items())
    for i, (name, value) in enumerate(items):
        comma = "," if i < len(items) - 1 else ""
        if name == "graphs" and isinstance(value, list) and value:
            lines.append(f"  {key(name)}: [")
            last = len(value) - 1
            for j, graph in enumerate(value):
                body = ",\n".join(f"      {key(k)}: {_VALUE(v)}" for k, v in graph.items())
                lines.append("    {\n" + body + ("\n    }," if j < last else "\n    }"))
            lines.append("  ]" + comma)
        else:
            lines.append(f"  {key(name)}: " + _INDENTED(value).replace("\n", "\n  ") + comma)
    lines.append("}")
    return "\n".join(lines) + "\n"


def emit_manifest(
    *,
    cache_dir: str | os.PathLike[str] | None,
    config: Mapping[str, Any] | None = None,
    rank_map: Mapping[int, int] | Sequence[int] | None = None,
    local_rank: int = 0,
) -> Path | None:
    """Write ``<root>/<engine-id>/manifest.json`` from this engine's ledger; its path, or None.

    Only ``local_rank == 0`` emits; off (``VLLM_NEURON_MANIFEST_DIR`` unset/empty) does nothing.
    ``rank_map`` maps ledger (TP-local) ranks to global ranks: a mapping, or a sequence read as
    the TP group's global ranks. ``config`` is a :func:`build_config` block. ``cache_dir`` None
    lists the graphs without cache fields (all null). Never raises.
    """
    root = manifest_root()
    if root is None or local_rank != 0:
        return None
    stage = "resolve the engine id"
    try:
        engine_id = get_server_prefix()
        source = ledger_dir(root, engine_id)
        stage = f"read the ledger {source}"
        grouped, dropped = read_ledger(source)
        if dropped:
            logger.warning(
                "manifest: skipped %d ledger line(s) in %s (%s); the graphs they name are not in the manifest",
                sum(dropped.values()), source, describe_dropped(dropped),
            )
        stage = f"map ranks with rank_map={rank_map!r}"
        to_global = _rank_mapper(rank_map)
        cache = None if cache_dir is None else CompileCache(cache_dir)
        stage = f"enrich graphs from the compile cache {cache_dir}"
        graphs, unmapped = _graph_entries(grouped, cache, to_global)
        if unmapped:
            logger.warning(
                "manifest: TP-local rank(s) %s are not in the TP group; recorded unmapped", unmapped
            )
        stage = "collect the config and environment"
        doc = {
            "manifest_version": MANIFEST_VERSION,
            "config": _config_block(config),
            "graphs": graphs,
            "environment": environment_snapshot(),
        }
        target = Path(root) / engine_id / MANIFEST_FILENAME
        stage = f"write {target}"
        write_atomic(target, dumps_manifest(doc), durable=True)
    except Exception as exc:  # best-effort: never break warmup or serving
        logger.warning(
            "manifest emit failed: could not %s (%s: %s); no manifest written this run. "
            "Compilation and serving are unaffected.", stage, type(exc).__name__, exc,
        )
        return None
    forget_recorded(source)
    try:
        shutil.rmtree(source)
    except FileNotFoundError:
        pass
    except Exception as exc:
        logger.warning(
            "manifest written to %s, but its ledger %s could not be removed (%s: %s)",
            target, source, type(exc).__name__, exc,
        )
    return target
