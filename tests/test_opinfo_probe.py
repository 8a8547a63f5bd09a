"""The OpInfo probe's float64 arbitration: a result that differs from eager's float32 one passes only when it equals
eager's float64 one and eager's float32 one does not."""
from __future__ import annotations

import torch

from tests.ops.probe_opinfo import _equals_float64_eager


class Sample:
    @staticmethod
    def output_process_fn_grad(out):
        return out


def cancel(x):
    """``x`` through a large offset: float32 loses its low digits, float64 does not."""
    return (x + 1e5) - 1e5


def test_a_result_equal_to_float64_eager_where_eager_float32_is_off_is_arbitrated():
    x = torch.tensor([0.1234567, -0.7654321])
    assert not torch.allclose(cancel(x), x, atol=1e-4, rtol=1e-4)  # eager float32 is off
    assert _equals_float64_eager(cancel, Sample(), [x], x.clone(), 1e-4)


def test_a_result_off_float64_or_where_eager_is_right_is_not_arbitrated():
    x = torch.tensor([0.1234567, -0.7654321])
    assert not _equals_float64_eager(cancel, Sample(), [x], x + 0.01, 1e-4)
    assert not _equals_float64_eager(torch.sin, Sample(), [x], torch.sin(x) + 0.01, 1e-4)
    assert not _equals_float64_eager(cancel, Sample(), [x], x.double(), 1e-4)  # only float32 results
