"""``segment_reduce``, which torchax does not lower: a segment-by-element mask along the reduced axis (the segment
count is static), each reduction from ``initial`` when given, as torch's, else from the identity.
"""
from __future__ import annotations

import math
from typing import Any

from neuron_args.lazy_modules import jnp

#: each reduction's identity, the jnp function combining it with ``initial``, and the array method reducing
_REDUCTIONS = {"sum": (0, "add", "sum"), "mean": (0, "add", "sum"), "prod": (1, "multiply", "prod"),
               "max": (-math.inf, "maximum", "max"), "min": (math.inf, "minimum", "min")}


def segment_reduce(data: Any, reduce: str, *, lengths: Any = None, indices: Any = None, offsets: Any = None,
                   axis: int = 0, unsafe: bool = False, initial: Any = None) -> Any:
    if indices is not None:
        raise ValueError("segment_reduce with indices= is not supported by torch either; pass lengths= or offsets=")
    if reduce not in _REDUCTIONS:
        raise ValueError(f"segment_reduce: unknown reduction {reduce!r} (sum, mean, max, min, prod)")
    if lengths is None:
        lengths = jnp.diff(offsets, axis=-1)
    axis = axis % data.ndim
    n, trail = data.shape[axis], data.shape[axis + 1:]
    ends = jnp.cumsum(lengths, axis=-1)  # lead + (S,)
    position = jnp.arange(n)
    segment = (ends[..., None, :] <= position[:, None]).sum(-1)  # lead + (N,): the segment of each element
    count = lengths.shape[-1]
    mask = segment[..., None, :] == jnp.arange(count)[:, None]  # lead + (S, N)
    mask = mask.reshape(mask.shape + (1,) * len(trail))
    values = jnp.expand_dims(data, axis)  # lead + (1, N) + trail
    neutral, combine, method = _REDUCTIONS[reduce]
    start = jnp.asarray(neutral if initial is None else initial, data.dtype)
    total = getattr(jnp, combine)(getattr(jnp.where(mask, values, neutral), method)(axis + 1), start)
    if reduce != "mean":
        return total
    size = lengths.reshape(lengths.shape + (1,) * len(trail)).astype(data.dtype)
    empty = jnp.nan if initial is None else start
    return jnp.where(size > 0, total / jnp.where(size > 0, size, 1), empty).astype(data.dtype)
