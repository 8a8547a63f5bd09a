"""``nn.EmbeddingBag``: bags are static in a compiled graph (the traced offsets decide them), so the
lowering gathers rows and reduces each bag (sum, mean, max), forward and backward."""
from __future__ import annotations

from typing import Any

from neuron_args.lazy_modules import jax, jnp


_SUM, _MEAN, _MAX = 0, 1, 2  # embedding_bag modes


def bags(indices: Any, offsets: Any, num_bags: int, padding_idx: int) -> tuple[Any, Any]:
    """Each index's bag (``num_bags`` where it is in none) and whether it counts (not padding, inside a bag): the
    last bag whose offset is at or below the index (a static form of the kernel's loop over ``offsets``)."""
    rows = jnp.arange(indices.shape[0])
    starts = offsets[:num_bags].astype(rows.dtype)
    bag = jnp.sum(rows[:, None] >= starts[None, :], axis=1) - 1
    valid = bag >= 0
    if offsets.shape[0] > num_bags:  # include_last_offset: the last offset ends the last bag
        valid = valid & (rows < offsets[num_bags].astype(rows.dtype))
    if padding_idx >= 0:
        valid = valid & (indices != padding_idx)
    return jnp.where(valid, bag, num_bags), valid


def embedding_bag(
    weight: Any, indices: Any, offsets: Any, scale_grad_by_freq: bool = False, mode: int = _SUM, sparse: bool = False,
    per_sample_weights: Any = None, include_last_offset: bool = False, padding_idx: int = -1, *,
    forward_only: bool = False,
) -> tuple[Any, Any, Any, Any]:
    """``aten._embedding_bag``: ``(output, offset2bag, bag_size, max_indices)``, as torch's meta shapes them
    (torchax's lowering reads the traced ``offsets`` into numpy): a segment sum, mean or max in float32."""
    num_bags = offsets.shape[0] - (1 if include_last_offset else 0)
    bag, valid = bags(indices, offsets, num_bags, padding_idx)
    rows = weight[indices].astype(jnp.float32)
    if per_sample_weights is not None:
        rows = rows * per_sample_weights.astype(jnp.float32)[:, None]
    counts = jax.ops.segment_sum(valid.astype(jnp.int32), bag, num_segments=num_bags)
    max_indices = jnp.zeros((num_bags,), offsets.dtype)
    if mode == _MAX:
        out = jax.ops.segment_max(jnp.where(valid[:, None], rows, -jnp.inf), bag, num_segments=num_bags)
        out = jnp.where(counts[:, None] > 0, out, 0.0)
        # the row each maximum came from: the first index of the bag whose row equals it
        hit = valid[:, None] & (rows == out[jnp.minimum(bag, num_bags - 1)])
        first = jax.ops.segment_min(jnp.where(hit, jnp.arange(indices.shape[0])[:, None], indices.shape[0]), bag,
                                    num_segments=num_bags)
        max_indices = jnp.where(counts[:, None] > 0, indices[jnp.minimum(first, indices.shape[0] - 1)], -1)
        max_indices = max_indices.astype(offsets.dtype)
    else:
        out = jax.ops.segment_sum(jnp.where(valid[:, None], rows, 0.0), bag, num_segments=num_bags)
        if weight.dtype == jnp.bfloat16:  # the kernel (fbgemm) rounds its float32 sums half up
            out = round_half_up_to_bfloat16(out)
        if mode == _MEAN:  # then divides in the weight's dtype
            out = out.astype(weight.dtype).astype(jnp.float32) / jnp.maximum(counts, 1)[:, None].astype(jnp.float32)
    fast_sum = mode == _SUM and padding_idx < 0 and weight.dtype in (jnp.float32, jnp.float16)
    offset2bag = jnp.zeros((0,), offsets.dtype) if fast_sum else jnp.minimum(bag, num_bags - 1).astype(offsets.dtype)
    bag_size = counts.astype(offsets.dtype)
    if forward_only:  # the forward-only op's bag_size is shaped as offsets
        bag_size = jnp.zeros(offsets.shape, offsets.dtype).at[:num_bags].set(bag_size)
    return out.astype(weight.dtype), offset2bag, bag_size, max_indices


def round_half_up_to_bfloat16(x: Any) -> Any:
    """float32 -> bfloat16 rounding ties away from zero, as fbgemm does (float32 holding bfloat16 values)."""
    bits = jax.lax.bitcast_convert_type(x, jnp.uint32)
    rounded = jax.lax.bitcast_convert_type((bits + jnp.uint32(0x8000)) & jnp.uint32(0xFFFF0000), jnp.float32)
    return jnp.where(jnp.isfinite(x), rounded, x)


def embedding_bag_backward(
    grad: Any, indices: Any, offsets: Any, offset2bag: Any, bag_size: Any, max_indices: Any, num_weights: int,
    scale_grad_by_freq: bool, mode: int, sparse: bool, per_sample_weights: Any, padding_idx: int = -1,
) -> Any:
    """``aten._embedding_bag_backward``: the dense gradient of the weight (``sparse=True`` is refused)."""
    if sparse:
        raise ValueError("sparse=True: Neuron graphs compute dense gradients (use sparse=False)")
    f32 = jnp.float32
    num_bags, dim = grad.shape
    g = grad.astype(f32)
    if mode == _MAX:
        got = max_indices >= 0
        rows = jnp.where(got, max_indices, 0).astype(jnp.int32)
        cols = jnp.broadcast_to(jnp.arange(dim), rows.shape)
        out = jnp.zeros((num_weights, dim), f32).at[rows, cols].add(jnp.where(got, g, 0.0))
    else:
        bag, valid = bags(indices, offsets, num_bags, padding_idx)
        per_row = jnp.where(valid[:, None], g[jnp.minimum(bag, num_bags - 1)], 0.0)
        if per_sample_weights is not None:
            per_row = per_row * per_sample_weights.astype(f32)[:, None]
        if mode == _MEAN:
            counts = jax.ops.segment_sum(valid.astype(jnp.int32), bag, num_segments=num_bags)
            per_row = per_row / jnp.maximum(counts, 1)[jnp.minimum(bag, num_bags - 1)][:, None].astype(f32)
        out = jnp.zeros((num_weights, dim), f32).at[indices].add(per_row)
    if scale_grad_by_freq:
        freq = jnp.zeros((num_weights,), jnp.int32).at[indices].add(1)
        out = out / jnp.maximum(freq, 1)[:, None].astype(f32)
    if padding_idx >= 0:
        out = out.at[padding_idx].set(0.0)
    return out.astype(grad.dtype)


def embedding_bag_per_sample_weights_backward(
    grad: Any, weight: Any, indices: Any, offsets: Any, offset2bag: Any, mode: int, padding_idx: int = -1,
) -> Any:
    """``aten._embedding_bag_per_sample_weights_backward``: each index's row dotted with its bag's gradient."""
    num_bags = grad.shape[0]
    bag, valid = bags(indices, offsets, num_bags, padding_idx)
    f32 = jnp.float32
    dots = jnp.sum(grad.astype(f32)[jnp.minimum(bag, num_bags - 1)] * weight[indices].astype(f32), axis=-1)
    return jnp.where(valid, dots, 0.0).astype(grad.dtype)
