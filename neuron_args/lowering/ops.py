"""Lowerings for ops torchax lowers wrong or not at all, and the way to add one.

A lowering is a jax function with the op's signature (jax arrays in place of tensors), keyed by
the op's qualified name (``"aten::addmm"``, ``"transformers::grouped_mm_fallback"``). Ours are
below; a user registers one for their own custom op with :func:`register_lowering`. They take
precedence over torchax's table and decompositions, in the graph and inside decompositions.
"""
from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import torch

aten = torch.ops.aten


def _sdpa_flash_for_cpu(
    query: Any, key: Any, value: Any, dropout_p: float = 0.0, is_causal: bool = False, *,
    attn_mask: Any = None, scale: float | None = None,
) -> tuple[Any, Any]:
    """``aten._scaled_dot_product_flash_attention_for_cpu``: ``(output, logsumexp)``.

    torch's decomposition returns the attention weights ``(N, H, L, S)`` as the second value; the op
    returns the float32 log-sum-exp ``(N, H, L)``, which a forward graph saves for backward whenever
    gradients are enabled. Computed in float32 as the CPU kernel accumulates; a fully masked row
    gives a zero output and a zero log-sum-exp, as the kernel does.
    """
    import jax.numpy as jnp

    f32 = jnp.float32
    key, value, scores, _ = _sdpa_scores(query, key, value, dropout_p, is_causal, attn_mask, scale)
    peak = jnp.max(scores, axis=-1, keepdims=True)
    finite = jnp.isfinite(peak)
    exp = jnp.where(finite, jnp.exp(scores - jnp.where(finite, peak, 0.0)), 0.0)
    total = jnp.sum(exp, axis=-1, keepdims=True)
    # as the kernel: unnormalised probabilities rounded to the input dtype, multiplied by V with
    # float32 accumulation, divided by the float32 sum at the end
    out = jnp.einsum("nhls,nhse->nhle", exp.astype(query.dtype), value, preferred_element_type=f32)
    out = jnp.where(finite, out / jnp.where(finite, total, 1.0), 0.0)
    lse = jnp.where(finite, peak + jnp.log(jnp.where(finite, total, 1.0)), 0.0)[..., 0]
    return out.astype(query.dtype), lse


def _sdpa_flash_for_cpu_backward(
    grad_out: Any, query: Any, key: Any, value: Any, out: Any, logsumexp: Any, dropout_p: float,
    is_causal: bool, *, attn_mask: Any = None, scale: float | None = None,
) -> tuple[Any, Any, Any]:
    """``aten._scaled_dot_product_flash_attention_for_cpu_backward``: ``(grad_query, grad_key, grad_value)``.

    The training graph's backward of the op above (torch has no decomposition for it). The flash
    backward: probabilities recomputed from the saved log-sum-exp, ``D = rowsum(dO * O)``,
    ``dS = P * (dO V^T - D)``, everything in float32 and rounded once to the inputs' dtypes. With
    grouped-query attention the key/value gradients of a shared head are summed over its group.
    """
    import jax.numpy as jnp

    f32 = jnp.float32
    kv_shape = key.shape
    keys, values, scores, scale = _sdpa_scores(query, key, value, dropout_p, is_causal, attn_mask, scale)
    probs = jnp.exp(scores - logsumexp.astype(f32)[..., None])  # masked (-inf) scores give 0
    d_out = grad_out.astype(f32)
    grad_value = jnp.einsum("nhls,nhle->nhse", probs, d_out)
    d_probs = jnp.einsum("nhle,nhse->nhls", d_out, values.astype(f32))
    delta = jnp.sum(d_out * out.astype(f32), axis=-1, keepdims=True)
    d_scores = probs * (d_probs - delta) * scale
    grad_query = jnp.einsum("nhls,nhse->nhle", d_scores, keys.astype(f32))
    grad_key = jnp.einsum("nhls,nhle->nhse", d_scores, query.astype(f32))
    group = query.shape[1] // kv_shape[1]
    if group > 1:  # sum each shared key/value head's gradient over the query heads of its group
        grad_key = grad_key.reshape(kv_shape[0], kv_shape[1], group, *grad_key.shape[2:]).sum(axis=2)
        grad_value = grad_value.reshape(kv_shape[0], kv_shape[1], group, *grad_value.shape[2:]).sum(axis=2)
    return grad_query.astype(query.dtype), grad_key.astype(key.dtype), grad_value.astype(value.dtype)


