"""``renorm`` lowers in every float dtype and equals eager: a half-precision input's norm in float32, the factor
rounded once to the input's dtype, as eager's kernel."""
from __future__ import annotations

import pytest
import torch

from tests.test_lowering_ops import compare, randn


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("p, dim", [(2, 0), (1, 1), (3.5, -1), (float("inf"), 2)])
def test_renorm_equals_eager(dtype, p, dim):
    x = (randn(4, 5, 3) * 3).to(dtype)
    x[1] *= 0.01  # a slice under maxnorm stays as it is
    exact = {"atol": 0, "rtol": 0} if dtype != torch.float32 else {}  # float32: the norm's summation order
    got = compare(lambda x: torch.renorm(x, p, dim, 2.0), x, **exact)
    assert got.dtype == dtype
