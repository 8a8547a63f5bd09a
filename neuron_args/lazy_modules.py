"""jax and transformers, each imported when an attribute is first read (jax takes 1-2 s): a process of cache hits
pays for neither. Not for code Dynamo traces, where such a read is a graph break."""
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
jaxlib_jax: Any = _Module("jaxlib._jax")
xla_client: Any = _Module("jaxlib.xla_client")  # jax's own, without importing jax
transformers: Any = _Module("transformers")
cache_utils: Any = _Module("transformers.cache_utils")
