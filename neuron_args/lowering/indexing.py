"""Indexing and searching ops torchax lowers wrongly or not at all: ``searchsorted``, ``index_reduce``,
``repeat_interleave`` with ``output_size``, ``nonzero_static``."""
from __future__ import annotations

from typing import Any

from neuron_args.lazy_modules import jax, jnp


def searchsorted(seq: Any, values: Any, *, out_int32: bool = False, right: bool = False, side: str | None = None,
                 sorter: Any = None) -> Any:
    """``aten.searchsorted.{Tensor,Scalar}`` per row of an N-d ``seq``, with ``right``, ``side`` and ``sorter`` (torchax
    drops them and searches one flat array)."""
    side = side or ("right" if right else "left")
    if sorter is not None:
        seq = jnp.take_along_axis(seq, sorter.astype(jnp.int32), axis=-1)
    values = jnp.asarray(values, seq.dtype)
    rows = seq.reshape(-1, seq.shape[-1])  # one search per row of the leading dims (a 1-D seq: one row for all)
    found = jax.vmap(lambda s, v: jnp.searchsorted(s, v, side=side))(rows, values.reshape(rows.shape[0], -1))
    return found.reshape(values.shape).astype(jnp.int32)


def index_reduce(x: Any, dim: int, index: Any, source: Any, reduce: str, *, include_self: bool = True) -> Any:
    """``aten.index_reduce``: slice ``index[i]`` of ``x`` along ``dim`` reduced with slice ``i`` of ``source`` (not with
    ``x``'s own unless ``include_self``); ``mean`` divides by the count (floor division for integers, as eager)."""
    if x.ndim == 0:  # a scalar: one slice
        return index_reduce(x.reshape(1), 0, index, source.reshape(1), reduce, include_self=include_self)[0]
    out, src = jnp.moveaxis(x, dim, 0), jnp.moveaxis(source.astype(x.dtype), dim, 0)
    index = index.astype(jnp.int32)
    integer = jnp.issubdtype(x.dtype, jnp.integer)
    if reduce == "mean":
        base = out if include_self else out.at[index].set(0)
        counts = jnp.zeros(out.shape[0], x.dtype).at[index].add(1) + (1 if include_self else 0)
        counts = jnp.maximum(counts, 1).reshape(-1, *([1] * (out.ndim - 1)))
        total = base.at[index].add(src)
        out = total // counts if integer else total / counts
    else:
        low, high = (jnp.iinfo(x.dtype).min, jnp.iinfo(x.dtype).max) if integer else (-jnp.inf, jnp.inf)
        identity, method = {"prod": (1, "multiply"), "amax": (low, "max"), "amin": (high, "min")}[reduce]
        base = out if include_self else out.at[index].set(identity)
        out = getattr(base.at[index], method)(src)
    return jnp.moveaxis(out, 0, dim)


def nonzero_static(x: Any, *, size: int, fill_value: int = -1) -> Any:
    """``aten.nonzero_static``: the indices of the first ``size`` nonzero elements (row-major), one row each,
    rows past the last nonzero element filled with ``fill_value``: a fixed size, unlike ``nonzero``."""
    if x.ndim == 0:
        return jnp.zeros((size, 0), jnp.int32)
    return jnp.stack(jnp.nonzero(x, size=size, fill_value=fill_value), axis=-1).astype(jnp.int32)


def repeat_interleave_indices(repeats: Any, *, output_size: int | None = None) -> Any:
    """``aten.repeat_interleave.Tensor`` with ``output_size`` (torchax refuses it): ``i`` ``repeats[i]`` times."""
    return jnp.repeat(jnp.arange(repeats.shape[0], dtype=jnp.int32), repeats, total_repeat_length=output_size)
