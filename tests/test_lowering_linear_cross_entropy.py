"""``F.linear_cross_entropy`` with batch chunking (its ``torch_nn`` custom ops) compiled equal eager: the loss of
each reduction, class weights and ``ignore_index``, and the gradients the scalar op computes in its forward."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.nn.modules.linear_cross_entropy_options import LinearCrossEntropyOptions

from tests.test_lowering_ops import Lowered, compare, randn

CHUNKED = LinearCrossEntropyOptions(batch_chunk_size=2, allow_retain_graph=True)  # torch.compile needs it


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_chunked_linear_cross_entropy_matches_eager(reduction):
    x, w, b, cw = randn(6, 3), randn(5, 3, seed=1), randn(5, seed=2), randn(5, seed=3).abs()
    target = torch.tensor([0, 4, 2, -100, 1, 4])

    def fn(x, w, b, cw, target):
        return (F.linear_cross_entropy(x, w, target, linear_bias=b, reduction=reduction, options=CHUNKED),
                F.linear_cross_entropy(x, w, target, linear_bias=b, weight=cw, reduction=reduction, options=CHUNKED))

    compare(fn, x, w, b, cw, target, atol=1e-5, rtol=1e-5)


def test_chunked_linear_cross_entropy_gradients_match_eager():
    """The scalar op computes its gradients in the forward graph; the backward scales them."""
    x, w, b = randn(6, 3), randn(5, 3, seed=1), randn(5, seed=2)
    target = torch.tensor([0, 4, 2, -100, 1, 4])

    def fn(x, w, b, target):
        return F.linear_cross_entropy(x, w, target, linear_bias=b, options=CHUNKED)

    def loss_and_grads(f):
        leaves = [t.clone().requires_grad_() for t in (x, w, b)]
        loss = f(*leaves, target)
        return (loss.detach(), *torch.autograd.grad(2 * loss, leaves))

    torch.testing.assert_close(loss_and_grads(Lowered()(fn)), loss_and_grads(fn), atol=1e-5, rtol=1e-5)
