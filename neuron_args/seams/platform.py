"""What a cache key holds of the platform besides the graph and its arguments: tool versions, input specs."""
from __future__ import annotations

import functools
import importlib.metadata
from collections.abc import Sequence
from typing import Any


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "absent"


@functools.lru_cache(maxsize=None)
def lowering_tool_versions() -> tuple[tuple[str, str], ...]:
    """Versions of everything that shapes the HLO (read from package metadata: no import)."""
    return tuple((d, _version(d)) for d in ("torch", "torchax", "jax", "jaxlib", "neuron-args")) + (("jax_x64", "off"),)


def tool_versions(compiler_info: Any) -> dict[str, str]:
    return {**dict(lowering_tool_versions()), "compiler": f"{compiler_info.name} {compiler_info.version}"}


def input_spec_pairs(specs: Sequence[Any]) -> list[tuple[tuple[int, ...], str]]:
    return [(tuple(s.shape), s.dtype) for s in specs]
