"""``geqrf`` and ``ormqr`` (QR in LAPACK's Householder form) compiled equal eager, batched, tall and wide."""
from __future__ import annotations

import pytest
import torch

from tests.test_lowering_ops import compare, randn


@pytest.mark.parametrize("shape", [(2, 5, 3), (4, 4), (3, 6)])
def test_geqrf_and_ormqr_match_eager(shape):
    a = randn(*shape)
    other = randn(*shape[:-2], shape[-2], 2, seed=1)
    right = randn(*shape[:-2], 2, shape[-2], seed=2)

    def fn(a, other, right):
        q, tau = torch.geqrf(a)
        return (q, tau, torch.ormqr(q, tau, other), torch.ormqr(q, tau, other, transpose=True),
                torch.ormqr(q, tau, right, left=False))

    compare(fn, a, other, right, atol=1e-5, rtol=1e-5)
