"""``fractional_max_pool2d`` and ``fractional_max_pool3d``, which torchax does not lower: windows from the graph's
``random_samples`` input as torch's ``generate_intervals`` (NaN: the first maximum, where torch keeps the last)."""
from __future__ import annotations

import functools
import math
from typing import Any

from neuron_args.lazy_modules import jnp


def _starts(sample: Any, size: int, out: int, pool: int) -> Any:
    """torch's ``generate_intervals``: ``int((i + u) * alpha) - int(u * alpha)``, the last window at the end."""
    if out == 1:
        return jnp.full(sample.shape + (1,), size - pool, jnp.int32)
    alpha = jnp.asarray((size - pool) / (out - 1), sample.dtype)
    i = jnp.arange(out, dtype=sample.dtype)
    seq = ((i + sample[..., None]) * alpha).astype(jnp.int32) - (sample[..., None] * alpha).astype(jnp.int32)
    return seq.at[..., -1].set(size - pool)


def _fractional_max_pool(order: tuple[int, ...], x: Any, kernel_size: Any, output_size: Any,
                         samples: Any) -> tuple[Any, Any]:
    """``aten.fractional_max_pool{2,3}d``, spatial dim ``d``'s windows from sample ``order[d]``."""
    kernel = tuple(kernel_size)
    output_size = tuple(output_size)
    dims = len(order)
    batched = x.ndim == dims + 2
    if not batched:
        x, samples = x[None], samples if samples.ndim == 3 else samples[None]
    spatial = x.shape[-dims:]
    windows = []  # per spatial dim: the input positions of each output's window, (N, C, out, pool)
    for d in range(dims):
        start = _starts(samples[..., order[d]], spatial[d], output_size[d], kernel[d])
        windows.append(start[..., None] + jnp.arange(kernel[d]))
    n, c = x.shape[:2]
    flat = x.reshape(n, c, -1)
    index = jnp.zeros((n, c) + tuple(output_size) + tuple(kernel), jnp.int32)
    for d in range(dims):
        shape = [n, c] + [1] * (2 * dims)
        shape[2 + d], shape[2 + dims + d] = output_size[d], kernel[d]
        index = index + windows[d].reshape(shape) * math.prod(spatial[d + 1:])
    index = index.reshape(n, c, -1)
    values = jnp.take_along_axis(flat, index, axis=-1).reshape(n, c, *output_size, -1)
    best = jnp.argmax(values, axis=-1)
    out = jnp.take_along_axis(values, best[..., None], axis=-1)[..., 0]
    where = jnp.take_along_axis(index.reshape(n, c, *output_size, -1), best[..., None], axis=-1)[..., 0]
    if not batched:
        out, where = out[0], where[0]
    return out, where


#: the height's windows from sample 1, the width's from sample 0 (torch's); 3d: time, height, width from 0, 1, 2
fractional_max_pool2d = functools.partial(_fractional_max_pool, (1, 0))
fractional_max_pool3d = functools.partial(_fractional_max_pool, (0, 1, 2))
