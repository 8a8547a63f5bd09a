"""Exponentially scaled modified Bessel functions of the second kind, ``exp(x) K0(x)`` and ``exp(x) K1(x)``,
as torch's kernels compute them (Cephes' Chebyshev series, coefficients from ``ATen/native/Math.h``).

torchax has ``K0``/``K1`` but not their scaled forms; ``exp(x) * K0(x)`` from those would underflow to 0 * inf
for large x, so the series is evaluated here: below 2 the small-x series times ``exp(x)``, above it the
large-x series without the ``exp(-x)``.
"""
from __future__ import annotations

from typing import Any

_K0_A = (
    1.37446543561352307156e-16, 4.25981614279661018399e-14, 1.03496952576338420167e-11, 1.90451637722020886025e-09,
    2.53479107902614945675e-07, 2.28621210311945178607e-05, 1.26461541144692592338e-03, 3.59799365153615016266e-02,
    3.44289899924628486886e-01, -5.35327393233902768720e-01,
)
_K0_B = (
    5.30043377268626276149e-18, -1.64758043015242134646e-17, 5.21039150503902756861e-17, -1.67823109680541210385e-16,
    5.51205597852431940784e-16, -1.84859337734377901440e-15, 6.34007647740507060557e-15, -2.22751332699166985548e-14,
    8.03289077536357521100e-14, -2.98009692317273043925e-13, 1.14034058820847496303e-12, -4.51459788337394416547e-12,
    1.85594911495471785253e-11, -7.95748924447710747776e-11, 3.57739728140030116597e-10, -1.69753450938905987466e-09,
    8.57403401741422608519e-09, -4.66048989768794782956e-08, 2.76681363944501510342e-07, -1.83175552271911948767e-06,
    1.39498137188764993662e-05, -1.28495495816278026384e-04, 1.56988388573005337491e-03, -3.14481013119645005427e-02,
    2.44030308206595545468e+00,
)
_K1_A = (
    -7.02386347938628759343e-18, -2.42744985051936593393e-15, -6.66690169419932900609e-13,
    -1.41148839263352776110e-10, -2.21338763073472585583e-08, -2.43340614156596823496e-06,
    -1.73028895751305206302e-04, -6.97572385963986435018e-03, -1.22611180822657148235e-01,
    -3.53155960776544875667e-01, 1.52530022733894777053e+00,
)
_K1_B = (
    -5.75674448366501715755e-18, 1.79405087314755922667e-17, -5.68946255844285935196e-17, 1.83809354436663880070e-16,
    -6.05704724837331885336e-16, 2.03870316562433424052e-15, -7.01983709041831346144e-15, 2.47715442448130437068e-14,
    -8.97670518232499435011e-14, 3.34841966607842919884e-13, -1.28917396095102890680e-12, 5.13963967348173025100e-12,
    -2.12996783842756842877e-11, 9.21831518760500529508e-11, -4.19035475934189648750e-10, 2.01504975519703286596e-09,
    -1.03457624656780970260e-08, 5.74108412545004946722e-08, -3.50196060308781257119e-07, 2.40648494783721712015e-06,
    -1.93619797416608296024e-05, 1.95215518471351631108e-04, -2.85781685962277938680e-03, 1.03923736576817238437e-01,
    2.72062619048444266945e+00,
)


def _chbevl(y: Any, coeffs: tuple[float, ...]) -> Any:
    """Cephes' Chebyshev series at ``y`` (torch's loop: ``a = y q - p + c``), ``(a - p) / 2``."""
    import jax.numpy as jnp

    p = q = jnp.zeros_like(y)
    a = jnp.full_like(y, coeffs[0])
    for c in coeffs[1:]:
        p, q = q, a
        a = y * q - p + c
    return 0.5 * (a - p)


def _scaled_k(x: Any, order: int) -> Any:
    import jax.numpy as jnp
    from jax.scipy import special

    x = x if jnp.issubdtype(x.dtype, jnp.floating) else x.astype(jnp.float32)
    small_x = jnp.where(x <= 2, x, 1)  # each branch on inputs it is defined for: no NaN through the other's gradient
    large_x = jnp.where(x > 2, x, 4)
    if order == 0:
        series = _chbevl(small_x * small_x - 2, _K0_A)
        small = (series - jnp.log(0.5 * small_x) * special.i0(small_x)) * jnp.exp(small_x)
        large = _chbevl(8 / large_x - 2, _K0_B) / jnp.sqrt(large_x)
    else:
        small = (jnp.log(0.5 * small_x) * special.i1(small_x) + _chbevl(small_x * small_x - 2, _K1_A) / small_x) \
            * jnp.exp(small_x)
        large = _chbevl(8 / large_x - 2, _K1_B) / jnp.sqrt(large_x)
    out = jnp.where(x <= 2, small, large)
    return jnp.where(x == 0, jnp.inf, jnp.where((x < 0) | jnp.isnan(x), jnp.nan, out)).astype(x.dtype)


def scaled_modified_bessel_k0(x: Any) -> Any:
    return _scaled_k(x, 0)


def scaled_modified_bessel_k1(x: Any) -> Any:
    return _scaled_k(x, 1)
