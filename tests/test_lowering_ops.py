"""Lowerings of the ops real models produce, each compiled on XLA:CPU in-process and compared with eager."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch._dynamo.backends.common import aot_autograd
from torch._dynamo.exc import BackendCompilerFailed

from neuron_args import scoped_compiler_args
from neuron_args.errors import LoweringError
from neuron_args.lowering import register_lowering
from neuron_args.lowering.hlo import lower_fx_graph
from tests.xla_run import executable_runner


class Lowered:
    """A torch.compile backend lowering each forward graph and running it on XLA:CPU (as the local compiler)."""

    def __init__(self) -> None:
        self.errors: list[BaseException] = []
        self.hlo: list[str] = []

    def fw_compiler(self, gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        try:
            lowered = lower_fx_graph(gm, example_inputs)
        except LoweringError as e:
            self.errors.append(e)
            raise
        self.hlo.append(lowered.hlo_text)
        return executable_runner(lowered)

    def __call__(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        torch._dynamo.reset()
        return torch.compile(fn, backend=aot_autograd(fw_compiler=self.fw_compiler), fullgraph=True, dynamic=False)


def compare(fn: Callable[..., Any], *args: torch.Tensor, grad: bool = False, **tol: float) -> Any:
    ctx = torch.enable_grad() if grad else torch.inference_mode()
    with ctx:
        got, want = Lowered()(fn)(*args), fn(*args)
    torch.testing.assert_close(got, want, **(tol or {"atol": 1e-5, "rtol": 1e-5}))
    return got


def randn(*shape: int, dtype: torch.dtype = torch.float32, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


# -- ops whose decomposition reads a tensor's device (torchax tensors must name a device torch parses)


def test_tril_new_ones_and_cpu_sdpa_lower():
    x, q = randn(5, 5), randn(1, 2, 6, 8)
    compare(lambda x: torch.tril(x) + x.new_ones(5, 5), x)
    compare(lambda q: F.scaled_dot_product_attention(q, q, q, is_causal=True), q)


# -- SDPA's CPU kernel: the forward a gradient-enabled graph saves (output and log-sum-exp)


@pytest.mark.parametrize("masked", ["causal", "float mask with a fully masked row"])
def test_sdpa_for_cpu_returns_output_and_logsumexp_like_the_kernel(masked):
    q, k, v = randn(2, 4, 6, 8, seed=1), randn(2, 4, 6, 8, seed=2), randn(2, 4, 6, 8, seed=3)
    op = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
    if masked == "causal":
        out, lse = compare(lambda q, k, v: op(q, k, v, 0.0, True), q, k, v)
    else:
        mask = torch.zeros(6, 6).masked_fill(torch.tril(torch.ones(6, 6, dtype=torch.bool)).logical_not(), -torch.inf)
        mask[0] = -torch.inf
        out, lse = compare(lambda q, k, v: op(q, k, v, attn_mask=mask), q, k, v)
        assert torch.equal(out[:, :, 0], torch.zeros(2, 4, 8)) and torch.equal(lse[:, :, 0], torch.zeros(2, 4))
    assert lse.shape == (2, 4, 6) and lse.dtype == torch.float32


@pytest.mark.slow
def test_gradient_enabled_attention_layer_lowers_and_matches():
    layer = torch.nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True, norm_first=True)
    x = randn(2, 5, 32)
    got = compare(layer, x, grad=True)
    assert got.requires_grad


# -- backward ops: the vjp of the forward op as it lowers, torch's decomposition where torchax's is wrong, SDPA's flash


def _conv_pool(conv: torch.nn.Module, pool: torch.nn.Module) -> torch.nn.Module:
    return torch.nn.Sequential(conv, torch.nn.Tanh(), pool)


class GridSample(torch.nn.Module):
    """Bilinear sampling at learned points: gradients for the image and for the grid."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 1)
        self.grid = torch.nn.Parameter(torch.rand(2, 3, 5, 2, generator=torch.Generator().manual_seed(9)) * 2 - 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.grid_sample(self.conv(x), self.grid, align_corners=False)


BACKWARD_CASES = {
    "conv_transpose2d": (torch.nn.ConvTranspose2d(4, 6, 3, stride=2, padding=1, output_padding=1), (2, 4, 5, 5)),
    "grouped_conv1d_no_bias": (torch.nn.Conv1d(4, 8, 3, stride=2, padding=1, groups=2, bias=False), (2, 4, 9)),
    "max_pool2d_padded": (_conv_pool(torch.nn.Conv2d(3, 6, 1), torch.nn.MaxPool2d(3, 2, padding=1)), (2, 3, 8, 8)),
    "avg_pool2d_ceil_no_pad_count": (_conv_pool(torch.nn.Conv2d(3, 6, 1), torch.nn.AvgPool2d(
        3, 2, padding=1, ceil_mode=True, count_include_pad=False)), (2, 3, 8, 8)),
    "adaptive_avg_pool2d_uneven": (_conv_pool(torch.nn.Conv2d(3, 6, 1), torch.nn.AdaptiveAvgPool2d((3, 2))), (2, 3, 7, 7)),
    "conv3d_avg_pool3d": (_conv_pool(torch.nn.Conv3d(2, 4, 3, padding=1), torch.nn.AvgPool3d(2)), (1, 2, 4, 4, 4)),
    "layer_norm": (torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.LayerNorm(16)), (3, 8)),
    "weight_norm_conv1d": (torch.nn.utils.parametrizations.weight_norm(torch.nn.Conv1d(4, 6, 3), dim=2), (2, 4, 9)),
    "replication_pad2d": (_conv_pool(torch.nn.Conv2d(3, 6, 1), torch.nn.ReplicationPad2d((1, 2, 1, 0))), (2, 3, 5, 5)),
    "grid_sample": (GridSample(), (2, 3, 6, 6)),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(BACKWARD_CASES))
