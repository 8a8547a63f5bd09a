"""``as_strided`` and ``as_strided_scatter`` by the input's real memory layout: torchax assumes a
contiguous input, but a transposed or chunked one (Longformer's attention) is strided in memory."""
from __future__ import annotations

from typing import Any

import numpy as np
import torch

from neuron_args.lazy_modules import jnp


def storage_order(layout: torch.Tensor) -> tuple[list[int], int]:
    """The dims of ``layout`` (a tensor's meta value) from outermost to innermost in memory, and its storage offset;
    an input that does not fill one dense block of memory is refused."""
    order = sorted(range(layout.ndim), key=lambda d: (-layout.stride(d), d))
    expected = 1
    for d in reversed(order):
        if layout.shape[d] != 1 and layout.stride(d) != expected:
            raise ValueError(f"as_strided of a tensor with sizes {tuple(layout.shape)} and strides {layout.stride()} "
                             "that does not fill one dense block of memory; call .contiguous() before as_strided")
        expected *= layout.shape[d]
    return order, layout.storage_offset()


def strided_positions(numel: int, base_offset: int, size: Any, stride: Any, storage_offset: int | None) -> Any:
    """The memory positions (relative to the input's first element) an as_strided view reads, as a constant index
    array shaped ``size``; positions outside the input are refused (eager would read a larger base tensor)."""
    offset = base_offset if storage_offset is None else storage_offset
    # the offset plus each index vector of ``size`` dotted with ``stride`` (a 0-dim ``size``: a numpy scalar)
    positions = offset - base_offset + np.tensordot(np.asarray(stride, np.int64), np.indices(tuple(size)), 1)
    if positions.size and (positions.min() < 0 or positions.max() >= numel):
        raise ValueError(f"as_strided(size={list(size)}, stride={list(stride)}, storage_offset={storage_offset}) "
                         "reads memory outside its input tensor; apply it to the tensor that owns that memory")
    return np.asarray(positions, np.int32)


def as_strided(x: Any, size: Any, stride: Any, storage_offset: int | None = None, *, layout: torch.Tensor) -> Any:
    """``aten.as_strided``: ``size``/``stride`` index the input's memory, laid out as its meta value ``layout`` is."""
    order, base = storage_order(layout)
    memory = jnp.transpose(x, order).reshape(-1)
    return memory[strided_positions(memory.shape[0], base, size, stride, storage_offset)]


def as_strided_scatter(x: Any, src: Any, size: Any, stride: Any, storage_offset: int | None = None, *,
                       layout: torch.Tensor) -> Any:
    """``aten.as_strided_scatter``: ``x`` with the elements :func:`as_strided` would read replaced by ``src``."""
    order, base = storage_order(layout)
    memory = jnp.transpose(x, order)
    flat = memory.reshape(-1)
    flat = flat.at[strided_positions(flat.shape[0], base, size, stride, storage_offset)].set(src.astype(x.dtype))
    inverse = sorted(range(len(order)), key=lambda d: order[d])
    return jnp.transpose(flat.reshape(memory.shape), inverse)

