"""``linalg.ldl_solve`` with the Bunch-Kaufman factors (LAPACK's ``?sytrf`` form) ``torch.linalg.ldl_factor`` returns.

Which rows form 2x2 blocks depends on the values (negative ``pivots``), so the solve walks the rows in a loop of
fixed length and takes each row's 1x1 or 2x2 step with a select, in ``?sytrs``'s order of operations.
"""
from __future__ import annotations

from typing import Any

from neuron_args.lazy_modules import jax, jnp


def ldl_solve(ld: Any, pivots: Any, b: Any, hermitian: bool = False) -> Any:
    """``aten.linalg_ldl_solve``: ``X`` with ``A X = B`` from ``ldl_factor``'s ``LD`` and ``pivots``, batched."""
    if hermitian and jnp.iscomplexobj(ld):
        raise ValueError("linalg.ldl_solve of a complex Hermitian factorization (hermitian=True) is not lowered: "
                         "factor and solve it outside the compiled function, or use linalg.solve")
    n, k = b.shape[-2], b.shape[-1]
    batch = jnp.broadcast_shapes(ld.shape[:-2], pivots.shape[:-1], b.shape[:-2])
    ld = jnp.broadcast_to(ld, (*batch, n, n)).reshape(-1, n, n)
    pivots = jnp.broadcast_to(pivots, (*batch, n)).reshape(-1, n)
    b = jnp.broadcast_to(b, (*batch, n, k)).reshape(-1, n, k).astype(ld.dtype)
    return jax.vmap(_solve)(ld, pivots, b).reshape(*batch, n, k)


def _swap(b: Any, i: Any, j: Any) -> Any:
    rows_i, rows_j = b[i], b[j]
    return b.at[i].set(rows_j).at[j].set(rows_i)


def _solve(ld: Any, pivots: Any, b: Any) -> Any:
    """One matrix: ``L D`` forward (``k = 0..n-1``), then ``L^T`` backward (``k = n-1..0``), as ``?sytrs``."""
    n = ld.shape[-1]
    rows = jnp.arange(n)

    def below(col: Any, k: Any) -> Any:
        """Column ``col`` of ``L`` below row ``k`` (zeros elsewhere)."""
        return jnp.where(rows > k, ld[:, col], 0)

    def forward(k: Any, carry: tuple[Any, Any]) -> tuple[Any, Any]:
        b, skip = carry
        p = pivots[k]
        # 1x1 block: swap rows k and p-1, eliminate below, scale by D[k, k]
        one = _swap(b, k, p - 1)
        one = one - below(k, k)[:, None] * one[k][None, :]
        one = one.at[k].set(one[k] / ld[k, k])
        # 2x2 block (rows k, k+1): swap row k+1 with -p-1, eliminate below both, solve the block
        k1 = jnp.minimum(k + 1, n - 1)
        two = _swap(b, k1, -p - 1)
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
        step = _swap(step, k, jnp.where(p > 0, p - 1, -p - 1))
        return jnp.where(skip, b, step), ~skip & (p < 0)

    b, _ = jax.lax.fori_loop(0, n, forward, (b, jnp.asarray(False)))
    b, _ = jax.lax.fori_loop(0, n, backward, (b, jnp.asarray(False)))
    return b
