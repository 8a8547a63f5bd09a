"""Half-precision ops that round where eager's CPU kernels round: the compiled bfloat16/float16 result equals eager's,
not float32's rounded once."""
from __future__ import annotations

import pytest
import torch

from tests.test_lowering_ops import compare, randn

HALF = [torch.bfloat16, torch.float16]


@pytest.mark.parametrize("dtype", [*HALF, torch.float32], ids=str)
@pytest.mark.parametrize("beta, alpha", [(1, 1), (0.5, 2.0), (0, 1)])
def test_addbmm_rounds_after_each_batch_as_eager(dtype, beta, alpha):
    """Eager adds one batch's product into the result at a time (an addmm each, rounded to the dtype)."""
    bias, a, b = (randn(5, 10, seed=1) * 4).to(dtype), (randn(6, 5, 7, seed=2) * 3).to(dtype), \
        (randn(6, 7, 10, seed=3) * 3).to(dtype)
    bias[0, 0] = float("nan") if beta == 0 else bias[0, 0]  # beta=0 ignores the input, NaN included
    tol = {"atol": 0, "rtol": 0} if dtype in HALF else {}
    compare(lambda bias, a, b: torch.addbmm(bias, a, b, beta=beta, alpha=alpha), bias, a, b, **tol)
    compare(lambda bias, a, b: torch.addbmm(bias, a[:1], b[:1], beta=beta, alpha=alpha), bias, a, b, **tol)
