"""``torch.histogram`` and ``histogramdd`` compiled equal eager: bin counts over the values' range or a given
one, given edges (the last bin holding its right edge), weights, density, equal ends widened, NaN and outside
values not counted."""
from __future__ import annotations

import torch

from tests.test_lowering_ops import compare, randn


def test_histogram_matches_eager():
    def fn(x, with_nan, w, same, edges):  # eager refuses NaN where the range comes from the values
        return (*torch.histogram(x, 7), *torch.histogram(with_nan, 5, range=(-1.0, 1.0), weight=w),
                *torch.histogram(x, 4, density=True), *torch.histogram(same, 4),
                *torch.histogram(with_nan, edges, weight=w, density=True), *torch.histogram(edges, edges))

    x = torch.cat([randn(40), torch.tensor([0.0, 1.0, -1.0])])
    with_nan = torch.cat([randn(40), torch.tensor([float("nan"), 1.0, -1.0])])
    compare(fn, x, with_nan, randn(43, seed=1).abs(), torch.full((3,), 2.0),
            torch.tensor([-1.0, -0.2, 0.0, 0.5, 1.0]), atol=1e-5, rtol=1e-5)


def test_histogramdd_matches_eager():
    def fn(x, w, a, b):
        return (*torch.histogramdd(x, bins=[3, 4]), *torch.histogramdd(x, bins=[2, 5], range=[-1.0, 1.0, 0.0, 2.0],
                                                                       weight=w, density=True),
                *torch.histogramdd(x, bins=[a, b], weight=w))

    compare(fn, randn(5, 4, 2), randn(5, 4, seed=1).abs(), torch.tensor([-1.0, 0.0, 0.5, 2.0]),
            torch.tensor([-2.0, 0.0, 2.0]), atol=1e-5, rtol=1e-5)
