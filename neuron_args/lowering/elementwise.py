"""Elementwise ops torchax has no lowering for: ``angle`` and ``special.spherical_bessel_j0`` of real tensors,
``prims.convert_element_type``, conversions to ``complex32`` (``chalf``)."""
from __future__ import annotations

from typing import Any

import torch

from neuron_args.lazy_modules import jax, jnp
from neuron_args.tensors import LOWERED_DTYPES, numpy_dtype


def convert_element_type(x: Any, dtype: torch.dtype) -> Any:
    """``prims.convert_element_type`` (aot_autograd's cast of a value read with ``.item()`` to a Python float,
    ``x / t.max().item()``): the cast in the HLO type of ``dtype`` (64-bit types as their 32-bit ones)."""
    if dtype is torch.complex32:
        return to_complex32(x)
    name = str(dtype).removeprefix("torch.")
    return x.astype(numpy_dtype(LOWERED_DTYPES.get(name, name)))


def to_complex32(x: Any) -> Any:
    """A conversion to ``complex32`` (``chalf``), which XLA has no type for: complex64 holding the value eager's
    complex32 holds (real and imaginary parts each rounded to float16)."""
    return jax.lax.complex(*(part(x).astype(jnp.float16).astype(jnp.float32) for part in (jnp.real, jnp.imag)))


def angle(x: Any) -> Any:
    """``aten.angle`` of a real tensor: pi where ``x < 0``, else 0 (``-0.0`` too), NaN kept; integers give floats."""
    out = x if jnp.issubdtype(x.dtype, jnp.floating) else x.astype(jnp.float32)
    return jnp.where(jnp.isnan(out), out, jnp.where(out < 0, jnp.pi, 0).astype(out.dtype))


def spherical_bessel_j0(x: Any) -> Any:
    """``aten.special_spherical_bessel_j0``: ``sin(x) / x``, 1 at 0 and 0 at +-inf (as eager)."""
    x = x if jnp.issubdtype(x.dtype, jnp.floating) else x.astype(jnp.float32)
    safe = jnp.where((x == 0) | jnp.isinf(x), 1, x)
    return jnp.where(x == 0, 1, jnp.where(jnp.isinf(x), 0, jnp.sin(safe) / safe)).astype(x.dtype)
