"""Orthogonal polynomials torchax has no lowering for (Chebyshev V and W, shifted Chebyshev T, U, V, W, Legendre P),
as torch's CPU kernels compute them; the recurrence runs to the largest tensor ``n``, each element stopping at its own.
"""
from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from neuron_args.lazy_modules import jax, jnp


def _operands(x: Any, n: Any) -> tuple[Any, Any]:
    """``x`` as a float array (integers: float32), ``n`` truncated to integers (torch's ``int64_t`` cast), broadcast."""
    x, n = jnp.asarray(x), jnp.asarray(n)
    if not jnp.issubdtype(x.dtype, jnp.floating):
        x = x.astype(jnp.float32)
    if not jnp.issubdtype(n.dtype, jnp.integer):
        n = jnp.trunc(n).astype(jnp.int32)
    return jnp.broadcast_arrays(x, n.astype(jnp.int32))


def _recurrence(x: Any, n: Any, first: Any, step: Callable[[Any, Any, Any], Any]) -> Any:
    """``q_n`` from ``q_0 = 1``, ``q_1 = first`` and ``q_k = step(k, q_{k-2}, q_{k-1})`` for ``2 <= k <= n``."""
    def body(state: tuple[Any, Any, Any]) -> tuple[Any, Any, Any]:
        k, p, q = state
        active = k <= n
        r = step(k.astype(x.dtype), p, q)
        return k + 1, jnp.where(active, q, p), jnp.where(active, r, q)

    start = (jnp.asarray(2, jnp.int32), jnp.ones_like(x), first)
    _, _, q = jax.lax.while_loop(lambda s: s[0] <= jnp.max(n, initial=0), body, start)
    return jnp.where(n == 0, 1, q)


def _select(default: Any, *cases: tuple[Any, Any]) -> Any:
    """The first case whose condition holds (torch's early returns, in order), else ``default``."""
    out = default
    for cond, value in reversed(cases):
        out = jnp.where(cond, value, out)
    return out


def _chebyshev_vw(x: Any, n: Any, *, w: bool) -> Any:
    x, n = _operands(x, n)
    nf = n.astype(x.dtype)
    two_n1 = nf + nf + 1
    odd = n % 2 == 1
    at_end = jnp.abs(x) == 1
    a = jnp.arccos(x)
    if w:
        end = jnp.where(x > 0, two_n1, jnp.where(odd, -1.0, 1.0))
        trig_ok = jnp.cos(a / 2) != 1
        trig = jnp.sin((nf + 0.5) * a) / jnp.sin(a / 2)
        end_trig = end
    else:
        end = jnp.where(x > 0, 1.0, jnp.where(odd, -two_n1, two_n1))
        trig_ok = jnp.sin(a / 2) != 1
        trig = jnp.cos((nf + 0.5) * a) / jnp.cos(a / 2)
        end_trig = jnp.where(odd, -two_n1, two_n1)
    first = x + x + 1 if w else x + x - 1
    return _select(
        _recurrence(x, n, first, lambda k, p, q: (x + x) * q - p),
        (n < 0, 0.0), (at_end, end), ((n > 8) & (jnp.abs(x) < 1), jnp.where(trig_ok, trig, end_trig)),
    ).astype(x.dtype)


def legendre_polynomial_p(x: Any, n: Any) -> Any:
    x, n = _operands(x, n)
    end = jnp.where((x > 0) | (n % 2 == 0), 1.0, -1.0)
    # torch's loop index k runs 1 .. n-1: step k here is its k - 1
    rec = _recurrence(x, n, x, lambda k, p, q: ((k + k - 1) * x * q - (k - 1) * p) / k)
    return _select(rec, (n < 0, 0.0), (jnp.abs(x) == 1, end)).astype(x.dtype)


def _shifted(x: Any, n: Any, kind: str) -> Any:
    x, n = _operands(x, n)
    nf = n.astype(x.dtype)
    y = x + x - 1
    a = jnp.arccos(y)
    odd = n % 2 == 1
    inside = jnp.abs(y) < 1
    if kind == "t":
        at_one, at_zero, big, first = 1.0, jnp.where(odd, -1.0, 1.0), 6, y
        trig = jnp.cos(nf * a)
    elif kind == "u":
        at_one, at_zero, big, first = nf + 1, jnp.where(odd, -(nf + 1), nf + 1), 6, y + y
        trig = jnp.where(jnp.sin(a) != 0, jnp.sin((nf + 1) * a) / jnp.sin(a), (nf + 1) * jnp.cos((nf + 1) * a) / y)
    else:
        two_n1 = nf + nf + 1
        if kind == "v":
            at_one, at_zero, first, big = 1.0, jnp.where(odd, -two_n1, two_n1), y + y - 1, 6
            trig = jnp.where(jnp.sin(a / 2) != 1, jnp.cos((nf + 0.5) * a) / jnp.cos(a / 2),
                             jnp.where(odd, -two_n1, two_n1))
        else:
            at_one, at_zero, first, big = two_n1, jnp.where(odd, -1.0, 1.0), y + y + 1, 4
            trig = jnp.where(jnp.cos(a / 2) != 1, jnp.sin((nf + 0.5) * a) / jnp.sin(a / 2), jnp.where(odd, -1.0, 1.0))
    return _select(
        _recurrence(x, n, first, lambda k, p, q: (y + y) * q - p),
        (n < 0, 0.0), (x == 1, at_one), (x == 0, at_zero), ((n > big) & inside, trig),
    ).astype(x.dtype)


#: the ``torch.special`` names lowered here (``aten::special_<name>``, every overload: tensor or scalar x and n)
LOWERINGS: dict[str, Callable[..., Any]] = {
    "chebyshev_polynomial_v": functools.partial(_chebyshev_vw, w=False),
    "chebyshev_polynomial_w": functools.partial(_chebyshev_vw, w=True),
    "legendre_polynomial_p": legendre_polynomial_p,
    **{f"shifted_chebyshev_polynomial_{kind}": functools.partial(_shifted, kind=kind) for kind in "tuvw"},
}
NAMES = tuple(LOWERINGS)
