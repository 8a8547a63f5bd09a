"""``polygamma`` below x = 0.5, where jax's Hurwitz zeta is wrong (polygamma(1, -8.48): 7.74, torch 9.80): the
reflection formula ``psi_n(x) = (-1)^n psi_n(1 - x) - pi^(n+1) cot^(n)(pi x)``, the poles as eager's.
"""
from __future__ import annotations

import functools
import math
from typing import Any

from neuron_args.lazy_modules import jax, jnp


@functools.cache
def cot_derivative(n: int) -> tuple[int, ...]:
    """Coefficients (constant first) of ``P`` with ``d^n/dy^n cot(y) = P(cot(y))``: ``P_{k+1} = -(1 + c^2) P_k'``."""
    p = [0, 1]
    for _ in range(n):
        dp = [i * a for i, a in enumerate(p)][1:] or [0]
        out = [0] * (len(dp) + 2)
        for i, a in enumerate(dp):
            out[i] -= a
            out[i + 2] -= a
        p = out
    return tuple(p)


def trigamma(x: Any) -> Any:
    """``polygamma(1, x)`` as torch's CPU kernel computes it (its reflection below 0.5, six steps up, then the
    asymptotic series), so compiled and eager agree where eager's ``sin(pi * x)`` itself rounds."""
    pi = jnp.asarray(math.pi, x.dtype)
    reflect = x < 0.5
    sin_pi_x = jnp.sin(pi * x)
    result = jnp.where(reflect, -(pi * pi) / (sin_pi_x * sin_pi_x), 0).astype(x.dtype)
    x = jnp.where(reflect, 1 - x, x)
    for _ in range(6):
        result = result + 1 / (x * x)
        x = x + 1
    ixx = 1 / (x * x)
    result = result + (1 + 1 / (2 * x) + ixx * (1 / 6 - ixx * (1 / 30 - ixx * (1 / 42)))) / x
    return jnp.where(reflect, -result, result)


def polygamma(n: int, x: Any) -> Any:
    """``aten.polygamma(n, x)`` in ``x``'s floating dtype (integers give float32), right for negative ``x``."""
    if not isinstance(n, int) or n < 0:
        raise ValueError(f"polygamma's order must be a non-negative Python int, got {n!r}")
    x = x if jnp.issubdtype(x.dtype, jnp.floating) else x.astype(jnp.float32)
    dtype = x.dtype
    x = x.astype(jnp.promote_types(dtype, jnp.float32))  # half types: computed in float32, rounded once
    if n == 0:  # eager's digamma: -inf at +0 (+inf at -0)
        return jnp.where(x == 0, jnp.copysign(jnp.inf, -x), jax.scipy.special.digamma(x)).astype(dtype)
    if n == 1:
        return trigamma(x).astype(dtype)
    reflect = x < 0.5
    right = jax.lax.polygamma(jnp.asarray(n, x.dtype), jnp.where(reflect, 1 - x, x))
    r = x - jnp.round(x)  # cot has period pi: reduced first, so pi * r keeps its precision for large |x|
    # cot(pi r) through tan of the smaller angle, so cot(pi / 2) is 0, not cos(pi / 2) rounded
    a = jnp.abs(r)
    c = jnp.where(a <= 0.25, 1 / jnp.tan(jnp.pi * r), jnp.sign(r) * jnp.tan(jnp.pi * (0.5 - a)))
    d = jnp.zeros_like(c)
    for a in reversed(cot_derivative(n)):
        d = d * c + a
    reflected = (-1) ** n * right - math.pi ** (n + 1) * d
    pole = (x <= 0) & ((r == 0) | jnp.isinf(x))  # eager: zeta(n + 1, q) is inf at every non-positive integer q
    out = jnp.where(pole, jnp.inf if n % 2 else -jnp.inf, jnp.where(reflect, reflected, right))
    return out.astype(dtype)