def test_backward_op_gradients_match_eager(name):
    torch.manual_seed(0)
    module, shape = BACKWARD_CASES[name]
    x = randn(*shape).requires_grad_()
    weights = randn(*module(x).shape, seed=7)
    (module(x) * weights).sum().backward()
    want = [t.grad.clone() for t in (x, *module.parameters())]
    for t in (x, *module.parameters()):
        t.grad = None
    (Lowered()(module)(x) * weights).sum().backward()
    got = [t.grad for t in (x, *module.parameters())]
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("heads, kv_heads", [(4, 4), (4, 2)])
def test_sdpa_flash_backward_matches_the_cpu_kernel(heads, kv_heads):
    """Causal, with grouped-query heads summed back onto their shared key/value head."""
    q = randn(2, heads, 6, 8, seed=1).requires_grad_()
    k, v = (randn(2, kv_heads, 6, 8, seed=s).requires_grad_() for s in (2, 3))

    def attend(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=heads != kv_heads)

    weights = randn(2, heads, 6, 8, seed=4)
    (attend(q, k, v) * weights).sum().backward()
    want = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    (Lowered()(attend)(q, k, v) * weights).sum().backward()
    for t, w in zip((q, k, v), want, strict=True):
        torch.testing.assert_close(t.grad, w, atol=1e-5, rtol=1e-4)


# -- half precision: ops torch computes in float32 and rounds once are lowered the same way


@pytest.mark.parametrize("name, fn", [
    ("layer_norm", lambda x, w: F.layer_norm(x, (64,), w, w)),
    ("softmax", lambda x, w: torch.softmax(x * 3, -1)),
    ("silu", lambda x, w: F.silu(x * 3)),
    ("linear", lambda x, w: F.linear(x * 3, w.expand(64, 64), w)),
])
def test_bfloat16_ops_round_once_like_eager(name, fn):
    x, w = randn(2, 7, 64, dtype=torch.bfloat16), randn(64, dtype=torch.bfloat16, seed=5)
    compare(fn, x, w, atol=0.0, rtol=0.0)  # bit-exact


def test_convolution_with_valid_padding_string():
    conv = torch.nn.Conv2d(3, 8, 4, stride=4, padding="valid")
    compare(conv, randn(2, 3, 16, 16))


