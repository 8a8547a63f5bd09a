"""``renorm`` and ``embedding_renorm`` with eager's factor ``maxnorm / (norm + 1e-7)``, a half-precision norm in
float32 (torch's decomposition asks for it in a form torchax cannot lower)."""
from __future__ import annotations

from typing import Any

from neuron_args.lazy_modules import jnp


def renorm_factor(norm: Any, maxnorm: float, dtype: Any) -> Any:
    """Eager's scale for a slice of norm ``norm``: ``maxnorm / (norm + 1e-7)`` above ``maxnorm``, else 1."""
    return jnp.where(norm > maxnorm, maxnorm / (norm + 1e-7), 1.0).astype(dtype)


def renorm(x: Any, p: float, dim: int, maxnorm: float) -> Any:
    """``aten.renorm``: each slice along ``dim`` whose ``p``-norm exceeds ``maxnorm`` scaled down to it."""
    dim = dim % x.ndim
    wide = x.astype(jnp.float32) if x.dtype in (jnp.float16, jnp.bfloat16) else x  # eager's norm dtype
    rows = jnp.moveaxis(wide, dim, 0).reshape(x.shape[dim], -1)
    norm = jnp.linalg.norm(rows, ord=p, axis=1)
    shape = [1] * x.ndim
    shape[dim] = x.shape[dim]
    return x * renorm_factor(norm, maxnorm, x.dtype).reshape(shape)


def embedding_renorm(weight: Any, indices: Any, max_norm: float, norm_type: float) -> Any:
    """``aten.embedding_renorm`` (``nn.Embedding(max_norm=...)``): the rows ``indices`` picks, as :func:`renorm`."""
    picked = jnp.zeros(weight.shape[0], bool).at[indices.reshape(-1).astype(jnp.int32)].set(True)
    norm = jnp.linalg.norm(weight.astype(jnp.float32), ord=norm_type, axis=-1)
    scale = jnp.where(picked, renorm_factor(norm, max_norm, weight.dtype), jnp.ones((), weight.dtype))
    return (weight * scale[:, None]).astype(weight.dtype)
