"""``fractional_max_pool2d``/``3d`` compiled equal eager for given random samples (values and indices), and
``F.fractional_max_pool2d`` drawing its samples inside the graph lowers with the right shapes."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from tests.test_lowering_ops import Lowered, compare, randn


def test_fractional_max_pool_with_given_samples_matches_eager():
    samples2 = torch.rand(2, 3, 2, generator=torch.Generator().manual_seed(1))
    samples3 = torch.rand(2, 3, 3, generator=torch.Generator().manual_seed(2))

    def fn(x, s2, v, s3):
        return (*torch.ops.aten.fractional_max_pool2d(x, (2, 2), (5, 4), s2),
                *torch.ops.aten.fractional_max_pool2d(x, (3, 2), (4, 6), s2),
                *torch.ops.aten.fractional_max_pool2d(x, (2, 3), (1, 1), s2),
                *torch.ops.aten.fractional_max_pool3d(v, (2, 3, 2), (3, 4, 5), s3))

    compare(fn, randn(2, 3, 11, 9), samples2, randn(2, 3, 7, 8, 9, seed=3), samples3, atol=0, rtol=0)


def test_fractional_max_pool_drawing_its_samples_lowers():
    x = randn(2, 3, 11, 9)
    with torch.inference_mode():
        out, idx = Lowered()(lambda x: F.fractional_max_pool2d(x, 2, output_size=(5, 4), return_indices=True))(x)
    assert out.shape == (2, 3, 5, 4) and idx.dtype == torch.int64
    assert torch.equal(x.flatten(2).gather(2, idx.flatten(2)).view_as(out), out)  # each value is where its index says
