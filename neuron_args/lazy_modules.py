"""The heavy or optional modules the package computes with, each imported when one of its attributes is first read.

Importing jax takes 1-2 s and transformers several: a process that lowers no graph (cache and trace memo hits) or
builds no Hugging Face cache does not pay for them. The lowerings, :mod:`neuron_args.hf`, the runtime and xla_cpu
import these names at their top and use them as the modules themselves; not in code Dynamo traces (a model's
forward), where reading an attribute here is a graph break.
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
jaxlib_jax: Any = _Module("jaxlib._jax")
xla_client: Any = _Module("jaxlib.xla_client")  # jax's own, without importing jax
transformers: Any = _Module("transformers")
cache_utils: Any = _Module("transformers.cache_utils")
