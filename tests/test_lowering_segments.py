"""``segment_reduce`` compiled equal eager: every reduction, with and without ``initial``, empty segments,
``lengths`` or ``offsets``, a batched ``lengths`` along axis 1, NaN propagated by max."""
from __future__ import annotations

import pytest
import torch

from tests.test_lowering_ops import compare

DATA = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0])
LENGTHS = torch.tensor([0, 1, 2, 2])


@pytest.mark.parametrize("reduce", ["sum", "mean", "max", "min", "prod"])
def test_segment_reduce_matches_eager(reduce):
    def fn(data, lengths, offsets, rows, row_lengths, nan):
        return (torch.segment_reduce(data, reduce, lengths=lengths),
                torch.segment_reduce(data, reduce, lengths=lengths, initial=10),
                torch.segment_reduce(data, reduce, offsets=offsets),
                torch.segment_reduce(rows, reduce, lengths=row_lengths, axis=1, initial=2),
                torch.segment_reduce(nan, reduce, lengths=torch.tensor([2, 1])))

    compare(fn, DATA, LENGTHS, torch.tensor([0, 0, 1, 3, 5]), torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]),
            torch.tensor([[1, 1], [0, 2], [2, 0]]), torch.tensor([1.0, float("nan"), 3.0]), equal_nan=True)
