"""Special functions torchax lowers wrongly or not at all, as torch's CPU kernels compute them: ``polygamma``, the
Bessel family as Cephes, the orthogonal polynomials by their recurrence (each element stopping at its own ``n``)."""
from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable
from typing import Any

import torch

from neuron_args.lazy_modules import jax, jnp
from neuron_args.lowering.gradients import lowered_op

aten = torch.ops.aten


@functools.cache
def cot_derivative(n: int) -> tuple[int, ...]:
    """Coefficients (constant first) of ``P`` with ``d^n/dy^n cot(y) = P(cot(y))``: ``P_{k+1} = -(1 + c^2) P_k'``."""
    p = [0, 1]
    for _ in range(n):
        dp = [i * a for i, a in enumerate(p)][1:] or [0]
        out = [0] * (len(dp) + 2)
        for i, a in enumerate(dp):
            out[i] -= a
            out[i + 2] -= a
        p = out
    return tuple(p)


def trigamma(x: Any) -> Any:
    """``polygamma(1, x)`` as torch's CPU kernel computes it (its reflection below 0.5, six steps up, then the
    asymptotic series), so compiled and eager agree where eager's ``sin(pi * x)`` itself rounds."""
    pi = jnp.asarray(math.pi, x.dtype)
    reflect = x < 0.5
    sin_pi_x = jnp.sin(pi * x)
    result = jnp.where(reflect, -(pi * pi) / (sin_pi_x * sin_pi_x), 0).astype(x.dtype)
    x = jnp.where(reflect, 1 - x, x)
    for _ in range(6):
        result = result + 1 / (x * x)
        x = x + 1
    ixx = 1 / (x * x)
    result = result + (1 + 1 / (2 * x) + ixx * (1 / 6 - ixx * (1 / 30 - ixx * (1 / 42)))) / x
    return jnp.where(reflect, -result, result)


def polygamma(n: int, x: Any) -> Any:
    """``aten.polygamma(n, x)`` in ``x``'s floating dtype (integers: float32); below 0.5, where jax's Hurwitz zeta is
    wrong (n=1 at -8.48: 7.74, torch 9.80), ``psi_n(x) = (-1)^n psi_n(1 - x) - pi^(n+1) cot^(n)(pi x)``."""
    if not isinstance(n, int) or n < 0:
        raise ValueError(f"polygamma's order must be a non-negative Python int, got {n!r}")
    x = x if jnp.issubdtype(x.dtype, jnp.floating) else x.astype(jnp.float32)
    dtype = x.dtype
    x = x.astype(jnp.promote_types(dtype, jnp.float32))  # half types: computed in float32, rounded once
    if n == 0:  # eager's digamma: -inf at +0 (+inf at -0)
        return jnp.where(x == 0, jnp.copysign(jnp.inf, -x), jax.scipy.special.digamma(x)).astype(dtype)
    if n == 1:
        return trigamma(x).astype(dtype)
    reflect = x < 0.5
    right = jax.lax.polygamma(jnp.asarray(n, x.dtype), jnp.where(reflect, 1 - x, x))
    r = x - jnp.round(x)  # cot has period pi: reduced first, so pi * r keeps its precision for large |x|
    # cot(pi r) through tan of the smaller angle, so cot(pi / 2) is 0, not cos(pi / 2) rounded
    a = jnp.abs(r)
    c = jnp.where(a <= 0.25, 1 / jnp.tan(jnp.pi * r), jnp.sign(r) * jnp.tan(jnp.pi * (0.5 - a)))
    reflected = (-1) ** n * right - math.pi ** (n + 1) * _horner(c, reversed(cot_derivative(n)))
    pole = (x <= 0) & ((r == 0) | jnp.isinf(x))  # eager: zeta(n + 1, q) is inf at every non-positive integer q
    out = jnp.where(pole, jnp.inf if n % 2 else -jnp.inf, jnp.where(reflect, reflected, right))
    return out.astype(dtype)


