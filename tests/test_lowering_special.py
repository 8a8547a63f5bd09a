"""``polygamma``, ``digamma`` and the scaled Bessel K functions compiled equal eager on their whole domain.

jax's polygamma (n >= 1) is wrong for x below about -8 (polygamma(1, -8.48) came out 7.74, eager 9.80): the
lowering reflects below 0.5 (``neuron_args.lowering.special``).
"""
from __future__ import annotations

import pytest
import torch

from neuron_args.lowering.special import cot_derivative
from tests.test_lowering_ops import compare

#: negative and positive x, the failing -8.48, half-integers, poles (0, -3) and infinities
X = torch.cat([torch.linspace(-20, 5, 801), torch.tensor(
    [-8.48, -8.5, -100.3, -0.5, -3.0, 0.0, -0.0, 1e-3, -1e-3, 0.4999, 0.5, float("nan"), float("inf"), -float("inf")])])


@pytest.mark.parametrize("n", range(6))
def test_polygamma_of_every_order_matches_eager_for_negative_x(n):
    got = compare(lambda x: (torch.polygamma(n, x), torch.special.polygamma(n, x)), X,
                  atol=1e-4, rtol=1e-4, equal_nan=True)
    assert got[0].dtype == torch.float32


def test_digamma_and_polygamma_keep_a_half_input_dtype():
    x = X[:-3].to(torch.bfloat16)
    got = compare(lambda x: (torch.digamma(x), torch.polygamma(1, x), torch.polygamma(3, x)), x,
                  atol=2e-2, rtol=2e-2, equal_nan=True)
    assert [g.dtype for g in got] == [torch.bfloat16] * 3


def test_cot_derivatives_are_the_polynomials_in_cot():
    assert cot_derivative(0) == (0, 1)
    assert cot_derivative(1) == (-1, 0, -1)  # -(1 + c^2)
    assert cot_derivative(2) == (0, 2, 0, 2)  # 2c(1 + c^2)


@pytest.mark.parametrize("name", ["scaled_modified_bessel_k0", "scaled_modified_bessel_k1"])
def test_scaled_modified_bessel_k_matches_eager(name):
    """``exp(x) K(x)`` from the series: no 0 * inf at large x, inf at 0, NaN below it, as eager."""
    x = torch.cat([torch.linspace(-1, 30, 311), torch.tensor(
        [0.0, 1e-4, 2.0, 2.0001, 100.0, 1e4, float("inf"), float("nan")])])
    compare(getattr(torch.special, name), x, atol=1e-4, rtol=1e-4, equal_nan=True)


def test_airy_ai_matches_eager_on_every_branch():
    """The oscillating side (x < -2.09), the power series, the decaying side, 0 past 103.892, NaN at +-inf."""
    x = torch.cat([torch.linspace(-30, 30, 601), torch.tensor(
        [-2.09, 2.09, 8.3203353, 104.0, float("inf"), -float("inf"), float("nan")])])
    compare(torch.special.airy_ai, x, atol=1e-4, rtol=1e-4, equal_nan=True)
