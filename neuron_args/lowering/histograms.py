"""``torch.histogram`` and ``torch.histogramdd``, which torchax does not lower: static bin counts, edges computed
as torch's (equal ends widened by 0.5, an empty input over [0, 1]); samples outside the edges, and NaN, not counted.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from neuron_args.lazy_modules import jnp


def _linspace(start: Any, end: Any, steps: int, dtype: Any) -> Any:
    """torch's CPU ``linspace``: the first half from ``start``, the second from ``end``."""
    i = jnp.arange(steps)
    step = (end - start) / max(steps - 1, 1)
    return jnp.where(i < steps // 2, start + step * i, end - step * (steps - 1 - i)).astype(dtype)


def _edges(samples: Any, bins: Sequence[int], range_: Sequence[float] | None) -> list[Any]:
    """Each dimension's ``bins[d] + 1`` edges over ``range_`` (lo0, hi0, lo1, hi1...) or the samples' min and max."""
    edges = []
    for d, count in enumerate(bins):
        if range_ is not None:
            low, high = (jnp.asarray(v, samples.dtype) for v in range_[2 * d:2 * d + 2])
        elif samples.shape[0] == 0:
            low, high = jnp.asarray(0, samples.dtype), jnp.asarray(1, samples.dtype)
        else:
            low, high = samples[:, d].min(), samples[:, d].max()
        same = low == high
        low, high = jnp.where(same, low - 0.5, low), jnp.where(same, high + 0.5, high)
        edges.append(_linspace(low, high, count + 1, samples.dtype))
    return edges


def _counts(samples: Any, edges: Sequence[Any], weight: Any, density: bool) -> Any:
    """The (weighted, or density) counts of ``samples`` ``(M, D)`` in the bins ``edges`` span."""
    shape = tuple(e.shape[0] - 1 for e in edges)
    flat = jnp.zeros(samples.shape[:1], jnp.int32)
    inside = jnp.ones(samples.shape[:1], bool)
    for d, e in enumerate(edges):
        col = samples[:, d]
        pos = jnp.searchsorted(e, col, side="right") - 1
        pos = jnp.where(col == e[-1], shape[d] - 1, pos)
        inside = inside & (col >= e[0]) & (col <= e[-1])
        flat = flat * shape[d] + pos
    w = jnp.ones(samples.shape[:1], samples.dtype) if weight is None else weight.reshape(-1).astype(samples.dtype)
    total = math.prod(shape)
    hist = jnp.zeros(total, samples.dtype).at[jnp.where(inside, flat, total)].add(w, mode="drop").reshape(shape)
    if density:
        volume = jnp.ones(shape, samples.dtype)
        for d, e in enumerate(edges):
            volume = volume * jnp.diff(e).reshape([-1 if i == d else 1 for i in range(len(shape))])
        hist = hist / (hist.sum() * volume)
    return hist


def histogram_bin_ct(x: Any, bins: int = 100, *, range: Any = None, weight: Any = None,  # noqa: A002 - torch's name
                     density: bool = False) -> tuple[Any, Any]:
    """``aten.histogram.bin_ct``: ``bins`` equal bins over ``range`` (default: the input's min and max)."""
    samples = x.reshape(-1, 1)
    (edges,) = _edges(samples, [bins], range)
    return _counts(samples, [edges], weight, density), edges


def histogram_bins_tensor(x: Any, bins: Any, *, weight: Any = None, density: bool = False) -> tuple[Any, Any]:
    """``aten.histogram.bins_tensor``: the given (increasing) bin edges."""
    edges = bins.astype(x.dtype)
    return _counts(x.reshape(-1, 1), [edges], weight, density), edges


def histogramdd_bin_edges(x: Any, bins: Sequence[int], *, range: Any = None,  # noqa: A002 - torch's name
                          weight: Any = None, density: bool = False) -> list[Any]:
    """``aten._histogramdd_bin_edges``: each dimension's edges."""
    return _edges(x.reshape(-1, x.shape[-1]), bins, range)


def histogramdd_from_bin_cts(x: Any, bins: Sequence[int], *, range: Any = None,  # noqa: A002 - torch's name
                             weight: Any = None, density: bool = False) -> Any:
    """``aten._histogramdd_from_bin_cts``: the counts in ``bins`` equal bins per dimension."""
    samples = x.reshape(-1, x.shape[-1])
    return _counts(samples, _edges(samples, bins, range), weight, density)


def histogramdd_from_bin_tensors(x: Any, bins: Sequence[Any], *, weight: Any = None, density: bool = False) -> Any:
    """``aten._histogramdd_from_bin_tensors``: the counts in the given edges per dimension."""
    samples = x.reshape(-1, x.shape[-1])
    return _counts(samples, [b.astype(x.dtype) for b in bins], weight, density)
