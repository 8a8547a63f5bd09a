"""Chebyshev V/W, shifted Chebyshev T/U/V/W and Legendre P compiled equal eager (torch's kernels' branches:
n < 0, the interval's ends, the trigonometric form for large n, the recurrence), tensor or scalar ``n``."""
from __future__ import annotations

import pytest
import torch

from neuron_args.lowering.special import ORTHOGONAL
from tests.test_lowering_ops import compare

# no NaN x: torch returns an uninitialized value for it (its loop stops on NaN before setting the result)
X = torch.cat([torch.linspace(-1.5, 1.5, 31), torch.tensor([-1.0, 0.0, 1.0, 0.5])])[:, None]
N = torch.arange(-1, 14)[None, :]


@pytest.mark.parametrize("name", tuple(ORTHOGONAL))
def test_orthogonal_polynomial_matches_eager(name):
    fn = getattr(torch.special, name)
    got = compare(lambda x, n: (fn(x, n), fn(x, 3), fn(x, 11)), X, N, atol=1e-4, rtol=1e-4, equal_nan=True)
    assert got[0].shape == (35, 15) and got[0].dtype == torch.float32
