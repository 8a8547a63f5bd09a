"""Architectures beyond the matrix: one fp32 forward each, lowered and run on XLA:CPU in this process.

Other attention kinds (multi-query, alibi, mixture of experts), text, audio and convolutional
encoders. Compiled in-process (no compiler subprocess) to keep the breadth cheap; the matrix in
``test_hf_models.py`` covers the seams, caches and dtypes.
"""
from __future__ import annotations

import pytest
import torch
from torch._dynamo.backends.common import aot_autograd

from tests.hf.architectures import MORE
from tests.hf.cells import FP32, SIZES, inputs
from tests.xla_run import run_on_xla_cpu

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")


@pytest.mark.parametrize("arch", MORE, ids=[a.name for a in MORE])
def test_forward_matches_eager(arch):
    model = arch.build()
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=aot_autograd(fw_compiler=run_on_xla_cpu), dynamic=False, fullgraph=True)
    kwargs = inputs(arch, SIZES[arch.kind][0])
    with torch.inference_mode():
        got, want = compiled(**kwargs), model(**kwargs)
    name = "logits" if arch.kind == "decoder" else "last_hidden_state"
    torch.testing.assert_close(getattr(got, name), getattr(want, name), **FP32)
