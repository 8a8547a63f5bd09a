"""Elementwise ops of real tensors torchax has no lowering for: ``angle`` and ``special.spherical_bessel_j0``."""
from __future__ import annotations

from typing import Any


def angle(x: Any) -> Any:
    """``aten.angle`` of a real tensor: pi where ``x < 0``, else 0 (``-0.0`` too), NaN kept; integers give floats."""
    import jax.numpy as jnp

    out = x if jnp.issubdtype(x.dtype, jnp.floating) else x.astype(jnp.float32)
    return jnp.where(jnp.isnan(out), out, jnp.where(out < 0, jnp.pi, 0).astype(out.dtype))


def spherical_bessel_j0(x: Any) -> Any:
    """``aten.special_spherical_bessel_j0``: ``sin(x) / x``, 1 at 0 and 0 at +-inf (as eager)."""
    import jax.numpy as jnp

    x = x if jnp.issubdtype(x.dtype, jnp.floating) else x.astype(jnp.float32)
    safe = jnp.where((x == 0) | jnp.isinf(x), 1, x)
    return jnp.where(x == 0, 1, jnp.where(jnp.isinf(x), 0, jnp.sin(safe) / safe)).astype(x.dtype)