def test_values_keep_the_dtype_torch_traced():
    """``torch.full(size, 0)`` is int64 to torch, float32 to torchax: indexing an embedding with it (Idefics3's patch
    positions) must see integers."""
    table = randn(10, 3)
    compare(lambda x, t: F.embedding(torch.where(x > 0, torch.arange(4) + 2, torch.full((4,), 0)), t) * 2,
            randn(4), table)


def test_a_size_from_tensor_values_names_the_op_and_the_fix():
    """Boolean-mask indexing (Idefics3 drops its padding images so) makes a size Dynamo cannot know, whatever
    ``dynamic=`` says: the error names the op, the user's line and the fix, not ``dynamic=False``."""
    backend = Lowered()
    with torch.inference_mode(), torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True):
        with pytest.raises(BackendCompilerFailed):
            backend(lambda x: x[x > 0] * 2)(randn(8))  # returned
        with pytest.raises(BackendCompilerFailed):
            backend(lambda x: (x[x > 0] * 2).sum())(randn(8))  # inside the graph (XModel picks its adapters so)
    returned, inside = map(str, backend.errors)
    assert "depends on tensor values (op aten.index.Tensor" in returned and "lambda x: x[x > 0] * 2" in returned
    assert "torch.where instead of boolean indexing" in returned and "dynamic=False" not in returned
    assert "cannot lower op aten.index.Tensor" in inside and "its output size depends on tensor values" in inside


def test_assert_async_is_left_out_as_a_runtime_check():
    """``torch._assert_async`` (DBRX checks its expert indices so) is a runtime check of values: an executable cannot
    raise, so it is left out like ``torch._check_tensor_all``."""
    def checked(x):
        torch._assert_async((x.abs() < 100).all(), "too large")
        return x * 2

    backend = Lowered()
    with torch.inference_mode():
        torch.testing.assert_close(backend(checked)(torch.full((3, 4), 500.0)), torch.full((3, 4), 1000.0))
    assert "assert" not in backend.hlo[0].lower()


def test_grouped_mm_of_transformers_moe_is_lowered_statically():
    pytest.importorskip("transformers")
    import transformers.integrations.moe  # noqa: F401  (registers the custom op)

    op = torch.ops.transformers.grouped_mm_fallback.default
    x, w = randn(10, 8), randn(4, 8, 6, seed=1)
    offs = torch.tensor([3, 3, 7, 9], dtype=torch.int32)  # expert 1 empty, row 9 past the last offset
    got = compare(lambda x, w, o: op(x, w, o), x, w, offs)
    assert torch.equal(got[9], torch.zeros(6))


# -- custom ops: a user's lowering, and a clear error without one


@torch.library.custom_op("neuron_args_test::scaled_add", mutates_args=())
def scaled_add(x: torch.Tensor, y: torch.Tensor, alpha: float) -> torch.Tensor:
    return torch.from_numpy(x.numpy() + alpha * y.numpy())  # host code: Dynamo cannot look inside


@scaled_add.register_fake
def _(x: torch.Tensor, y: torch.Tensor, alpha: float) -> torch.Tensor:
    return torch.empty_like(x)


@torch.library.custom_op("neuron_args_test::opaque", mutates_args=())
def opaque(x: torch.Tensor) -> torch.Tensor:
    return x.clone()


@opaque.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


def test_register_lowering_lowers_a_users_custom_op():
    @register_lowering("neuron_args_test::scaled_add")
    def _scaled_add(x: Any, y: Any, alpha: float) -> Any:
        return x + alpha * y

    x, y = randn(3, 4), randn(3, 4, seed=1)
    compare(lambda x, y: scaled_add(x * 2, y, 0.5), x, y)


def test_register_lowering_wants_a_qualified_name():
    with pytest.raises(ValueError, match="must be qualified"):
        register_lowering("scaled_add")


def test_op_without_lowering_names_op_graph_type_source_line_and_fix():
    backend = Lowered()

    def model(x):
        return opaque(x * 2) + 1  # the user's line

    with torch.inference_mode(), scoped_compiler_args(["-O1"], graph_type="decode"), \
            pytest.raises(BackendCompilerFailed):
        backend(model)(torch.ones(4))
    (err,) = backend.errors
    message = str(err)
    assert "neuron_args_test.opaque" in message and "no lowering exists" in message
    assert "graph type 'decode'" in message
    assert "test_lowering_ops.py" in message and "return opaque(x * 2) + 1" in message
    assert "register_lowering('neuron_args_test::opaque')" in message


