"""Layers whose ATen ops torchax lowers wrongly or not at all, each compiled on XLA:CPU in-process and compared
with eager: ``nn.EmbeddingBag`` (its offsets are traced values), LSTM in inference (oneDNN's layer op) and
with gradients (torch's unrolled decomposition), GRU and RNN, and ``as_strided`` of a tensor whose memory
order is not its index order (Longformer's chunked attention)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch._dynamo.backends.common import aot_autograd
from torch._dynamo.exc import BackendCompilerFailed

from tests.test_lowering_ops import Lowered, compare, randn
from tests.xla_run import run_on_xla_cpu

# -- nn.EmbeddingBag: sum / mean / max, per-sample weights, padding_idx, include_last_offset, backward

INDICES = torch.tensor([1, 2, 4, 5, 4, 3, 2, 9])
OFFSETS = torch.tensor([0, 3, 3, 6])  # bags [0, 3), [3, 3) (empty), [3, 6), [6, 8)
LAST_OFFSETS = torch.tensor([0, 3, 3, 6, 8])  # include_last_offset: the last offset ends the last bag

BAG_CASES = {
    "sum": dict(mode="sum"),
    "sum-weighted-padding-last": dict(mode="sum", per_sample_weights=True, padding_idx=4, include_last_offset=True),
    "mean-padding": dict(mode="mean", padding_idx=2),
    "max-last": dict(mode="max", include_last_offset=True),
}


@pytest.mark.parametrize("name", list(BAG_CASES))
def test_embedding_bag_forward_and_backward_match_eager(name):
    """Output, the weight's gradient and (weighted) the per-sample weights' gradient."""
    case = dict(BAG_CASES[name])
    weighted = case.pop("per_sample_weights", False)
    offsets = LAST_OFFSETS if case.get("include_last_offset") else OFFSETS
    weight = randn(10, 4).requires_grad_()
    samples = torch.rand(8, generator=torch.Generator().manual_seed(2)).requires_grad_() if weighted else None

    def bag(weight, samples):
        return F.embedding_bag(INDICES, weight, offsets, per_sample_weights=samples, **case)

    leaves = [t for t in (weight, samples) if t is not None]
    grad_of = randn(*bag(weight, samples).shape, seed=5)
    want = torch.autograd.grad((bag(weight, samples) * grad_of).sum(), leaves)
    got_out = Lowered()(bag)(weight, samples)
    got = torch.autograd.grad((got_out * grad_of).sum(), leaves)
    torch.testing.assert_close(got_out, bag(weight, samples), atol=1e-6, rtol=1e-6)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, atol=1e-6, rtol=1e-6)


def test_embedding_bag_bfloat16_rounds_like_the_kernel():
    """bf16 sums are float32 sums rounded half up (fbgemm), a mean divides that in bf16: bit-exact."""
    g = torch.Generator().manual_seed(0)
    weight, indices = torch.randn(10, 8, generator=g).bfloat16(), torch.randint(0, 10, (24,), generator=g)
    offsets = torch.tensor([0, 5, 11, 12])
    compare(lambda w, i, o: (F.embedding_bag(i, w, o, mode="sum"), F.embedding_bag(i, w, o, mode="mean"),
                             F.embedding_bag(i, w, o, mode="max")), weight, indices, offsets, atol=0.0, rtol=0.0)


def test_embedding_bag_scale_grad_by_freq_divides_by_each_index_count():
    """As ``nn.Embedding`` does. torch 2.13's CPU embedding_bag kernel miscounts repeats (index 7 below, three
    times in the batch, gets 1.5 instead of 1), so the reference is the same sum through ``F.embedding``."""
    indices = torch.tensor([0, 5, 5, 7, 7, 7])
    weight, ref = randn(10, 4).requires_grad_(), randn(10, 4).requires_grad_()
    bag = Lowered()(lambda w: F.embedding_bag(indices, w, torch.tensor([0]), mode="sum", scale_grad_by_freq=True))
    bag(weight).sum().backward()
    F.embedding(indices, ref, scale_grad_by_freq=True).sum().backward()
    torch.testing.assert_close(weight.grad, ref.grad, atol=0.0, rtol=0.0)
    assert weight.grad[7, 0] == 1.0


# -- recurrent layers: Dynamo traces them under torch._dynamo.config.allow_rnn (a patch around the traced call)


def _rnn(kind: str, **kwargs) -> torch.nn.Module:
    torch.manual_seed(0)
    return getattr(torch.nn, kind)(6, 8, **kwargs)


RNN_CASES = {
    "LSTM": dict(),
    "LSTM-2-layers-bidirectional-batch-first": dict(num_layers=2, bidirectional=True, batch_first=True),
    "GRU-2-layers-bidirectional": dict(num_layers=2, bidirectional=True),
    "RNN-relu-batch-first": dict(nonlinearity="relu", batch_first=True),
}


@pytest.mark.parametrize("name", list(RNN_CASES))
def test_recurrent_layer_forward_matches_eager(name):
    """An LSTM whose input needs no gradient runs oneDNN's layer op (lowered as a scan over time); GRU and RNN
    unroll the time steps in torch's decomposition."""
    module = _rnn(name.split("-")[0], **RNN_CASES[name])
    with torch._dynamo.config.patch(allow_rnn=True):
        compare(module, randn(2, 3, 6, seed=1), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
def test_recurrent_layer_gradients_match_eager(kind):
    """The backward graph is compiled too. torch's LSTM decomposition runs oneDNN's layer op while the layer's input
    needs no gradient (the first layer here: its backward op is lowered as the vjp of the scan) and unrolls the
    time steps otherwise (the second layer, and GRU)."""
    layers = 2 if kind == "LSTM" else 1  # GRU's unrolled backward is the slower to compile
    module, eager = _rnn(kind, num_layers=layers), _rnn(kind, num_layers=layers)
    x, h0 = randn(3, 2, 6, seed=1), randn(layers, 2, 8, seed=2)
    state = (h0, randn(layers, 2, 8, seed=3)) if kind == "LSTM" else h0
    weights = randn(3, 2, 8, seed=4)
    torch._dynamo.reset()
    compiled = torch.compile(module, backend=aot_autograd(fw_compiler=run_on_xla_cpu, bw_compiler=run_on_xla_cpu),
                             fullgraph=True, dynamic=False)
    with torch._dynamo.config.patch(allow_rnn=True):
        (compiled(x, state)[0] * weights).sum().backward()
    (eager(x, state)[0] * weights).sum().backward()
    for (name, p), (_, q) in zip(module.named_parameters(), eager.named_parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, atol=1e-5, rtol=1e-5, msg=lambda m, name=name: f"{name}: {m}")


def test_recurrent_layer_without_allow_rnn_names_the_config():
    with torch.inference_mode(), pytest.raises(torch._dynamo.exc.Unsupported, match="allow_rnn=True"):
        Lowered()(_rnn("LSTM"))(randn(3, 2, 6))


# -- as_strided reads memory: a transposed input's memory order is not its index order


def test_as_strided_of_a_transposed_tensor_reads_its_memory():
    """Longformer's chunking: overlapping windows over a tensor laid out (time, batch, features)."""
    x = randn(8, 2, 4)

    def chunks(x):
        t = x.transpose(0, 1)  # (2, 8, 4), memory still (8, 2, 4)
        return t.as_strided((2, 3, 4, 4), (4, 16, 8, 1)) * 2, t.as_strided((3, 4), (8, 1), 4) + 1

    compare(chunks, x, atol=0.0, rtol=0.0)


def test_as_strided_outside_its_input_is_refused_with_the_fix():
    backend = Lowered()
    with torch.inference_mode(), pytest.raises(BackendCompilerFailed):
        backend(lambda x: (x * 2)[1:].as_strided((4,), (1,), 0))(randn(4))
    assert "reads memory outside its input tensor" in str(backend.errors[0])
