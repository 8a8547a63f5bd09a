"""``torch.histogram`` (a bin count or given edges; weights; density), which torchax does not lower.

Static: the bins' number is the graph's; their edges may depend on the values (the input's min and max when no
range is given), as torch's: ``linspace`` computed torch's way (from both ends), equal ends widened by 0.5, an
empty input over [0, 1]. An element falls in the bin whose edges bracket it (the last bin holds its right edge);
elements outside the edges, and NaN, are not counted.
"""
from __future__ import annotations

from typing import Any


def _linspace(start: Any, end: Any, steps: int, dtype: Any) -> Any:
    """torch's CPU ``linspace``: the first half from ``start``, the second from ``end``."""
    import jax.numpy as jnp

    i = jnp.arange(steps)
    step = (end - start) / max(steps - 1, 1)
    return jnp.where(i < steps // 2, start + step * i, end - step * (steps - 1 - i)).astype(dtype)


def _histogram(x: Any, edges: Any, weight: Any, density: bool) -> tuple[Any, Any]:
    import jax.numpy as jnp

    flat = x.reshape(-1)
    bins = edges.shape[0] - 1
    pos = jnp.searchsorted(edges, flat, side="right") - 1
    pos = jnp.where(flat == edges[-1], bins - 1, pos)
    inside = (flat >= edges[0]) & (flat <= edges[-1])
    w = jnp.ones_like(flat) if weight is None else weight.reshape(-1).astype(x.dtype)
    hist = jnp.zeros(bins, x.dtype).at[jnp.where(inside, pos, bins)].add(jnp.where(inside, w, 0), mode="drop")
    if density:
        hist = hist / (hist.sum() * jnp.diff(edges))
    return hist, edges


def histogram_bin_ct(x: Any, bins: int = 100, *, range: Any = None, weight: Any = None,  # noqa: A002 - torch's name
                     density: bool = False) -> tuple[Any, Any]:
    """``aten.histogram.bin_ct``: ``bins`` equal bins over ``range`` (default: the input's min and max)."""
    import jax.numpy as jnp

    if range is not None:
        low, high = (jnp.asarray(v, x.dtype) for v in range)
    elif x.size == 0:
        low, high = jnp.asarray(0, x.dtype), jnp.asarray(1, x.dtype)
    else:
        low, high = x.min(), x.max()
    same = low == high
    low, high = jnp.where(same, low - 0.5, low), jnp.where(same, high + 0.5, high)
    return _histogram(x, _linspace(low, high, bins + 1, x.dtype), weight, density)


def histogram_bins_tensor(x: Any, bins: Any, *, weight: Any = None, density: bool = False) -> tuple[Any, Any]:
    """``aten.histogram.bins_tensor``: the given (increasing) bin edges."""
    return _histogram(x, bins.astype(x.dtype), weight, density)