_K0_B = (
    5.30043377268626276149e-18, -1.64758043015242134646e-17, 5.21039150503902756861e-17, -1.67823109680541210385e-16,
    5.51205597852431940784e-16, -1.84859337734377901440e-15, 6.34007647740507060557e-15, -2.22751332699166985548e-14,
    8.03289077536357521100e-14, -2.98009692317273043925e-13, 1.14034058820847496303e-12, -4.51459788337394416547e-12,
    1.85594911495471785253e-11, -7.95748924447710747776e-11, 3.57739728140030116597e-10, -1.69753450938905987466e-09,
    8.57403401741422608519e-09, -4.66048989768794782956e-08, 2.76681363944501510342e-07, -1.83175552271911948767e-06,
    1.39498137188764993662e-05, -1.28495495816278026384e-04, 1.56988388573005337491e-03, -3.14481013119645005427e-02,
    2.44030308206595545468e+00,
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
    p = q = jnp.zeros_like(y)
    a = jnp.full_like(y, coeffs[0])
    for c in coeffs[1:]:
        p, q = q, a
        a = y * q - p + c
    return 0.5 * (a - p)


def scaled_modified_bessel_k(x: Any, order: int) -> Any:
    """``scaled_modified_bessel_k0`` (``order`` 0) or ``k1`` (1), as torch's Cephes kernels: torchax's ``K`` times
    ``exp(x)`` up to 2, the scaled series beyond (where ``K`` underflows and ``K * exp(x)`` is 0 * inf)."""
    x = x if jnp.issubdtype(x.dtype, jnp.floating) else x.astype(jnp.float32)
    small_x = jnp.where(x <= 2, x, 1)  # each branch on inputs it is defined for: no NaN through the other's gradient
    large_x = jnp.where(x > 2, x, 4)
    unscaled = aten.special_modified_bessel_k1.default if order else aten.special_modified_bessel_k0.default
    small = lowered_op(unscaled)(small_x) * jnp.exp(small_x)
    large = _chbevl(8 / large_x - 2, _K1_B if order else _K0_B) / jnp.sqrt(large_x)
    out = jnp.where(x <= 2, small, large)
    return jnp.where(x == 0, jnp.inf, jnp.where((x < 0) | jnp.isnan(x), jnp.nan, out)).astype(x.dtype)


#: Cephes' rational approximations of ``airy_ai`` (torch's ``airy_ai_forward``): x >= 2.09 (AN/AD) and x < -2.09
#: (AFN/AFD, AGN/AGD)
_AN = (
    3.46538101525629032477e-01, 1.20075952739645805542e+01, 7.62796053615234516538e+01, 1.68089224934630576269e+02,
    1.59756391350164413639e+02, 7.05360906840444183113e+01, 1.40264691163389668864e+01, 9.99999999999999995305e-01,
)
_AD = (
    5.67594532638770212846e-01, 1.47562562584847203173e+01, 8.45138970141474626562e+01, 1.77318088145400459522e+02,
    1.64234692871529701831e+02, 7.14778400825575695274e+01, 1.40959135607834029598e+01, 1.00000000000000000470e+00,
)
_AFN = (
    -1.31696323418331795333e-01, -6.26456544431912369773e-01, -6.93158036036933542233e-01,
    -2.79779981545119124951e-01, -4.91900132609500318020e-02, -4.06265923594885404393e-03,
    -1.59276496239262096340e-04, -2.77649108155232920844e-06, -1.67787698489114633780e-08,
)
_AFD = (
    1.33560420706553243746e+01, 3.26825032795224613948e+01, 2.67367040941499554804e+01, 9.18707402907259625840e+00,
    1.47529146771666414581e+00, 1.15687173795188044134e-01, 4.40291641615211203805e-03, 7.54720348287414296618e-05,
    4.51850092970580378464e-07,
)
_AGN = (
    1.97339932091685679179e-02, 3.91103029615688277255e-01, 1.06579897599595591108e+00, 9.39169229816650230044e-01,
    3.51465656105547619242e-01, 6.33888919628925490927e-02, 5.85804113048388458567e-03, 2.82851600836737019778e-04,
    6.98793669997260967291e-06, 8.11789239554389293311e-08, 3.41551784765923618484e-10,
)
_AGD = (
    9.30892908077441974853e+00, 1.98352928718312140417e+01, 1.55646628932864612953e+01, 5.47686069422975497931e+00,
    9.54293611618961883998e-01, 8.64580826352392193095e-02, 4.12656523824222607191e-03, 1.01259085116509135510e-04,
    1.17166733214413521882e-06, 4.91834570062930015649e-09,
)


def _horner(y: Any, coeffs: Iterable[float]) -> Any:
    """The polynomial with ``coeffs`` (highest power first) at ``y``."""
    total = 0.0
    for c in coeffs:
        total = total * y + c
    return total


def airy_ai(x: Any) -> Any:
    """``special.airy_ai`` as torch computes it: the rational forms beyond +-2.09 and the power series (to
    float32's epsilon, each element stopping at its own term) inside."""
    x = x if jnp.issubdtype(x.dtype, jnp.floating) else x.astype(jnp.float32)
    eps = jnp.finfo(x.dtype).eps
    neg = jnp.where(x < -2.09, x, -4.0)  # each branch on the inputs it is defined for
    z = 1.0 / (-2.0 * neg * jnp.sqrt(-neg) / 3.0)
    zz = z * z
    t = -2.0 * neg * jnp.sqrt(-neg) / 3.0 + 0.25 * jnp.pi
    negative = 5.64189583547756286948e-01 / jnp.sqrt(jnp.sqrt(-neg)) * (
        jnp.sin(t) * (1.0 + zz * _horner(zz, _AFN) / _horner(zz, _AFD))
        - jnp.cos(t) * (z * _horner(zz, _AGN) / _horner(zz, _AGD)))
    pos = jnp.where(x >= 2.09, x, 4.0)
    zeta = 2.0 * pos * jnp.sqrt(pos) / 3.0
    positive = 5.64189583547756286948e-01 * (_horner(1.0 / zeta, _AN) / _horner(1.0 / zeta, _AD)) / (
        2.0 * jnp.sqrt(jnp.sqrt(pos)) * jnp.exp(zeta))
    small = jnp.where((x >= -2.09) & (x < 2.09), x, 0.0)
    f, g, k, m, n, term = (jnp.ones_like(small), small, jnp.ones_like(small), jnp.ones_like(small), small,
                           jnp.ones_like(small))
    cube = small * small * small
    for _ in range(40):  # |x| < 2.09 converges in fewer steps; an element whose term is below eps stops
        active = term > eps  # Cephes' step: m and n each divided by the next two values of k
        m2 = m * cube / (k + 1.0) / (k + 2.0)
        n2 = n * cube / (k + 2.0) / (k + 3.0)
        f2 = f + m2
        g2 = g + n2
        f, g, k, m, n = (jnp.where(active, new, old) for new, old in ((f2, f), (g2, g), (k + 3.0, k), (m2, m), (n2, n)))
        term = jnp.where(active, jnp.abs(m2 / f2), term)
    series = 0.355028053887817239260 * f - 0.258819403792806798405 * g
    out = jnp.where(x < -2.09, negative, jnp.where(x >= 2.09, positive, series))
    out = jnp.where(x > 103.892, 0.0, out)
    return jnp.where(jnp.isinf(x) | jnp.isnan(x), jnp.nan, out).astype(x.dtype)


def _operands(x: Any, n: Any) -> tuple[Any, Any]:
    """``x`` as a float array (integers: float32), ``n`` truncated to integers (torch's ``int64_t`` cast), broadcast."""
    x, n = jnp.asarray(x), jnp.asarray(n)
    x = x if jnp.issubdtype(x.dtype, jnp.floating) else x.astype(jnp.float32)
    n = n if jnp.issubdtype(n.dtype, jnp.integer) else jnp.trunc(n)
    return jnp.broadcast_arrays(x, n.astype(jnp.int32))


def _recurrence(x: Any, n: Any, first: Any, step: Callable[[Any, Any, Any], Any]) -> Any:
    """``q_n`` from ``q_0 = 1``, ``q_1 = first`` and ``q_k = step(k, q_{k-2}, q_{k-1})`` for ``2 <= k <= n``."""
    def body(state: tuple[Any, Any, Any]) -> tuple[Any, Any, Any]:
        k, p, q = state
        active = k <= n
        r = step(k.astype(x.dtype), p, q)
        return k + 1, jnp.where(active, q, p), jnp.where(active, r, q)

    start = (jnp.asarray(2, jnp.int32), jnp.ones_like(x), first)
    _, _, q = jax.lax.while_loop(lambda s: s[0] <= jnp.max(n, initial=0), body, start)
    return jnp.where(n == 0, 1, q)


def _select(default: Any, *cases: tuple[Any, Any]) -> Any:
    """The first case whose condition holds (torch's early returns, in order), else ``default``."""
    out = default
    for cond, value in reversed(cases):
        out = jnp.where(cond, value, out)
    return out


def legendre_polynomial_p(x: Any, n: Any) -> Any:
    x, n = _operands(x, n)
    end = jnp.where((x > 0) | (n % 2 == 0), 1.0, -1.0)
    # torch's loop index k runs 1 .. n-1: step k here is its k - 1
    rec = _recurrence(x, n, x, lambda k, p, q: ((k + k - 1) * x * q - (k - 1) * p) / k)
    return _select(rec, (n < 0, 0.0), (jnp.abs(x) == 1, end)).astype(x.dtype)


def _chebyshev(x: Any, n: Any, kind: str, *, shifted: bool) -> Any:
    """Chebyshev ``kind`` (t, u, v, w) of ``x``, or of ``2x - 1`` when ``shifted``, as torch's kernel: the values at
    the interval's ends, the trigonometric form inside it for large ``n``, else the recurrence."""
    x, n = _operands(x, n)
    nf = n.astype(x.dtype)
    y = x + x - 1 if shifted else x
    a = jnp.arccos(y)
    sign = jnp.where(n % 2 == 1, -1.0, 1.0)
    two_n1 = nf + nf + 1
    if kind == "t":
        at_one, at_minus_one, first = 1.0, sign, y
        trig = jnp.cos(nf * a)
    elif kind == "u":
        at_one, at_minus_one, first = nf + 1, sign * (nf + 1), y + y
        trig = jnp.where(jnp.sin(a) != 0, jnp.sin((nf + 1) * a) / jnp.sin(a), (nf + 1) * jnp.cos((nf + 1) * a) / y)
    elif kind == "v":
        at_one, at_minus_one, first = 1.0, sign * two_n1, y + y - 1
        trig = jnp.where(jnp.sin(a / 2) != 1, jnp.cos((nf + 0.5) * a) / jnp.cos(a / 2), sign * two_n1)
    else:  # where cos(a / 2) rounds to 1, torch's unshifted kernel returns the value at 1 (x > 0 there)
        at_one, at_minus_one, first = two_n1, sign, y + y + 1
        trig = jnp.where(jnp.cos(a / 2) != 1, jnp.sin((nf + 0.5) * a) / jnp.sin(a / 2),
                         sign if shifted else jnp.where(x > 0, two_n1, sign))
    big = 8 if not shifted else 4 if kind == "w" else 6
    return _select(
        _recurrence(x, n, first, lambda k, p, q: (y + y) * q - p),
        (n < 0, 0.0), (x == 1, at_one), (x == (0 if shifted else -1), at_minus_one),
        ((n > big) & (jnp.abs(y) < 1), trig),
    ).astype(x.dtype)


#: the ``torch.special`` names lowered here (``aten::special_<name>``, every overload: tensor or scalar x and n)
ORTHOGONAL: dict[str, Callable[..., Any]] = {
    "chebyshev_polynomial_v": functools.partial(_chebyshev, kind="v", shifted=False),
    "chebyshev_polynomial_w": functools.partial(_chebyshev, kind="w", shifted=False),
    "legendre_polynomial_p": legendre_polynomial_p,
    **{f"shifted_chebyshev_polynomial_{kind}": functools.partial(_chebyshev, kind=kind, shifted=True)
       for kind in "tuvw"},
}