def test_through_a_seam_the_lowering_error_reaches_the_caller_as_itself(tmp_path):
    cm = torch.compile(lambda x: opaque(x) + 1, backend="neuron_libtorch", dynamic=False,
                       options={"cache_dir": str(tmp_path), "compiler": "local"})
    torch._dynamo.reset()
    with torch.inference_mode(), scoped_compiler_args(["-O3"], graph_type="encoder"), \
            pytest.raises(LoweringError, match="graph type 'encoder'") as caught:
        cm(torch.ones(3))
    assert "register_lowering('neuron_args_test::opaque')" in str(caught.value)


# -- ops an OpInfo sweep found unlowered or wrong (tests/ops/probe_opinfo.py, docs/OP_COVERAGE.md)


def _int(*values: int) -> torch.Tensor:
    return torch.tensor(values)


SWEPT_OPS = {
    # torchax dropped right/side/sorter and searched an N-d sequence as one flat array
    "searchsorted": (lambda s, v, perm: (
        torch.searchsorted(s, v, right=True), torch.searchsorted(s, v, side="left"),
        torch.searchsorted(s[0][perm], v[0], sorter=torch.argsort(perm))),
        lambda: (torch.sort(randn(3, 6)).values.round(), randn(3, 4).round(), torch.randperm(
            6, generator=torch.Generator().manual_seed(0)))),
    "index_reduce": (lambda x, i, s: tuple(x.index_reduce(0, i, s, r, include_self=inc)
                                           for r in ("prod", "mean", "amax", "amin") for inc in (True, False)),
                     lambda: (randn(5, 3), _int(0, 4, 0, 2), randn(4, 3, seed=1))),
    "index_reduce_int_mean": (lambda x, i, s: x.index_reduce(1, i, s, "mean"),
                              lambda: (_int(7, -3, 9).expand(2, 3).contiguous(), _int(2, 2, 0), _int(4, 1, -8)
                                       .expand(2, 3).contiguous())),
    "nonzero_static": (lambda x: (torch.nonzero_static(x > 0, size=3), torch.nonzero_static(x > 0, size=20,
                                                                                            fill_value=-7)),
                       lambda: (randn(3, 4),)),
    # torchax averaged A with its transpose: torch reads one triangle
    "eigh_one_triangle": (lambda a: (torch.linalg.eigvalsh(a), torch.linalg.eigvalsh(a, UPLO="U"),
                                     torch.linalg.eigh(a).eigenvectors.abs(),
                                     torch.linalg.pinv(a, hermitian=True)),
                          lambda: (randn(2, 4, 4) + 4 * torch.eye(4),)),
    "linalg_of_empty_matrices": (lambda a: (torch.linalg.det(a), torch.linalg.inv(a), torch.linalg.slogdet(a),
                                            torch.linalg.cholesky(a)),
                                 lambda: (torch.zeros(3, 0, 0),)),
    "repeat_interleave_output_size": (lambda x, r: x.repeat_interleave(r, dim=1, output_size=7) * 2,
                                      lambda: (randn(2, 3), _int(2, 0, 5))),
    "embedding_max_norm": (lambda i, w: F.embedding(i, w, max_norm=1.0) * 2, lambda: (_int(0, 3, 3, 5), randn(6, 4))),
    "batch_norm_with_update": (lambda x, w, m, v: torch.ops.aten._batch_norm_with_update(x, w, w, m, v, 0.1, 1e-5),
                               lambda: (randn(2, 3, 4), randn(3, seed=1), randn(3, seed=2), randn(3, seed=3).abs())),
    "ldexp_angle_spherical_j0": (lambda x, e: (torch.ldexp(x, e), torch.angle(x), torch.angle(e),
                                               torch.special.spherical_bessel_j0(x * 4)),
                                 lambda: (torch.tensor([-2.0, -0.0, 0.0, 1.5, float("nan"), float("inf")]),
                                          _int(-1, 0, 3, 2, 1, -4))),
}


