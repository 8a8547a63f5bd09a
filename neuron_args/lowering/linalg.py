"""Dense linear algebra torchax lowers wrongly or not at all, its LU factors, pivots and LAPACK ``info`` values as
torch's kernels return them (a backward reuses them, a ``*_ex`` call reads ``info``)."""
from __future__ import annotations

from typing import Any

import torch

from neuron_args.lazy_modules import jax, jnp, jsl


def lu_factor_ex(a: Any, pivot: bool = True, check_errors: bool = False) -> tuple[Any, Any, Any]:
    """``aten.linalg_lu_factor_ex``, LAPACK ``getrf`` as torch returns it: ``(LU, pivots, info)``, pivots 1-based
    int32, info the 1-based index of the first exactly-zero pivot of ``U`` (0: none)."""
    if not pivot:
        raise ValueError("torch.linalg.lu_factor(pivot=False) is not implemented on CPU; use pivot=True")
    lu, pivots, _ = jax.lax.linalg.lu(a)
    return lu, (pivots + 1).astype(jnp.int32), _first_true(jnp.diagonal(lu, axis1=-2, axis2=-1) == 0)


def _first_true(flags: Any) -> Any:
    """The 1-based index of the first True along the last axis, 0 when there is none (int32)."""
    if flags.shape[-1] == 0:  # 0 x 0 matrices: nothing to fail
        return jnp.zeros(flags.shape[:-1], jnp.int32)
    return jnp.where(flags.any(-1), jnp.argmax(flags, -1) + 1, 0).astype(jnp.int32)


def _permutation_sign(pivots: Any) -> Any:
    """+1 or -1: the parity of the row swaps ``pivots`` (1-based) makes."""
    swaps = (pivots != jnp.arange(1, pivots.shape[-1] + 1, dtype=pivots.dtype)).sum(-1)
    return 1 - 2 * (swaps % 2)


def _lu_solve(lu: Any, pivots: Any, b: Any, *, transposed: bool) -> Any:
    """Solve ``A x = b`` (``A^T x = b`` when ``transposed``) with ``A``'s LU factors, batch dims broadcast."""
    lu, b = _broadcast_batch(lu, b)
    pivots = jnp.broadcast_to(pivots, lu.shape[:-2] + pivots.shape[-1:])
    return jsl.lu_solve((lu, pivots - 1), b, trans=1 if transposed else 0)


def _broadcast_batch(a: Any, b: Any) -> tuple[Any, Any]:
    """Matrices ``a`` and ``b`` with their batch dims broadcast to one shape."""
    batch = jnp.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    return jnp.broadcast_to(a, batch + a.shape[-2:]), jnp.broadcast_to(b, batch + b.shape[-2:])


def lu_unpack(lu: Any, pivots: Any, unpack_data: bool = True, unpack_pivots: bool = True) -> tuple[Any, Any, Any]:
    """``aten.lu_unpack``: ``(P, L, U)`` with ``A = P L U`` (what the LU backward formulas use); an output not
    asked for is empty (torchax slices with traced indices, which jax refuses)."""
    *batch, m, n = lu.shape
    k = min(m, n)
    empty = jnp.zeros((0,), lu.dtype)
    if unpack_pivots:
        perm = jax.lax.linalg.lu_pivots_to_permutation(pivots - 1, m)  # A[perm] = L U
        p = jax.nn.one_hot(perm, m, dtype=lu.dtype).mT
    else:
        p = empty
    if not unpack_data:
        return p, empty, empty
    low = jnp.tril(lu[..., :, :k], -1) + jnp.eye(m, k, dtype=lu.dtype)
    return p, low, jnp.triu(lu[..., :k, :])


def lu(a: Any, pivot: bool = True) -> tuple[Any, Any, Any]:
    """``aten.linalg_lu``: ``(P, L, U)`` (torchax takes ``min(m, n)`` as a traced value)."""
    return lu_unpack(*lu_factor_ex(a, pivot)[:2])  # the factors and pivots


def _factored(a: Any, layout: torch.Tensor) -> tuple[Any, Any, Any]:
    """``(LU, pivots, U's diagonal)`` of ``A``, or of ``A^T`` where torch factors that."""
    lu, pivots, _ = lu_factor_ex(a.mT if layout.is_contiguous() and not layout.is_complex() else a)
    return lu, pivots, jnp.diagonal(lu, axis1=-2, axis2=-1)


def det(a: Any, *, layout: torch.Tensor) -> tuple[Any, Any, Any]:
    """``aten._linalg_det``: ``(det, LU, pivots)``; the product of ``U``'s diagonal times the pivots' sign."""
    lu, pivots, diag = _factored(a, layout)
    return diag.prod(-1) * _permutation_sign(pivots).astype(a.dtype), lu, pivots


def slogdet(a: Any, *, layout: torch.Tensor) -> tuple[Any, Any, Any, Any]:
    """``aten._linalg_slogdet``: ``(sign, logabsdet, LU, pivots)``; a singular matrix has sign 0, logabsdet -inf."""
    lu, pivots, diag = _factored(a, layout)
    sign = jnp.sign(diag).prod(-1) * _permutation_sign(pivots).astype(a.dtype)
    return sign, jnp.log(jnp.abs(diag)).sum(-1), lu, pivots