def _sdpa_scores(query: Any, key: Any, value: Any, dropout_p: float, is_causal: bool, attn_mask: Any,
                 scale: float | None) -> tuple[Any, Any, Any, float]:
    """Shared by the SDPA forward and backward: ``(key, value)`` repeated to the query's heads, the
    scaled float32 scores with every disallowed position at ``-inf``, and the scale."""
    import jax.numpy as jnp

    if dropout_p:
        raise ValueError(f"dropout_p={dropout_p}: Neuron graphs lower SDPA without dropout (set the "
                         "attention dropout to 0 or call model.eval())")
    heads, kv_heads = query.shape[1], key.shape[1]
    if heads != kv_heads:  # grouped-query attention
        key = jnp.repeat(key, heads // kv_heads, axis=1)
        value = jnp.repeat(value, heads // kv_heads, axis=1)
    f32 = jnp.float32
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale
    scores = jnp.einsum("nhle,nhse->nhls", query, key, preferred_element_type=f32) * scale
    length, source = scores.shape[-2], scores.shape[-1]
    allowed = jnp.ones((length, source), dtype=bool)
    if is_causal:
        allowed = jnp.tril(allowed)
    if attn_mask is not None:
        if attn_mask.dtype == jnp.bool_:
            allowed = allowed & attn_mask
        else:
            scores = scores + attn_mask.astype(f32)
    return key, value, jnp.where(allowed, scores, -jnp.inf), scale


def _grouped_mm(input: Any, weight: Any, offs: Any) -> Any:
    """``transformers::grouped_mm_fallback``: rows sorted by expert, ``offs`` = cumulative counts.

    The eager kernel loops over experts with ``offs.tolist()`` (data-dependent). Static form: each
    row's expert is the number of offsets at or below its index; every row is multiplied by its
    own expert's weight (gathered), accumulated in float32.
    """
    import jax.numpy as jnp

    rows = jnp.arange(input.shape[0])
    expert = jnp.sum(rows[:, None] >= offs[None, :].astype(rows.dtype), axis=1)
    expert = jnp.minimum(expert, weight.shape[0] - 1)  # rows past the last offset: zero in eager
    valid = rows < offs[-1]
    out = jnp.einsum("si,sio->so", input, weight[expert], preferred_element_type=jnp.float32)
    return jnp.where(valid[:, None], out, 0.0).astype(input.dtype)


def _grouped_mm_backward(input: Any, weight: Any, offs: Any, grad_output: Any) -> tuple[Any, Any]:
    """``transformers::grouped_mm_fallback_backward``: ``(grad_input, grad_weight)``, the vjp of the lowering above
    (the eager kernel loops over ``offs.tolist()`` again)."""
    return _pullback(lambda x, w: _grouped_mm(x, w, offs), grad_output, input, weight)


def _addmm(bias: Any, a: Any, b: Any, *, beta: float = 1, alpha: float = 1) -> Any:
    """``bias + a @ b`` accumulated in float32 and rounded once, as torch's CPU kernel does.

    The HLO keeps the matmul in the input dtype with a float32 result
    (``preferred_element_type``), the mixed-precision form accelerators run natively.
    """
    import jax.numpy as jnp

    f32 = jnp.float32
    out = jnp.matmul(a, b, preferred_element_type=f32 if a.dtype != jnp.float64 else None)
    if alpha != 1:
        out = out * alpha
    out = out + (bias.astype(out.dtype) if beta == 1 else beta * bias.astype(out.dtype))
    return out.astype(jnp.result_type(a.dtype, b.dtype))


def _pullback(forward: Callable[..., Any], grad_output: Any, *primals: Any) -> tuple[Any, ...]:
    """The gradients of ``forward`` at ``primals`` for ``grad_output``: a backward op as the vjp of its
    forward op's lowering, so forward and backward come from one definition."""
    import jax

    out, pull = jax.vjp(forward, *primals)
    return pull(grad_output.astype(out.dtype))


def _lowered_op(op: Any, *args: Any) -> Callable[..., Any]:
    """``op(*tensors, *args)`` as a function of jax arrays, lowered as the graph lowers it (a lowering
    here, torchax's, or torch's decomposition); its first output when it has several."""
    env = _installed[-1]

    def forward(*arrays: Any) -> Any:
        # fresh lists: some torchax lowerings extend theirs in place (convolution's padding)
        out = op(*env.j2t_iso(arrays), *(list(a) if isinstance(a, (list, tuple)) else a for a in args))
        return env.t2j_iso(out[0] if isinstance(out, (tuple, list)) else out)

    return forward


def _backward_of(forward_op: Any, primals: int, masked: bool = False) -> Callable[..., Any]:
    """The lowering of a backward op ``(grad_output, *primals, *args[, output_mask])``: the vjp of
    ``forward_op(*primals, *args)`` at the primals (None where the output mask says so)."""
    def lowering(grad_output: Any, *rest: Any) -> Any:
        arrays, args = rest[:primals], rest[primals:]
        mask = args[-1] if masked else [True] * primals
        args = args[:-1] if masked else args
        grads = _pullback(_lowered_op(forward_op, *args), grad_output, *arrays)
        grads = tuple(g if wanted else None for g, wanted in zip(grads, mask))
        return grads if primals > 1 else grads[0]

    return lowering


def _adaptive_avg_pool_backward(forward_op: Any, spatial: int) -> Callable[..., Any]:
    """The lowering of ``aten._adaptive_avg_pool{2,3}d_backward``: the vjp of the pooling, whose output size is
    the gradient's."""
    def lowering(grad_output: Any, input: Any) -> Any:
        return _pullback(_lowered_op(forward_op, list(grad_output.shape[-spatial:])), grad_output, input)[0]

    return lowering


def _weight_norm_backward(grad_w: Any, saved_v: Any, saved_g: Any, saved_norms: Any, dim: int) -> tuple[Any, Any]:
    """``aten._weight_norm_interface_backward``: ``(grad_v, grad_g)``, the vjp of the forward's ``w``."""
    return _pullback(_lowered_op(aten._weight_norm_interface.default, dim), grad_w, saved_v, saved_g)


def _convolution_backward(
    grad_output: Any, input: Any, weight: Any, bias_sizes: Any, stride: Any, padding: Any, dilation: Any,
    transposed: bool, output_padding: Any, groups: int, output_mask: Any,
) -> tuple[Any, Any, Any]:
    """``aten.convolution_backward``: ``(grad_input, grad_weight, grad_bias)``, each None unless asked for."""
    import jax.numpy as jnp

    conv = _lowered_op(aten.convolution.default, None, stride, padding, dilation, transposed, output_padding,
                       groups)
    grad_input, grad_weight = _pullback(conv, grad_output, input, weight)
    grad_bias = None
    if output_mask[2]:
        axes = (0, *range(2, grad_output.ndim))
        grad_bias = jnp.sum(grad_output, axis=axes, dtype=jnp.float32).astype(grad_output.dtype)
    return (grad_input if output_mask[0] else None, grad_weight if output_mask[1] else None, grad_bias)


_SUM, _MEAN, _MAX = 0, 1, 2  # embedding_bag modes


def _bags(indices: Any, offsets: Any, num_bags: int, padding_idx: int) -> tuple[Any, Any]:
    """Each index's bag (``num_bags`` where it is in none) and whether it counts (not padding, inside a bag).

    A static form of the kernel's loop over ``offsets``: index ``i`` is in the last bag whose offset is at or
    below ``i``; an empty bag repeats the next one's offset, so it gets no index. Past ``offsets[num_bags]``
    (``include_last_offset``, where offsets has one entry more than there are bags) an index is in no bag.
    """
    import jax.numpy as jnp

    rows = jnp.arange(indices.shape[0])
    starts = offsets[:num_bags].astype(rows.dtype)
    bag = jnp.sum(rows[:, None] >= starts[None, :], axis=1) - 1
    valid = bag >= 0
    if offsets.shape[0] > num_bags:  # include_last_offset: the last offset ends the last bag
        valid = valid & (rows < offsets[num_bags].astype(rows.dtype))
    if padding_idx >= 0:
        valid = valid & (indices != padding_idx)
    return jnp.where(valid, bag, num_bags), valid


def _embedding_bag(
    weight: Any, indices: Any, offsets: Any, scale_grad_by_freq: bool = False, mode: int = _SUM, sparse: bool = False,
    per_sample_weights: Any = None, include_last_offset: bool = False, padding_idx: int = -1, *,
    forward_only: bool = False,
) -> tuple[Any, Any, Any, Any]:
    """``aten._embedding_bag``: ``(output, offset2bag, bag_size, max_indices)``, shaped as torch's meta says.

    torchax's lowering reads ``offsets`` into numpy (a traced value: it cannot). Static form: each index's
    bag from :func:`_bags`, then a segment sum, mean (over the indices that count) or max, in float32 and
    rounded once; an empty bag gives zeros as the kernel does. ``max_indices`` holds the row of each maximum
    (the backward's input); the backward below recomputes everything else from ``indices`` and ``offsets``.
    """
    import jax
    import jax.numpy as jnp

    num_bags = offsets.shape[0] - (1 if include_last_offset else 0)
    bag, valid = _bags(indices, offsets, num_bags, padding_idx)
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
            out = _round_half_up_to_bfloat16(out)
        if mode == _MEAN:  # then divides in the weight's dtype
            out = out.astype(weight.dtype).astype(jnp.float32) / jnp.maximum(counts, 1)[:, None].astype(jnp.float32)
    fast_sum = mode == _SUM and padding_idx < 0 and weight.dtype in (jnp.float32, jnp.float16)
    offset2bag = jnp.zeros((0,), offsets.dtype) if fast_sum else jnp.minimum(bag, num_bags - 1).astype(offsets.dtype)
    bag_size = counts.astype(offsets.dtype)
    if forward_only:  # the forward-only op's bag_size is shaped as offsets
        bag_size = jnp.zeros(offsets.shape, offsets.dtype).at[:num_bags].set(bag_size)
    return out.astype(weight.dtype), offset2bag, bag_size, max_indices


def _round_half_up_to_bfloat16(x: Any) -> Any:
    """float32 -> bfloat16 rounding ties away from zero in magnitude (add half an ulp, truncate), as fbgemm does;
    returned as float32 holding bfloat16 values."""
    import jax
    import jax.numpy as jnp

    bits = jax.lax.bitcast_convert_type(x, jnp.uint32)
    rounded = jax.lax.bitcast_convert_type((bits + jnp.uint32(0x8000)) & jnp.uint32(0xFFFF0000), jnp.float32)
    return jnp.where(jnp.isfinite(x), rounded, x)


def _embedding_bag_backward(
    grad: Any, indices: Any, offsets: Any, offset2bag: Any, bag_size: Any, max_indices: Any, num_weights: int,
    scale_grad_by_freq: bool, mode: int, sparse: bool, per_sample_weights: Any, padding_idx: int = -1,
) -> Any:
    """``aten._embedding_bag_backward``: the gradient of the weight (dense; ``sparse=True`` is refused).

    Each index's row gets its bag's gradient, times its per-sample weight (sum) or over its bag's count
    (mean); a max sends each feature's gradient to the row of its maximum. Rows summed per index,
    divided by the index's frequency when ``scale_grad_by_freq``. ``include_last_offset`` is not passed to
    the backward: offsets then hold one entry more than there are bags (the gradient's rows).
    """
    import jax
    import jax.numpy as jnp

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
        bag, valid = _bags(indices, offsets, num_bags, padding_idx)
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


def _embedding_bag_per_sample_weights_backward(
    grad: Any, weight: Any, indices: Any, offsets: Any, offset2bag: Any, mode: int, padding_idx: int = -1,
) -> Any:
    """``aten._embedding_bag_per_sample_weights_backward``: each index's row dotted with its bag's gradient."""
    import jax.numpy as jnp

    num_bags = grad.shape[0]
    bag, valid = _bags(indices, offsets, num_bags, padding_idx)
    f32 = jnp.float32
    dots = jnp.sum(grad.astype(f32)[jnp.minimum(bag, num_bags - 1)] * weight[indices].astype(f32), axis=-1)
    return jnp.where(valid, dots, 0.0).astype(grad.dtype)


_LSTM = 2  # mkldnn_rnn_layer's mode for an LSTM (ideep's rnn_kind)


def _mkldnn_rnn_layer(
    input: Any, w_ih: Any, w_hh: Any, b_ih: Any, b_hh: Any, hx: Any, cx: Any, reverse: bool, batch_sizes: Any,
    mode: int, hidden_size: int, num_layers: int, has_biases: bool, bidirectional: bool, batch_first: bool,
    train: bool,
) -> tuple[Any, Any, Any, Any]:
    """``aten.mkldnn_rnn_layer``: one direction of one LSTM layer, ``(output, h, c, workspace)``.

    torch's LSTM decomposition calls this oneDNN kernel on CPU when the layer's input needs no gradient
    (otherwise it unrolls the time steps itself). Lowered as a ``lax.scan`` over time: the input projection for all
    steps at once, then per step ``gates = x W_ih^T + b_ih + h W_hh^T + b_hh`` split as (i, f, g, o),
    ``c = sigmoid(f) c + sigmoid(i) tanh(g)``, ``h = sigmoid(o) tanh(c)``, in the input's dtype.
    """
    import jax
    import jax.numpy as jnp

    if mode != _LSTM or batch_sizes:
        raise ValueError(f"mkldnn_rnn_layer mode={mode} with batch_sizes={list(batch_sizes)}: only a padded LSTM "
                         "lowers (mode 2, no PackedSequence); pad the sequences instead of packing them")
    x = jnp.swapaxes(input, 0, 1) if batch_first else input  # (time, batch, features)
    projected = jnp.einsum("tbi,gi->tbg", x, w_ih)
    if has_biases:
        projected = projected + b_ih + b_hh

    def step(carry: tuple[Any, Any], xw: Any) -> tuple[tuple[Any, Any], Any]:
        h, c = carry
        i, f, g, o = jnp.split(xw + h @ w_hh.T, 4, axis=-1)
        c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
        h = jax.nn.sigmoid(o) * jnp.tanh(c)
        return (h, c), h

    (h, c), out = jax.lax.scan(step, (hx[0], cx[0]), projected, reverse=reverse)
    out = jnp.swapaxes(out, 0, 1) if batch_first else out
    return out, h[None], c[None], jnp.zeros((0,), jnp.uint8)


def _storage_order(layout: torch.Tensor) -> tuple[list[int], int]:
    """The dims of ``layout`` (a tensor's meta value) from outermost to innermost in memory, and its storage offset.

    An input whose elements do not fill one dense block of memory (overlapping, or with gaps) has no
    storage an array can stand for: refused.
    """
    order = sorted(range(layout.ndim), key=lambda d: (-layout.stride(d), d))
    expected = 1
    for d in reversed(order):
        if layout.shape[d] != 1 and layout.stride(d) != expected:
            raise ValueError(f"as_strided of a tensor with sizes {tuple(layout.shape)} and strides {layout.stride()} "
                             "that does not fill one dense block of memory; call .contiguous() before as_strided")
        expected *= layout.shape[d]
    return order, layout.storage_offset()


def _strided_positions(numel: int, base_offset: int, size: Any, stride: Any, storage_offset: int | None) -> Any:
    """The memory positions (relative to the input's first element) an as_strided view reads, as a constant index
    array shaped ``size``; positions outside the input are refused (eager would read a larger base tensor)."""
    import numpy as np

    offset = base_offset if storage_offset is None else storage_offset
    positions = np.full(tuple(size), offset - base_offset, dtype=np.int64)
    for dim, (n, step) in enumerate(zip(size, stride)):
        shape = [1] * len(size)
        shape[dim] = n
        positions = positions + np.arange(n).reshape(shape) * step
    if positions.size and (positions.min() < 0 or positions.max() >= numel):
        raise ValueError(f"as_strided(size={list(size)}, stride={list(stride)}, storage_offset={storage_offset}) "
                         "reads memory outside its input tensor; apply it to the tensor that owns that memory")
    return positions.astype(np.int32)


def as_strided(x: Any, layout: torch.Tensor, size: Any, stride: Any, storage_offset: int | None = None) -> Any:
    """``aten.as_strided``: ``size``/``stride`` index the input's *memory*, which is the array's order only when the
    input is contiguous (torchax assumes it is). ``layout`` is the input's meta value (its strides as eager has
    them): the array is laid out in that memory order first (Longformer chunks a transposed tensor this way)."""
    import jax.numpy as jnp

    order, base = _storage_order(layout)
    memory = jnp.transpose(x, order).reshape(-1)
    return memory[_strided_positions(memory.shape[0], base, size, stride, storage_offset)]


def as_strided_scatter(x: Any, src: Any, layout: torch.Tensor, size: Any, stride: Any,
                       storage_offset: int | None = None) -> Any:
    """``aten.as_strided_scatter``: ``x`` with the elements :func:`as_strided` would read replaced by ``src``."""
    import jax.numpy as jnp

    order, base = _storage_order(layout)
    memory = jnp.transpose(x, order)
    flat = memory.reshape(-1)
    flat = flat.at[_strided_positions(flat.shape[0], base, size, stride, storage_offset)].set(src.astype(x.dtype))
    inverse = sorted(range(len(order)), key=lambda d: order[d])
    return jnp.transpose(flat.reshape(memory.shape), inverse)


#: ops whose lowering needs the layout (meta value) of their first input: op -> lowering(x, *rest, layout=...)
BY_LAYOUT: dict[Any, Callable[..., Any]] = {
    aten.as_strided.default: lambda x, *rest, layout, **kw: as_strided(x, layout, *rest, **kw),
    aten.as_strided_copy.default: lambda x, *rest, layout, **kw: as_strided(x, layout, *rest, **kw),
    aten.as_strided_scatter.default: lambda x, src, *rest, layout, **kw: as_strided_scatter(x, src, layout, *rest, **kw),
}


def _mkldnn_rnn_layer_backward(
    input: Any, w_ih: Any, w_hh: Any, b_ih: Any, b_hh: Any, hx: Any, cx: Any, output: Any, hy: Any, cy: Any,
    grad_output: Any, grad_hy: Any, grad_cy: Any, reverse: bool, mode: int, hidden_size: int, num_layers: int,
    has_biases: bool, train: bool, bidirectional: bool, batch_sizes: Any, batch_first: bool, workspace: Any,
) -> tuple[Any, ...]:
    """``aten.mkldnn_rnn_layer_backward``: the gradients of input, the four weights, h0 and c0, as the vjp of the
    layer's lowering above (a missing output gradient is zero)."""
    import jax
    import jax.numpy as jnp

    def layer(x: Any, w0: Any, w1: Any, w2: Any, w3: Any, h: Any, c: Any) -> tuple[Any, Any, Any]:
        out, h_n, c_n, _ = _mkldnn_rnn_layer(x, w0, w1, w2, w3, h, c, reverse, batch_sizes, mode, hidden_size,
                                             num_layers, has_biases, bidirectional, batch_first, train)
        return out, h_n, c_n

    primals = (input, w_ih, w_hh, b_ih, b_hh, hx, cx)
    outs, pull = jax.vjp(layer, *primals)
    cotangents = tuple(jnp.zeros_like(o) if g is None else g.astype(o.dtype)
                       for o, g in zip(outs, (grad_output, grad_hy, grad_cy)))
    return pull(cotangents)


def _triangle(x: Any) -> Any:
    import numpy as np

    return np.maximum(0.0, 1.0 - np.abs(x))


def _cubic(x: Any, a: float = -0.5) -> Any:
    import numpy as np

    x = np.abs(x)
    near = ((a + 2) * x - (a + 3)) * x * x + 1
    far = (((x - 5) * x + 8) * x - 4) * a
    return np.where(x < 1, near, np.where(x < 2, far, 0.0))


def _antialias_weights(in_size: int, out_size: int, align_corners: bool, scale: float | None,
                       kernel: Callable[[Any], Any], support: float) -> Any:
    """The ``(out_size, in_size)`` matrix of an antialiased resize along one axis, as torch's CPU kernel builds it:
    the filter stretched by the downscale factor, each output's taps normalised to sum to one."""
    import numpy as np

    if align_corners:
        ratio = (in_size - 1) / (out_size - 1) if out_size > 1 else 0.0
    else:
        ratio = 1.0 / scale if scale else in_size / out_size
    reach = support * ratio if ratio >= 1.0 else support
    invscale = 1.0 / ratio if ratio >= 1.0 else 1.0
    weights = np.zeros((out_size, in_size))
    for i in range(out_size):
        center = ratio * (i + 0.5)
        lo, hi = max(int(center - reach + 0.5), 0), min(int(center + reach + 0.5), in_size)
        taps = kernel((np.arange(lo, hi) - center + 0.5) * invscale)
        if taps.sum() != 0:
            weights[i, lo:hi] = taps / taps.sum()
    return weights


def _upsample_aa(kernel: Callable[[Any], Any], support: float) -> Callable[..., Any]:
    """The lowering of ``aten._upsample_{bilinear,bicubic}2d_aa`` (torchax's fails to trace): a separable resize with
    constant weight matrices, ``W_h @ x @ W_w^T`` per image and channel."""
    def lowering(x: Any, output_size: Any, align_corners: bool, scales_h: float | None = None,
                 scales_w: float | None = None) -> Any:
        import jax.numpy as jnp

        (out_h, out_w), (in_h, in_w) = output_size, x.shape[-2:]
        rows = _antialias_weights(in_h, out_h, align_corners, scales_h, kernel, support)
        cols = _antialias_weights(in_w, out_w, align_corners, scales_w, kernel, support)
        f32 = jnp.float32
        out = jnp.einsum("oh,...hw,pw->...op", jnp.asarray(rows, f32), x.astype(f32), jnp.asarray(cols, f32),
                         precision="highest")
        return out.astype(x.dtype)

    return lowering


def _rrelu_with_noise(x: Any, noise: Any, lower: float = 0.125, upper: float = 1 / 3, training: bool = False,
                      generator: Any = None) -> tuple[Any, Any]:
    """``aten.rrelu_with_noise_functional`` in eval mode: a leaky ReLU with the mean slope; the noise unchanged."""
    import jax.numpy as jnp

    if training:
        raise ValueError("F.rrelu in training mode draws a random slope per element: Neuron graphs lower it in "
                         "eval mode only (model.eval(), or F.rrelu(..., training=False))")
    return jnp.where(x >= 0, x, x * ((lower + upper) / 2)).astype(x.dtype), noise


def _upsample_aa_backward(kernel: Callable[[Any], Any], support: float) -> Callable[..., Any]:
    """The lowering of ``aten._upsample_{bilinear,bicubic}2d_aa_backward``: the forward's weights transposed."""
    def lowering(grad_output: Any, output_size: Any, input_size: Any, align_corners: bool,
                 scales_h: float | None = None, scales_w: float | None = None) -> Any:
        import jax.numpy as jnp

        (out_h, out_w), (in_h, in_w) = output_size, input_size[-2:]
        rows = _antialias_weights(in_h, out_h, align_corners, scales_h, kernel, support)
        cols = _antialias_weights(in_w, out_w, align_corners, scales_w, kernel, support)
        f32 = jnp.float32
        grad = jnp.einsum("oh,...op,pw->...hw", jnp.asarray(rows, f32), grad_output.astype(f32),
                          jnp.asarray(cols, f32), precision="highest")
        return grad.astype(grad_output.dtype)

    return lowering


def _adaptive_windows(in_sizes: Any, out_sizes: Any) -> tuple[Any, Any]:
    """Adaptive pooling's windows as constants: for each output position the flat input positions of its window
    (padded to the largest window) and which of them are real. Window ``i`` of an axis spans
    ``[floor(i * in / out), ceil((i + 1) * in / out))``."""
    import numpy as np

    axes = []
    for n_in, n_out in zip(in_sizes, out_sizes):
        starts = np.array([(i * n_in) // n_out for i in range(n_out)])
        ends = np.array([-((-(i + 1) * n_in) // n_out) for i in range(n_out)])
        taps = np.arange(int((ends - starts).max()))
        axes.append((np.minimum(starts[:, None] + taps, n_in - 1), starts[:, None] + taps < ends[:, None]))
    strides = np.cumprod([1, *in_sizes[::-1]])[:-1][::-1]
    positions, real = np.zeros([1] * (2 * len(axes)), np.int64), np.ones([1] * (2 * len(axes)), bool)
    for k, ((index, valid), stride) in enumerate(zip(axes, strides)):
        shape = [1] * (2 * len(axes))
        shape[k], shape[len(axes) + k] = index.shape
        positions = positions + index.reshape(shape) * stride
        real = real & valid.reshape(shape)
    flat = (*out_sizes, -1)
    return np.broadcast_to(positions, np.broadcast_shapes(positions.shape, real.shape)).reshape(flat), \
        np.broadcast_to(real, np.broadcast_shapes(positions.shape, real.shape)).reshape(flat)


def _adaptive_max_pool(x: Any, output_size: Any) -> tuple[Any, Any]:
    """``aten.adaptive_max_pool{2,3}d``: ``(output, indices)``, each index the flat position of its window's first
    maximum in the input plane, as torch's kernel (torchax has no lowering)."""
    import jax.numpy as jnp

    spatial = len(output_size)
    positions, real = _adaptive_windows(x.shape[-spatial:], list(output_size))
    windows = jnp.where(real, x.reshape(*x.shape[:-spatial], -1)[..., positions], -jnp.inf)
    first = jnp.argmax(windows, axis=-1)[..., None]
    out = jnp.take_along_axis(windows, first, axis=-1)[..., 0]
    indices = jnp.take_along_axis(jnp.broadcast_to(jnp.asarray(positions, jnp.int32), windows.shape), first, axis=-1)
    return out.astype(x.dtype), indices[..., 0]


def _adaptive_max_pool_backward(spatial: int) -> Callable[..., Any]:
    """``aten.adaptive_max_pool{2,3}d_backward``: each output's gradient added at its maximum's position."""
    def lowering(grad_output: Any, x: Any, indices: Any) -> Any:
        return _scatter_into_planes(grad_output, indices, x.shape, spatial, add=True)

    return lowering


def _scatter_into_planes(values: Any, indices: Any, shape: Any, spatial: int, add: bool) -> Any:
    """Zeros shaped ``shape`` with ``values`` put (or added) at the flat positions ``indices`` within their planes
    (the last ``spatial`` dims)."""
    import jax.numpy as jnp

    lead = tuple(shape[:-spatial])
    flat_values = values.reshape(*lead, -1)
    flat_indices = indices.reshape(flat_values.shape).astype(jnp.int32)
    out = jnp.zeros((*lead, math.prod(shape[-spatial:])), values.dtype)
    at = out.at[(*jnp.indices(flat_values.shape)[:-1], flat_indices)]
    return (at.add(flat_values) if add else at.set(flat_values)).reshape(shape)


def _max_unpool(x: Any, indices: Any, output_size: Any, stride: Any = None, padding: Any = None) -> Any:
    """``aten.max_unpool{2,3}d``: zeros of the output size with each value at its index (torchax reads the
    indices into numpy)."""
    spatial = len(output_size)
    return _scatter_into_planes(x, indices, (*x.shape[:-spatial], *output_size), spatial, add=False)

def _is_all_true(x: Any) -> Any:
    """``aten._is_all_true`` (``torch._check_tensor_all``'s condition; transformers checks image-token counts so)."""
    import jax.numpy as jnp

    return jnp.all(x)


def _is_any_true(x: Any) -> Any:
    import jax.numpy as jnp

    return jnp.any(x)


#: qualified op name (``namespace::name`` or ``namespace::name.overload``) -> jax lowering
LOWERINGS: dict[str, Callable[..., Any]] = {
    "aten::_scaled_dot_product_flash_attention_for_cpu": _sdpa_flash_for_cpu,
    "aten::_scaled_dot_product_flash_attention_for_cpu_backward": _sdpa_flash_for_cpu_backward,
    "aten::addmm": _addmm,
    "aten::_embedding_bag": _embedding_bag,
    "aten::_embedding_bag_forward_only": functools.partial(_embedding_bag, forward_only=True),
    "aten::_embedding_bag_backward": _embedding_bag_backward,
    "aten::_embedding_bag_per_sample_weights_backward": _embedding_bag_per_sample_weights_backward,
    "aten::convolution_backward": _convolution_backward,
    "aten::mkldnn_rnn_layer": _mkldnn_rnn_layer,
    "aten::_upsample_bilinear2d_aa": _upsample_aa(_triangle, 1.0),
    "aten::_upsample_bicubic2d_aa": _upsample_aa(_cubic, 2.0),
    "aten::_upsample_bilinear2d_aa_backward": _upsample_aa_backward(_triangle, 1.0),
    "aten::_upsample_bicubic2d_aa_backward": _upsample_aa_backward(_cubic, 2.0),
    "aten::rrelu_with_noise_functional": _rrelu_with_noise,
    "aten::_is_all_true": _is_all_true,
    "aten::_is_any_true": _is_any_true,
    "aten::adaptive_max_pool2d": _adaptive_max_pool,
    "aten::adaptive_max_pool3d": _adaptive_max_pool,
    "aten::adaptive_max_pool2d_backward": _adaptive_max_pool_backward(2),
    "aten::adaptive_max_pool3d_backward": _adaptive_max_pool_backward(3),
    "aten::max_unpool2d": _max_unpool,
    "aten::max_unpool3d": _max_unpool,
    "aten::mkldnn_rnn_layer_backward": _mkldnn_rnn_layer_backward,
    # backward ops torchax has no lowering for: the vjp of their forward op
    "aten::avg_pool2d_backward": _backward_of(aten.avg_pool2d.default, 1),
    "aten::avg_pool3d_backward": _backward_of(aten.avg_pool3d.default, 1),
    "aten::_adaptive_avg_pool2d_backward": _adaptive_avg_pool_backward(aten._adaptive_avg_pool2d.default, 2),
    "aten::_adaptive_avg_pool3d_backward": _adaptive_avg_pool_backward(aten._adaptive_avg_pool3d.default, 3),
    "aten::replication_pad1d_backward": _backward_of(aten.replication_pad1d.default, 1),
    "aten::replication_pad2d_backward": _backward_of(aten.replication_pad2d.default, 1),
    "aten::replication_pad3d_backward": _backward_of(aten.replication_pad3d.default, 1),
    "aten::grid_sampler_2d_backward": _backward_of(aten.grid_sampler_2d.default, 2, masked=True),
    "aten::grid_sampler_3d_backward": _backward_of(aten.grid_sampler_3d.default, 2, masked=True),
    "aten::_weight_norm_interface_backward": _weight_norm_backward,
    "transformers::grouped_mm_fallback": _grouped_mm,
    "transformers::grouped_mm_fallback_backward": _grouped_mm_backward,
}

_installed: list[Any] = []  # lowering environments created so far (one per process)


def register_lowering(op_name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator: lower op ``op_name`` (e.g. ``"mylib::fused_rope"``) with a jax function.

    The function receives jax arrays where the op receives tensors (other arguments unchanged)
    and returns jax arrays shaped as the op's outputs. Use it for a custom op of your own whose
    graph node does not lower.
    """
    if "::" not in op_name:
        raise ValueError(f"op name {op_name!r} must be qualified, e.g. 'mylib::my_op' or 'aten::addmm'")

    def register(fn: Callable[..., Any]) -> Callable[..., Any]:
        LOWERINGS[op_name] = fn
        for env in _installed:
            _install_one(env, op_name, fn)
        return fn

    return register


def lowering_for(target: Any) -> Callable[..., Any] | None:
    """The registered lowering of FX target ``target`` (an ``OpOverload``), or None."""
    schema = getattr(target, "_schema", None)
    if schema is None:
        return None
    name = schema.name  # "aten::addmm"
    overload = schema.overload_name
    return LOWERINGS.get(f"{name}.{overload}" if overload else name) or LOWERINGS.get(name)


#: Ops whose CPU kernels compute half-precision inputs in float32 and round once at the end. Lowered
#: the same way (inputs up, outputs down to torch's dtype) instead of rounding every intermediate
#: HLO op to bfloat16. Matmuls and convolutions are left alone: their HLO stays in the model's dtype
#: for the Neuron compiler.
FLOAT32_INSIDE: frozenset[Any] = frozenset({
    aten.native_layer_norm.default,
    aten._softmax.default,
    aten._log_softmax.default,
    aten.gelu.default,
    aten.silu.default,
    aten.native_group_norm.default,
})

_HALF = (torch.bfloat16, torch.float16)


def in_float32(op: Any, args: Any, kwargs: Any, result: Any) -> Any:
    """Run ``op`` on torchax tensors with half inputs upcast; cast outputs to ``result``'s dtypes."""
    from torch.utils._pytree import tree_map

    def up(x: Any) -> Any:
        return x.to(torch.float32) if isinstance(x, torch.Tensor) and x.dtype in _HALF else x

    out = op(*tree_map(up, args), **tree_map(up, kwargs))
    if isinstance(out, (tuple, list)):
        return type(out)(o.to(r.dtype) if isinstance(r, torch.Tensor) else o for o, r in zip(out, result))
    return out.to(result.dtype) if isinstance(result, torch.Tensor) else out


#: ops torchax lowers wrongly, computed with torch's own decomposition instead: torchax's
#: ``native_layer_norm_backward`` calls a jax function that does not exist, its
#: ``max_pool2d_with_indices_backward`` adds each gradient to a whole window instead of its argmax
TORCH_DECOMPOSED: tuple[Any, ...] = (aten.native_layer_norm_backward, aten.max_pool2d_with_indices_backward)


def install(env: Any) -> None:
    """Put :data:`LOWERINGS` in a torchax environment, so decompositions use them too, and route
    :data:`TORCH_DECOMPOSED` to torch's decompositions."""
    from torch._decomp import decomposition_table
    from torchax.ops.ops_registry import Operator

    _installed.append(env)
    for packet in TORCH_DECOMPOSED:
        env._ops.pop(packet, None)
        for name in packet.overloads():
            op = getattr(packet, name)
            env._ops.pop(op, None)
            if op in decomposition_table:
                env._decomps[op] = Operator(op, decomposition_table[op], is_jax_function=False,
                                            is_user_defined=False, needs_env=False, is_view_op=False)
    for name, fn in LOWERINGS.items():
        _install_one(env, name, fn)


def _install_one(env: Any, op_name: str, fn: Callable[..., Any]) -> None:
    from torchax.ops.ops_registry import Operator

    namespace, _, rest = op_name.partition("::")
    name, _, overload = rest.partition(".")
    packet = getattr(getattr(torch.ops, namespace, None), name, None)
    op = getattr(packet, overload or "default", None) if packet is not None else None
    if op is not None:  # an op not registered yet is found by name at call time (lowering_for)
        env._ops[op] = Operator(op, fn, is_jax_function=True, is_user_defined=True, needs_env=False,
                                is_view_op=False)
