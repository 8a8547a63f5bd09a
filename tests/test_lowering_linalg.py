"""Dense linear algebra compiled on XLA:CPU in-process and compared with eager: the LU-based ops (``det``,
``slogdet``, ``solve``, ``inv``, ``lu_factor``/``lu_solve``), Cholesky and the ops torchax already lowered, forward
and backward. The checks that raise on a singular matrix are left out of the executable (it cannot raise); the
``info`` values ``*_ex`` calls return are computed as eager's."""
from __future__ import annotations

import pytest
import torch
from torch._dynamo.backends.common import aot_autograd

from tests.test_lowering_ops import Lowered, compare, randn
from tests.xla_run import run_on_xla_cpu

TOL = {"atol": 1e-4, "rtol": 1e-4}


def _spd(*batch: int, n: int = 4, seed: int = 0) -> torch.Tensor:
    a = randn(*batch, n, n, seed=seed)
    return a @ a.mT + n * torch.eye(n)


def _ops(a, s, b, v, w):
    """``a``: general (2, 4, 4), ``s``: SPD (2, 4, 4), ``b``: (2, 4, 3), ``v``: (2, 4) vectors, ``w``: (3, 4) wide."""
    lu, pivots = torch.linalg.lu_factor(a)
    low = torch.linalg.cholesky(s)
    return (torch.linalg.inv(a), torch.linalg.det(a), *torch.linalg.slogdet(a), torch.logdet(s),
            torch.linalg.solve(a, b), torch.linalg.solve(a, v), torch.linalg.solve(a[0], b), torch.linalg.solve(
                a, b.mT, left=False), torch.linalg.solve(a.mT, b), torch.linalg.det(a.mT), lu, pivots,
            torch.linalg.lu_solve(lu, pivots, b), torch.linalg.lu_solve(lu, pivots, b, adjoint=True),
            torch.linalg.lu_solve(lu, pivots, b.mT, left=False), *torch.linalg.lu(a),
            low, torch.linalg.cholesky(s, upper=True), torch.linalg.cholesky(torch.tril(s) + 7.0 * torch.triu(a, 1)),
            torch.cholesky_solve(b, low), torch.cholesky_solve(b, low.mT, upper=True), torch.cholesky_inverse(low),
            torch.linalg.matrix_exp(0.3 * a), torch.linalg.pinv(w), torch.linalg.pinv(w, atol=0.5),
            torch.linalg.pinv(s, hermitian=True), torch.linalg.eigh(s)[0], torch.linalg.svdvals(w),
            torch.linalg.svd(w, full_matrices=False)[1], torch.linalg.qr(a)[1].abs(),
            torch.linalg.solve_triangular(low, b, upper=False))


ARGS = (randn(2, 4, 4, seed=1), _spd(2), randn(2, 4, 3, seed=2), randn(2, 4, seed=3), randn(3, 4, seed=4))


@pytest.mark.slow
def test_linalg_ops_match_eager():
    compare(_ops, *ARGS, **TOL)


def _losses(a, s, b):
    x = torch.linalg.solve(a, b) + torch.linalg.solve(a, b.mT, left=False).mT + torch.linalg.inv(a) @ b
    lu, pivots = torch.linalg.lu_factor(a)
    low = torch.linalg.cholesky(s)
    return (x.sum() + torch.linalg.det(a).sum() + torch.linalg.slogdet(a)[1].sum() + torch.logdet(s).sum()
            + torch.linalg.lu_solve(lu, pivots, b).sum() + torch.cholesky_solve(b, low).sum() + low.sum()
            + torch.linalg.det(a.mT * 2).sum() + torch.linalg.pinv(a[:, :3]).sum()
            + torch.linalg.matrix_exp(0.3 * a).sum() + torch.linalg.eigh(s)[0].sum())


@pytest.mark.slow
def test_linalg_gradients_match_eager():
    """det and slogdet factor A^T when A is contiguous, and their backward reads those factors (``det(a.mT * 2)``
    is not contiguous); solve's backward reads the factors of A."""
    leaves = [t.clone().requires_grad_() for t in ARGS[:3]]
    want = torch.autograd.grad(_losses(*leaves), leaves)
    torch._dynamo.reset()
    compiled = torch.compile(_losses, backend=aot_autograd(fw_compiler=run_on_xla_cpu, bw_compiler=run_on_xla_cpu),
                             fullgraph=True, dynamic=False)
    got = torch.autograd.grad(compiled(*leaves), leaves)
    for name, g, w in zip("asb", got, want, strict=True):
        torch.testing.assert_close(g, w, **TOL, msg=lambda m, name=name: f"d/d{name}: {m}")


@pytest.mark.slow
def test_singular_inputs_give_eager_info_and_no_error():
    """``info`` as LAPACK's: the first zero pivot of LU, the first leading minor that is not positive definite.
    ``torch.linalg.inv`` of a singular matrix raises in eager; compiled, its check is left out (an executable cannot
    raise) and the values are inf/nan, as ``inv_ex`` returns them."""
    singular = torch.tensor([[[1.0, 2.0, 3.0], [2.0, 4.0, 6.0], [1.0, 0.0, 1.0]], [[2.0, 0, 0], [0, 3, 0], [0, 0, 4]]])
    not_pd = torch.tensor([[[4.0, 2.0, 0.0], [2.0, 1.0, 0.0], [0.0, 0.0, 1.0]], [[4.0, 0, 0], [0, 2, 0], [0, 0, 1]]])

    def fn(a, s):
        return (torch.linalg.inv_ex(a).info, torch.linalg.lu_factor_ex(a).info, torch.linalg.solve_ex(a, a).info,
                torch.linalg.cholesky_ex(s).info, torch.linalg.cholesky_ex(s, upper=True).info,
                torch.linalg.cholesky_ex(a[1]).L, torch.linalg.det(a), *torch.linalg.slogdet(a))

    info = compare(fn, singular, not_pd, atol=1e-5, rtol=1e-5)
    assert info[0].tolist() == [3, 0] and info[3].tolist() == [2, 0]
    with pytest.raises(torch.linalg.LinAlgError):
        torch.linalg.inv(singular)
    with torch.inference_mode():
        got = Lowered()(torch.linalg.inv)(singular)
    assert not torch.isfinite(got[0]).all() and torch.equal(got[1], torch.linalg.inv(singular[1]))


@pytest.mark.parametrize("batch", [(), (3,)])
def test_ldl_solve_matches_eager_with_2x2_pivot_blocks(batch):
    """Bunch-Kaufman factors of symmetric indefinite matrices (negative pivots: 2x2 blocks of D), batched (eager
    crashes on batch dims that broadcast, so they do not here)."""
    a = randn(*batch, 7, 7, seed=3)
    a = a + a.mT
    ld, pivots = torch.linalg.ldl_factor(a)
    assert (pivots < 0).any()  # the sample exercises the 2x2 blocks
    b = randn(*batch, 7, 3, seed=4)
    compare(lambda ld, pivots, b: torch.linalg.ldl_solve(ld, pivots, b), ld, pivots, b, **TOL)