def solve_ex(a: Any, b: Any, left: bool = True, check_errors: bool = False) -> tuple[Any, Any, Any, Any]:
    """``aten._linalg_solve_ex``: ``(X, LU, pivots, info)`` with ``A X = B`` (``X A = B`` when not ``left``), ``LU``
    the factors of ``A`` its backward solves with. ``B`` is a batch of vectors when it is 1-D or shaped
    ``A.shape[:-1]`` (torch's rule; torchax guesses from the last dim and ignores ``left``)."""
    vector = b.ndim == 1 or (b.ndim == a.ndim - 1 and tuple(b.shape) == tuple(a.shape[:-1]))
    rhs = b[..., None] if vector else b
    lu, pivots, info = lu_factor_ex(a)
    if left:
        x = _lu_solve(lu, pivots, rhs, transposed=False)
    else:  # X A = B  <=>  A^T X^T = B^T
        x = _lu_solve(lu, pivots, rhs.mT, transposed=True).mT
    return (x[..., 0] if vector else x), lu, pivots, info


def inv_ex(a: Any, check_errors: bool = False) -> tuple[Any, Any]:
    """``aten.linalg_inv_ex``: ``(inverse, info)``, solving against the identity as torch does."""
    inverse, _, _, info = solve_ex(a, jnp.broadcast_to(jnp.eye(a.shape[-1], dtype=a.dtype), a.shape))
    return inverse, info


def cholesky_ex(a: Any, upper: bool = False, check_errors: bool = False) -> tuple[Any, Any]:
    """``aten.linalg_cholesky_ex``: ``(L, info)`` (``U = L^H`` when ``upper``), reading only the lower (upper)
    triangle as LAPACK's ``potrf`` does. ``info`` is the order of the first leading minor that is not positive
    definite (0: none): computed, column by column, only when the factorization failed (jax returns NaN then)."""
    if a.shape[-1] == 0:  # 0 x 0 matrices: nothing to factor
        return a, jnp.zeros(a.shape[:-2], jnp.int32)
    sym = _symmetric(a, upper)
    low = jax.lax.linalg.cholesky(sym, symmetrize_input=False)
    failed = ~jnp.isfinite(jnp.diagonal(low, axis1=-2, axis2=-1)).all()
    info = jax.lax.cond(failed, _cholesky_info, lambda s: jnp.zeros(s.shape[:-2], jnp.int32), sym)
    return (low.mT if upper else low), info


def _symmetric(a: Any, upper: bool) -> Any:
    """The symmetric matrix ``a``'s lower (upper) triangle stands for: what LAPACK's symmetric kernels read."""
    half = jnp.triu(a) if upper else jnp.tril(a)
    return half + (jnp.triu(half, 1) if upper else jnp.tril(half, -1)).mT


def eigh(a: Any, uplo: str = "L", compute_v: bool = True) -> tuple[Any, Any]:
    """``aten._linalg_eigh``: ``(eigenvalues ascending, eigenvectors)`` of the ``uplo`` triangle (torchax averages
    ``a`` with its transpose: other values for an ``a`` that is not symmetric)."""
    vectors, values = jax.lax.linalg.eigh(_symmetric(a, uplo.upper() == "U"), symmetrize_input=False)
    return values, (vectors if compute_v else jnp.zeros((0,), a.dtype))


def _cholesky_info(a: Any) -> Any:
    """The order of the first leading minor of ``a`` (symmetric) whose Cholesky pivot is not positive (0: none):
    an unblocked right-looking Cholesky over the columns."""
    n = a.shape[-1]
    rows = jnp.arange(n)

    def column(carry: tuple[Any, Any], j: Any) -> tuple[tuple[Any, Any], Any]:
        work, bad = carry  # work: the trailing matrix, updated in place
        pivot = work[..., j, j]
        ok = pivot > 0
        root = jnp.sqrt(jnp.where(ok, pivot, 1))
        col = jnp.where(rows > j, work[..., :, j] / root[..., None], 0)
        work = work - col[..., :, None] * col[..., None, :]
        return (work, bad | ~ok[..., None] & (rows == j)), None

    (_, bad), _ = jax.lax.scan(column, (a, jnp.zeros(a.shape[:-1], bool)), rows)
    return _first_true(bad)


def cholesky_solve(b: Any, factor: Any, upper: bool = False) -> Any:
    """``aten.cholesky_solve``: ``X`` with ``A X = B`` for ``A = L L^H`` (``U^H U`` when ``upper``), batch dims
    broadcast (torchax transposes every dim of an upper factor)."""
    factor, b = _broadcast_batch(factor, b)
    return jsl.cho_solve((factor, not upper), b)


