"""The versions of the tools that shape a graph's HLO: part of every cache key and of the trace memo's fingerprint."""
from __future__ import annotations

import functools
import importlib.metadata


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "absent"


@functools.lru_cache(maxsize=None)
def lowering_tool_versions() -> tuple[tuple[str, str], ...]:
    """Versions of everything that shapes the HLO (read from package metadata: no import)."""
    return tuple((d, _version(d)) for d in ("torch", "torchax", "jax", "jaxlib", "neuron-args")) + (("jax_x64", "off"),)