@pytest.mark.parametrize("name", list(SWEPT_OPS))
def test_op_found_by_the_opinfo_sweep_matches_eager(name):
    fn, inputs = SWEPT_OPS[name]
    compare(fn, *inputs(), atol=1e-5, rtol=1e-5, equal_nan=True)


def test_random_draws_come_from_the_graph_key():
    """``torch.empty_like(p).exponential_()`` samples (vLLM's sampler races ``p / exponential``), ``cauchy_``,
    ``log_normal_``, ``normal_``, ``torch.normal(mean, std, size, dtype=...)``: the draws come from the graph's key
    input, so they are not eager's numbers; they follow the distribution and differ per call."""
    draw = Lowered()(lambda x: (torch.empty_like(x).exponential_(2.0), torch.empty_like(x).cauchy_(1.0, 2.0),
                                torch.empty_like(x).log_normal_(0.5, 0.25), torch.empty_like(x).normal_(-1.0, 3.0),
                                torch.normal(2.0, 0.5, x.shape, dtype=torch.bfloat16)))
    with torch.inference_mode():
        torch.manual_seed(0)
        (exp, cauchy, log_normal, normal, sized), (again, *_) = draw(torch.zeros(20000)), draw(torch.zeros(20000))
    assert exp.min() >= 0 and abs(exp.mean().item() - 0.5) < 0.02
    assert abs(cauchy.median().item() - 1.0) < 0.1 and abs(((cauchy - 1).abs().median() - 2.0).item()) < 0.15
    assert abs(log_normal.log().mean().item() - 0.5) < 0.01 and abs(log_normal.log().std().item() - 0.25) < 0.01
    assert abs(normal.mean().item() + 1.0) < 0.1 and abs(normal.std().item() - 3.0) < 0.1
    assert sized.dtype == torch.bfloat16 and abs(sized.float().mean().item() - 2.0) < 0.02
    assert not torch.equal(exp, again)


def test_narrow_at_a_tensor_start_names_the_value_read_not_dynamic():
    """A start read from a tensor (``.item()``) with a fixed length: the output's size is known, the start is not;
    the error names the read and its fix, not ``dynamic=False``."""
    backend = Lowered()
    with torch.inference_mode(), pytest.raises(BackendCompilerFailed):
        backend(lambda x, s: torch.narrow(x, 1, s, 2))(randn(3, 5), torch.tensor(1))
    message = str(backend.errors[0])
    assert "cannot lower op aten._local_scalar_dense" in message and ".item()" in message
    assert "dynamic=False" not in message


def test_chalf_lowers_as_complex64_rounded_to_half_parts():
    """complex32 has no XLA type: the conversion rounds each part to float16 inside complex64, the runtime casts the
    output back, and a complex32 input is read the same way."""
    x = randn(6) * 1000 + 0.1234567
    z = torch.complex(x, randn(6, seed=1))
    got = compare(lambda x, z: (x.chalf(), z.chalf(), z.chalf() * 2, x.chalf().cfloat() + 1), x, z, atol=0, rtol=0)
    assert [t.dtype for t in got] == [torch.complex32, torch.complex32, torch.complex32, torch.complex64]
    compare(lambda h: h.cfloat() * 3, z.chalf(), atol=0, rtol=0)


# the fixes sit apart from the lambdas: the error quotes the user's source line, which must not hold them
NONZERO_FIX = "torch.nonzero_static(x, size=n)"
REPEAT_FIX = "pass output_size="


@pytest.mark.parametrize("fn, fix", [
    (lambda x: torch.nonzero(x > 0), NONZERO_FIX),
    (lambda x: torch.arange(3).repeat_interleave((x[:3] > 0).long() + 1), REPEAT_FIX),
], ids=["nonzero", "repeat_interleave"])
def test_an_op_a_static_graph_cannot_hold_names_its_fix(fn, fix):
    backend = Lowered()
    with torch.inference_mode(), torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True), \
            pytest.raises(BackendCompilerFailed):
        backend(fn)(randn(6))
    assert fix in str(backend.errors[0])