def pinv(a: Any, atol: Any = None, rtol: Any = None, hermitian: bool = False) -> Any:
    """``aten.linalg_pinv``: singular values at most ``max(atol, rtol * s_max)`` dropped, with torch's default
    ``rtol`` (torchax ignores ``atol``); ``hermitian`` reads only the lower triangle, as torch."""
    if hermitian:
        a = _symmetric(a, upper=False)
    u, s, vh = jnp.linalg.svd(a, full_matrices=False)
    atol = jnp.zeros((), s.dtype) if atol is None else _per_matrix(atol, s.dtype)
    rtol = (jnp.where(atol > 0, 0, jnp.finfo(a.dtype).eps * max(a.shape[-2:])) if rtol is None
            else _per_matrix(rtol, s.dtype))
    keep = s > jnp.maximum(atol, rtol * s.max(-1, keepdims=True, initial=0))
    s_inv = jnp.where(keep, 1 / jnp.where(keep, s, 1), 0)
    return vh.mT @ (s_inv[..., None] * u.mT)


def _per_matrix(value: Any, dtype: Any) -> Any:
    """A tolerance (a float, or a tensor over the batch) shaped to compare with the singular values."""
    return jnp.asarray(value, dtype) if isinstance(value, (int, float)) else jnp.asarray(value, dtype)[..., None]


def ldl_solve(ld: Any, pivots: Any, b: Any, hermitian: bool = False) -> Any:
    """``aten.linalg_ldl_solve``: ``X`` with ``A X = B`` from ``ldl_factor``'s ``?sytrf`` ``LD`` and ``pivots``."""
    if hermitian and jnp.iscomplexobj(ld):
        raise ValueError("linalg.ldl_solve of a complex Hermitian factorization (hermitian=True) is not lowered: "
                         "factor and solve it outside the compiled function, or use linalg.solve")
    n, k = b.shape[-2], b.shape[-1]
    batch = jnp.broadcast_shapes(ld.shape[:-2], pivots.shape[:-1], b.shape[:-2])
    ld = jnp.broadcast_to(ld, (*batch, n, n)).reshape(-1, n, n)
    pivots = jnp.broadcast_to(pivots, (*batch, n)).reshape(-1, n)
    b = jnp.broadcast_to(b, (*batch, n, k)).reshape(-1, n, k).astype(ld.dtype)
    return jax.vmap(_ldl_solve_one)(ld, pivots, b).reshape(*batch, n, k)


def _swap_rows(b: Any, i: Any, j: Any) -> Any:
    rows_i, rows_j = b[i], b[j]
    return b.at[i].set(rows_j).at[j].set(rows_i)


def _ldl_solve_one(ld: Any, pivots: Any, b: Any) -> Any:
    """One matrix: ``L D`` forward (``k = 0..n-1``), then ``L^T`` backward (``k = n-1..0``), as ``?sytrs``. Which
    rows form 2x2 blocks depends on the values (negative ``pivots``): a loop of fixed length takes each row's 1x1 or
    2x2 step with a select."""
    n = ld.shape[-1]
    rows = jnp.arange(n)

    def below(col: Any, k: Any) -> Any:
        """Column ``col`` of ``L`` below row ``k`` (zeros elsewhere)."""
        return jnp.where(rows > k, ld[:, col], 0)

    def forward(k: Any, carry: tuple[Any, Any]) -> tuple[Any, Any]:
        b, skip = carry
        p = pivots[k]
        # 1x1 block: swap rows k and p-1, eliminate below, scale by D[k, k]
        one = _swap_rows(b, k, p - 1)
        one = one - below(k, k)[:, None] * one[k][None, :]
        one = one.at[k].set(one[k] / ld[k, k])
        # 2x2 block (rows k, k+1): swap row k+1 with -p-1, eliminate below both, solve the block
        k1 = jnp.minimum(k + 1, n - 1)
        two = _swap_rows(b, k1, -p - 1)
        two = two - below(k, k1)[:, None] * two[k][None, :] - below(k1, k1)[:, None] * two[k1][None, :]
        akm1k = ld[k1, k]
        akm1, ak = ld[k, k] / akm1k, ld[k1, k1] / akm1k
        denom = akm1 * ak - 1
        bkm1, bk = two[k] / akm1k, two[k1] / akm1k
        two = two.at[k].set((ak * bkm1 - bk) / denom).at[k1].set((akm1 * bk - bkm1) / denom)
        stepped = jnp.where(p > 0, one, two)
        return jnp.where(skip, b, stepped), ~skip & (p < 0)

    def backward(i: Any, carry: tuple[Any, Any]) -> tuple[Any, Any]:
        b, skip = carry
        k = n - 1 - i
        p = pivots[k]
        # row k less L[k+1:, k]^T b[k+1:], then the swap; a 2x2 block's first row (k-1) too, before the swap
        step = b.at[k].add(-(below(k, k) @ b))
        k0 = jnp.maximum(k - 1, 0)
        step = jnp.where(p < 0, step.at[k0].add(-(below(k0, k) @ b)), step)
        step = _swap_rows(step, k, jnp.where(p > 0, p - 1, -p - 1))
        return jnp.where(skip, b, step), ~skip & (p < 0)

    b, _ = jax.lax.fori_loop(0, n, forward, (b, jnp.asarray(False)))
    b, _ = jax.lax.fori_loop(0, n, backward, (b, jnp.asarray(False)))
    return b

