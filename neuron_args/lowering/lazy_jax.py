"""The jax modules the lowerings compute with, each imported when first used.

Importing jax takes 1-2 s, which a process that lowers no graph (served from the cache, a trace memo hit) does not
pay; the lowering modules import these names at their top and call them as jax's own.
"""
from __future__ import annotations

import importlib
from typing import Any


class _Module:
    """Module ``name``, imported when one of its attributes is first read (then on each read, from ``sys.modules``)."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> Any:
        return getattr(importlib.import_module(self._name), attr)


jax: Any = _Module("jax")
jnp: Any = _Module("jax.numpy")
lax: Any = _Module("jax.lax")
jsl: Any = _Module("jax.scipy.linalg")
jss: Any = _Module("jax.scipy.special")
