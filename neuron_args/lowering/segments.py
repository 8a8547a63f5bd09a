"""``segment_reduce``, which torchax does not lower: a segment-by-element mask along the reduced axis (the segment
count is static), each reduction from ``initial`` when given, as torch's, else from the identity.
"""
from __future__ import annotations

from typing import Any

from neuron_args.lazy_modules import jnp


def segment_reduce(data: Any, reduce: str, *, lengths: Any = None, indices: Any = None, offsets: Any = None,
                   axis: int = 0, unsafe: bool = False, initial: Any = None) -> Any:
    if indices is not None:
        raise ValueError("segment_reduce with indices= is not supported by torch either; pass lengths= or offsets=")
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
    over = axis + 1
    size = lengths.reshape(lengths.shape + (1,) * len(trail)).astype(data.dtype)
    neutral = {"sum": 0, "mean": 0, "prod": 1, "max": -jnp.inf, "min": jnp.inf}[reduce]
    start = jnp.asarray(neutral if initial is None else initial, data.dtype)
    if reduce in ("sum", "mean"):
        total = jnp.where(mask, values, 0).sum(over) + start
        if reduce == "sum":
            return total
        empty = jnp.nan if initial is None else start
        return jnp.where(size > 0, total / jnp.where(size > 0, size, 1), empty).astype(data.dtype)
    if reduce == "prod":
        return jnp.where(mask, values, 1).prod(over) * start
    if reduce == "max":
        return jnp.maximum(jnp.where(mask, values, -jnp.inf).max(over), start)
    if reduce == "min":
        return jnp.minimum(jnp.where(mask, values, jnp.inf).min(over), start)
    raise ValueError(f"segment_reduce: unknown reduction {reduce!r} (sum, mean, max, min, prod)")
