"""The manifest's ``config`` block (checked by :func:`build_config`; :func:`config_block` never raises) and the
package snapshot of its ``environment``."""
from __future__ import annotations

import importlib.metadata
import io
import logging
import platform
from collections.abc import Mapping
from typing import Any

from neuron_args.manifest.jsonable import to_jsonable
from neuron_args.manifest.schema import CONFIG_FIELDS, TOPOLOGY_DEFAULTS

__all__ = ["MODEL_SEPARATOR", "build_config", "config_block", "environment_snapshot", "merge_configs"]

logger = logging.getLogger("neuron_args.manifest")


def _count(label: str, value: Any, *, optional: bool = False) -> int | None:
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{label} must be a positive int{' or None' if optional else ''}, got {value!r}")
    return int(value)


#: Between the models a manifest's graphs come from, in ``config.model`` (a pytest session over two models).
MODEL_SEPARATOR = " + "
_PER_MODEL = ("dtype", "max_num_seqs", "max_model_len")


def merge_configs(first: Mapping[str, Any], other: Mapping[str, Any] | None) -> dict:
    """The config block of a manifest over the runners of ``first`` and ``other``: ``first``, its ``model`` naming
    each model once, and a per-model value the two disagree on None rather than the first's."""
    merged = dict(first)
    if not isinstance(other, Mapping):
        return merged
    names = [n for n in str(first.get("model") or "").split(MODEL_SEPARATOR) if n]
    extra = other.get("model")
    if extra and str(extra) not in names:
        merged["model"] = MODEL_SEPARATOR.join([*names, str(extra)])
        for name in _PER_MODEL:
            if merged.get(name) != other.get(name):
                merged[name] = None
    return merged


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
    """The manifest's ``config`` block: topology filled with its defaults (1 / False), ``neuron_config`` and
    ``vllm_config`` JSON-coerced; ValueError naming the field for an unknown topology key or a non-positive count."""
    given = dict(topology or {})
    unknown = sorted(set(given) - set(TOPOLOGY_DEFAULTS))
    if unknown:
        raise ValueError(
            f"build_config: unknown topology key(s) {unknown}; the manifest schema v1 records "
            f"{', '.join(TOPOLOGY_DEFAULTS)}"
        )
    topo: dict[str, Any] = {**TOPOLOGY_DEFAULTS, **given}  # the defaults' order: ``given`` holds none other
    if not isinstance(topo["has_collectives"], bool):
        raise ValueError(f"topology['has_collectives'] must be a bool, got {topo['has_collectives']!r}")
    topo.update({name: _count(f"topology[{name!r}]", value) for name, value in topo.items()
                 if name != "has_collectives"})
    dtype_text = to_jsonable(dtype)  # "torch.bfloat16"
    return {
        "model": None if model is None else str(model),  # a path's str is its fspath
        "target": None if target is None else str(target),
        "dtype": None if dtype is None else dtype_text if isinstance(dtype_text, str) else str(dtype),
        "max_num_seqs": _count("max_num_seqs", max_num_seqs, optional=True),
        "max_model_len": _count("max_model_len", max_model_len, optional=True),
        "topology": topo,
        "neuron_config": to_jsonable(neuron_config),
        "vllm_config": to_jsonable(vllm_config),
    }


def config_block(config: Mapping[str, Any] | None) -> dict:
    config = config or {}
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
    """``{"python": "3.11.7", "<distribution>": "<version>", ...}``: the first distribution of a name on ``sys.path``
    wins, as for imports; only the ``Name:``/``Version:`` headers are read (a full parse cost ~10x more)."""
    found: dict[str, str] = {}
    for dist in importlib.metadata.distributions():
        try:
            name, version = _name_and_version(dist.read_text("METADATA") or dist.read_text("PKG-INFO") or "")
        except Exception:  # a broken dist-info folder
            continue
        if name and version and name not in found:
            found[name] = version
    return {"python": platform.python_version(), **dict(sorted(found.items(), key=lambda kv: kv[0].lower()))}


def _name_and_version(metadata_text: str) -> tuple[str | None, str | None]:
    """``Name`` and ``Version`` from a core-metadata header (the block before the first blank line), read
    line by line up to there: splitting whole texts (a description can run to 100+ KB) was ~40 % of a snapshot."""
    name = version = None
    for line in io.StringIO(metadata_text, newline=None):
        line = line.rstrip("\n")
        if not line or (name and version):
            break
        if name is None and line.startswith("Name:"):
            name = line[5:].strip()
        elif version is None and line.startswith("Version:"):
            version = line[8:].strip()
    return name, version
