"""The registry of jax lowerings (the op's signature, jax arrays for tensors) by qualified op name, for ops torchax
lowers wrong or not at all: they take precedence over torchax's table, in the graph and inside decompositions."""
from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._pytree import tree_map

from neuron_args.lazy_modules import jax, jnp
from neuron_args.lowering import (
    attention, distributions, elementwise, embedding_bag, gradients, hashing, histograms, indexing, linalg,
    linear_cross_entropy, matmul, norms, pooling, recurrent, resampling, segments, special, strided, torchax_compat)

aten = torch.ops.aten


def _rrelu_with_noise(x: Any, noise: Any, lower: float = 0.125, upper: float = 1 / 3, training: bool = False,
                      generator: Any = None) -> tuple[Any, Any]:
    """``aten.rrelu_with_noise_functional`` in eval mode: a leaky ReLU with the mean slope; the noise unchanged."""
    if training:
        raise ValueError("F.rrelu in training mode draws a random slope per element: Neuron graphs lower it in "
                         "eval mode only (model.eval(), or F.rrelu(..., training=False))")
    return jnp.where(x >= 0, x, x * ((lower + upper) / 2)).astype(x.dtype), noise


#: qualified op name (``namespace::name`` or ``namespace::name.overload``) -> jax lowering
LOWERINGS: dict[str, Callable[..., Any]] = {
    "aten::_scaled_dot_product_flash_attention_for_cpu": attention.sdpa_flash_for_cpu,
    "aten::_scaled_dot_product_flash_attention_for_cpu_backward": attention.sdpa_flash_for_cpu_backward,
    "aten::addmm": matmul.addmm,
    "aten::addbmm": matmul.addbmm,
    "aten::_embedding_bag": embedding_bag.embedding_bag,
    "aten::_embedding_bag_forward_only": functools.partial(embedding_bag.embedding_bag, forward_only=True),
    "aten::_embedding_bag_backward": embedding_bag.embedding_bag_backward,
    "aten::_embedding_bag_per_sample_weights_backward": embedding_bag.embedding_bag_per_sample_weights_backward,
    "aten::convolution_backward": gradients.convolution_backward,
    "aten::mkldnn_rnn_layer": recurrent.mkldnn_rnn_layer,
    "aten::_upsample_bilinear2d_aa": resampling.upsample_aa(resampling.triangle, 1.0),
    "aten::_upsample_bicubic2d_aa": resampling.upsample_aa(resampling.cubic, 2.0),
    "aten::_upsample_bilinear2d_aa_backward": resampling.upsample_aa_backward(resampling.triangle, 1.0),
    "aten::_upsample_bicubic2d_aa_backward": resampling.upsample_aa_backward(resampling.cubic, 2.0),
    "aten::rrelu_with_noise_functional": _rrelu_with_noise,
    "aten::_is_all_true": lambda x: jnp.all(x),  # torch._check_tensor_all's condition
    "aten::_is_any_true": lambda x: jnp.any(x),
    # the 2d and 3d ops (1d too for padding); the backward ops torchax has no lowering for: the vjp of their forward op
    **{name: fn for n in (2, 3) for name, fn in (
        (f"aten::adaptive_max_pool{n}d", pooling.adaptive_max_pool),
        (f"aten::adaptive_max_pool{n}d_backward",
         gradients.adaptive_pool_backward(getattr(aten, f"adaptive_max_pool{n}d").default, n)),
        (f"aten::max_unpool{n}d", pooling.max_unpool),
        (f"aten::fractional_max_pool{n}d", getattr(pooling, f"fractional_max_pool{n}d")),
        (f"aten::avg_pool{n}d_backward", gradients.backward_of(getattr(aten, f"avg_pool{n}d").default, 1)),
        (f"aten::_adaptive_avg_pool{n}d_backward",
         gradients.adaptive_pool_backward(getattr(aten, f"_adaptive_avg_pool{n}d").default, n)),
        (f"aten::grid_sampler_{n}d_backward",
         gradients.backward_of(getattr(aten, f"grid_sampler_{n}d").default, 2, masked=True)),
    )},
    **{f"aten::replication_pad{n}d_backward": gradients.backward_of(getattr(aten, f"replication_pad{n}d").default, 1)
       for n in (1, 2, 3)},
    "aten::mkldnn_rnn_layer_backward": recurrent.mkldnn_rnn_layer_backward,
    "aten::_weight_norm_interface_backward": gradients.weight_norm_backward,
    "aten::linalg_lu_factor_ex": linalg.lu_factor_ex,
    "aten::linalg_lu": linalg.lu,
    "aten::lu_unpack": linalg.lu_unpack,
    "aten::linalg_inv_ex": linalg.inv_ex,
    "aten::_linalg_solve_ex": linalg.solve_ex,
    "aten::linalg_cholesky_ex": linalg.cholesky_ex,
    "aten::cholesky_solve": linalg.cholesky_solve,
    "aten::linalg_pinv": linalg.pinv,
    "aten::_linalg_eigh": linalg.eigh,
    "aten::linalg_ldl_solve": linalg.ldl_solve,
    "aten::hash_tensor": hashing.hash_tensor,
    # QR in LAPACK's Householder form, XLA:CPU's LAPACK calls (geqrf's entry point is not public in jax 0.10)
    "aten::geqrf": lambda a: jax._src.lax.linalg.geqrf(a),
    "aten::ormqr": lambda a, tau, other, left=True, transpose=False: jax.lax.linalg.ormqr(
        a, tau, other, left=left, transpose=transpose),  # jax takes left and transpose by keyword only
    "aten::segment_reduce": segments.segment_reduce,
    "aten::histogram.bin_ct": histograms.histogram_bin_ct,
    "aten::histogram.bins_tensor": histograms.histogram_bins_tensor,
    "aten::_histogramdd_bin_edges": histograms.histogramdd_bin_edges,
    "aten::_histogramdd_from_bin_cts": histograms.histogramdd_from_bin_cts,
    "aten::_histogramdd_from_bin_tensors": histograms.histogramdd_from_bin_tensors,
    "aten::searchsorted": indexing.searchsorted,
    "aten::index_reduce": indexing.index_reduce,
    "aten::nonzero_static": indexing.nonzero_static,
    "aten::embedding_renorm": norms.embedding_renorm,
    "aten::renorm": norms.renorm,
    "aten::repeat_interleave.Tensor": indexing.repeat_interleave_indices,
    "aten::normal_functional": distributions.normal,
    "aten::normal.float_float": distributions.normal_of_size,
    "aten::exponential": distributions.exponential,
    "aten::cauchy": distributions.cauchy,
    "aten::log_normal": distributions.log_normal,
    "aten::angle": elementwise.angle,
    "aten::special_spherical_bessel_j0": elementwise.spherical_bessel_j0,
    "prims::convert_element_type": elementwise.convert_element_type,
    "aten::polygamma": special.polygamma,
    "aten::digamma": functools.partial(special.polygamma, 0),  # in x's dtype (torchax's: float32 for all)
    **{f"aten::special_{name}": fn for name, fn in special.ORTHOGONAL.items()},
    "aten::special_airy_ai": special.airy_ai,
    "aten::special_scaled_modified_bessel_k0": functools.partial(special.scaled_modified_bessel_k, order=0),
    "aten::special_scaled_modified_bessel_k1": functools.partial(special.scaled_modified_bessel_k, order=1),
    "torch_nn::_linear_cross_entropy_batch_chunked": linear_cross_entropy.batch_chunked,
    "torch_nn::_linear_cross_entropy_batch_chunked_no_reduction": linear_cross_entropy.batch_chunked_no_reduction,
    "transformers::grouped_mm_fallback": matmul.grouped_mm,
    "transformers::grouped_mm_fallback_backward": matmul.grouped_mm_backward,
}


