"""Architectures beyond the matrix: one fp32 forward each, lowered and run on XLA:CPU in this process.

Other attention kinds (multi-query, alibi, local, mixture of experts), state-space and hybrid
decoders, text, speech, audio and convolutional encoders, encoder-decoders with labels. Compiled
in-process (no compiler subprocess) to keep the breadth cheap; the matrix in ``test_hf_models.py``
covers the seams, caches and dtypes. A few, each bringing backward ops of its own, also run
forward and backward: every parameter's gradient must equal eager's.
"""
from __future__ import annotations

import copy

import pytest
import torch
from torch._dynamo.backends.common import aot_autograd

from tests.hf.architectures import ARCHITECTURES, MORE
from tests.hf.cells import FP32, SIZES, inputs, output
from tests.xla_run import run_on_xla_cpu

pytestmark = [pytest.mark.slow,  # the transformers matrix
              pytest.mark.filterwarnings("ignore::FutureWarning")]

#: forward and backward: grouped-mm experts, weight-norm and 1-d convolutions, depthwise convolutions and layer
#: norms, batch norm and pooling, disentangled attention, an encoder-decoder's cross-entropy
WITH_BACKWARD = ["qwen2-moe", "wav2vec2", "convnext", "resnet", "deberta-v2", "bart"]


def _compiled(model: torch.nn.Module, fullgraph: bool = True) -> torch.nn.Module:
    torch._dynamo.reset()
    return torch.compile(model, backend=aot_autograd(fw_compiler=run_on_xla_cpu), dynamic=False, fullgraph=fullgraph)


@pytest.mark.parametrize("arch", MORE, ids=[a.name for a in MORE])
def test_forward_matches_eager(arch):
    model = arch.build()
    kwargs = inputs(arch, SIZES[arch.kind][0])
    with torch.inference_mode():
        got, want = _compiled(model, fullgraph=not arch.graph_breaks)(**kwargs), model(**kwargs)
    torch.testing.assert_close(output(arch, got), output(arch, want), **FP32)


@pytest.mark.parametrize("name", WITH_BACKWARD)
def test_forward_backward_matches_eager(name):
    """A fixed random weighting of the output (plus the model's own loss, if it has labels) is backpropagated."""
    arch = ARCHITECTURES[name]
    model = arch.build()  # eval(): dropout off, so eager and compiled see the same function
    eager = copy.deepcopy(model)
    kwargs = inputs(arch, SIZES[arch.kind][0])

    def loss(result: object) -> torch.Tensor:
        out = output(arch, result)
        weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(3))
        return (out * weights).sum() + (result.loss if getattr(result, "loss", None) is not None else 0)

    loss(_compiled(model)(**kwargs)).backward()
    loss(eager(**kwargs)).backward()
    for (param, p), (_, q) in zip(model.named_parameters(), eager.named_parameters(), strict=True):
        if q.grad is None:  # unused by the output (a pooler): aot_autograd's backward returns zeros for it
            assert p.grad is None or not p.grad.any(), param
            continue
        torch.testing.assert_close(p.grad, q.grad, atol=1e-4, rtol=1e-3, msg=lambda m, param=param: f"{param}: {m}")
