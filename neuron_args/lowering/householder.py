"""QR in LAPACK's Householder form, which torchax does not lower: ``geqrf`` (the reflectors below the
diagonal, R on and above it, and their scalars ``tau``) and ``ormqr`` (multiply by the Q they stand for).

jax has both as XLA:CPU's LAPACK calls (``geqrf``'s entry point is not public in jax 0.10), so results equal
eager's to rounding.
"""
from __future__ import annotations

from typing import Any


def geqrf(a: Any) -> tuple[Any, Any]:
    """``aten.geqrf``: ``(a, tau)`` as LAPACK's ``?geqrf``."""
    from jax._src.lax.linalg import geqrf as lax_geqrf

    return lax_geqrf(a)


def ormqr(a: Any, tau: Any, other: Any, left: bool = True, transpose: bool = False) -> Any:
    """``aten.ormqr``: ``Q @ other`` (``other @ Q`` when not ``left``; ``Q^H`` when ``transpose``)."""
    import jax.lax.linalg

    return jax.lax.linalg.ormqr(a, tau, other, left=left, transpose=transpose)