#: ops whose lowering needs the layout (meta value) of their first input: op -> lowering(x, *rest, layout=...)
BY_LAYOUT: dict[Any, Callable[..., Any]] = {
    aten.as_strided.default: strided.as_strided,  # torchax assumes a contiguous input
    aten.as_strided_copy.default: strided.as_strided,
    aten.as_strided_scatter.default: strided.as_strided_scatter,
    aten._linalg_det.default: linalg.det,  # torch factors A^T when A is contiguous
    aten._linalg_slogdet.default: linalg.slogdet,
}


def register_lowering(op_name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator: lower op ``op_name`` (e.g. ``"mylib::fused_rope"``) with a jax function taking jax arrays where
    the op takes tensors and returning arrays shaped as the op's outputs."""
    if "::" not in op_name:
        raise ValueError(f"op name {op_name!r} must be qualified, e.g. 'mylib::my_op' or 'aten::addmm'")

    def register(fn: Callable[..., Any]) -> Callable[..., Any]:
        LOWERINGS[op_name] = fn
        for env in torchax_compat.INSTALLED:
            _install_one(env, op_name, fn)
        return fn

    return register


def lowering_for(target: Any, node: torch.fx.Node) -> Callable[..., Any] | None:
    """The lowering of ``node`` calling ``target`` (None: none): registered, or given its input's layout (BY_LAYOUT)."""
    if target in BY_LAYOUT:  # the input's memory layout, as eager has it, decides the result
        return functools.partial(BY_LAYOUT[target], layout=node.args[0].meta["val"])
    schema = getattr(target, "_schema", None)  # name "aten::addmm", overload_name "" for the default
    if schema is None:
        return None
    return LOWERINGS.get(f"{schema.name}.{schema.overload_name}") or LOWERINGS.get(schema.name)


#: Ops whose CPU kernels compute half-precision inputs in float32 and round once at the end, lowered so
#: (matmuls and convolutions stay in the model's dtype for the Neuron compiler).
FLOAT32_INSIDE: frozenset[Any] = frozenset({
    aten.native_layer_norm.default,
    aten._softmax.default,
    aten._log_softmax.default,
    aten.gelu.default,
    aten.silu.default,
    aten.native_group_norm.default,
})


def in_float32(op: Any, args: Any, kwargs: Any, result: Any) -> Any:
    """Run ``op`` on torchax tensors with half inputs upcast; cast outputs to ``result``'s dtypes."""
    def up(x: Any) -> Any:
        return x.to(torch.float32) if isinstance(x, torch.Tensor) and x.dtype in (torch.bfloat16, torch.float16) else x

    out = op(*tree_map(up, args), **tree_map(up, kwargs))
    if isinstance(out, (tuple, list)):
        return type(out)(o.to(r.dtype) if isinstance(r, torch.Tensor) else o for o, r in zip(out, result))
    return out.to(result.dtype) if isinstance(result, torch.Tensor) else out


#: ops torchax lowers wrongly (layer norm's backward calls a jax function that does not exist, max pool's adds
#: each gradient to a whole window) or not at all, computed with torch's own decomposition instead
TORCH_DECOMPOSED: tuple[Any, ...] = (aten.native_layer_norm_backward, aten.max_pool2d_with_indices_backward,
                                     aten._batch_norm_with_update_functional, aten.ldexp)


def install(env: Any) -> None:
    """Put :data:`LOWERINGS` in a torchax environment, so decompositions use them too, and route
    :data:`TORCH_DECOMPOSED` to torch's decompositions."""
    from torch._decomp import decomposition_table
    from torchax.ops.ops_registry import Operator

    torchax_compat.INSTALLED.append(env)
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
