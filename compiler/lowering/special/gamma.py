"""Gamma-related functions: zeta, digamma, trigamma and polygamma, and the regularized
incomplete gamma functions igamma / igammac (calc_igamma / calc_igammac, after SciPy)."""

from __future__ import annotations

import math

import numpy as np
import torch

from ...context import ir, stablehlo
from ...dtypes import tensor_type
from ..helpers import array_constant, full
from ..registry import lowers
from .floating_point import _FLOAT_BITS, _bitcast_t
from . import _tables as tables
from ._values import (
    _NP,
    _T,
    _chain,
    _finish,
    _gt,
    _horner,
    _lit,
    _loop,
    _operands,
    _unary_rule,
    _where,
)
from .polynomials import _fallthrough

aten = torch.ops.aten


# -- zeta and polygamma --------------------------------------------------------------------
_MACHEP = 1.11022302462515654042e-16


def _zeta(x: _T, q: _T) -> _T:
    """Hurwitz zeta(x, q): Cephes' zeta as PyTorch's CPU kernel runs it, accumulating in
    double for float inputs too (its acc_type). CHLO's zeta differs from it for q <= 0.
    The direct sum runs until q + i > 9 (at least 9 terms) or converges; then the
    Euler-Maclaurin tail (at most 12 terms)."""
    out_dt = x.dtype
    x, q = x.to(torch.float64), q.to(torch.float64)
    q_int = q.eq(q.floor())
    domain = [
        (x.eq(1.0), math.inf),
        (x < 1.0, math.nan),
        ((q <= 0.0) & q_int, math.inf),
        ((q <= 0.0) & x.ne(x.floor()), math.nan),
    ]
    regular = _fallthrough(domain)
    # Outside the regular domain run on q = 10 so those elements stop after 9 steps.
    q = _where(regular, q, 10.0)
    s = _T(stablehlo.PowOp(q.v, (-x).v).result)
    zero = x.const(0.0)
    i = _T(full(0, torch.int32, x.shape))

    def step(state):
        i, a, b, s, _ = state
        i = i + 1
        a = a + 1.0
        b = _T(stablehlo.PowOp(a.v, (-x).v).result)
        s = s + b
        converged = (-_MACHEP * s < b) & (b < _MACHEP * s)
        more = ~converged & ((i < 9) | (a <= 9.0))
        return more, [i, a, b, s, converged]

    _, a, b, s, early = _loop(regular, [i, q, zero, s, regular & False], step)
    w = a
    s = s + b * w / (x - 1.0)
    s = s - 0.5 * b
    a = x.const(1.0)
    k = x.const(0.0)
    done = early
    for coeff in tables.ZETA_A:
        a = a * (x + k)
        b = b / w
        t = a * b / coeff
        s = _where(done, s, s + t)
        done = done | ((t / s).abs() < _MACHEP)
        k = k + 1.0
        a = a * (x + k)
        b = b / w
        k = k + 1.0
    return _chain(s, *domain).to(out_dt)


_DIGAMMA_A = (
    8.33333333333333333333e-2,
    -2.10927960927960927961e-2,
    7.57575757575757575758e-3,
    -4.16666666666666666667e-3,
    3.96825396825396825397e-3,
    -8.33333333333333333333e-3,
    8.33333333333333333333e-2,
)


def _digamma(x: _T) -> _T:
    """calc_digamma: reflection for x < 0 (its pi / tan(pi r) term in double, as the
    float kernel computes it), the recurrence up to x >= 10, then the asymptotic
    series. CHLO's digamma differs at 0 (PyTorch: -inf for +0, +inf for -0)."""
    negative = x < 0.0
    xp = _where(negative, 1.0 - x, x)
    result = x.const(0.0)
    for _ in range(10):  # x >= 0 reaches 10 within ten steps
        below = xp < 10.0
        result = _where(below, result - 1.0 / xp, result)
        xp = _where(below, xp + 1.0, xp)
    z = 1.0 / (xp * xp)
    y = _where(xp < 1.0e17, z * _horner(z, _DIGAMMA_A), 0.0)
    positive = _where(
        xp.eq(10.0), result + _lit(x, 2.25175258906672110764), result + xp.log() - 0.5 / xp - y
    )
    x64 = x.to(torch.float64)
    r = x64 - x64.trunc()  # modf's fractional part
    reflection = (math.pi / (r * math.pi).tan()).to(x.dtype)
    minus_inf_for_plus_zero = _where(_signbit_t(x), x.const(math.inf), -math.inf)
    return _chain(
        positive,
        (x.eq(0.0), minus_inf_for_plus_zero),
        (negative & x.eq(x.trunc()), math.nan),
        (negative, positive - reflection),
    )


def _signbit_t(x: _T) -> _T:
    return _bitcast_t(x, _FLOAT_BITS[x.dtype][0]) < 0


def _trigamma(x: _T) -> _T:
    """The kernel's trigamma: reflection below 1/2, six recurrence steps, then the
    asymptotic series."""
    f = _NP[x.dtype]
    pi = f(math.pi)
    reflect = x < 0.5
    sin_pi_x = (x * pi).sin()
    result = _where(reflect, -(pi * pi) / (sin_pi_x * sin_pi_x), 0.0)
    x = _where(reflect, 1.0 - x, x)
    for _ in range(6):
        result = result + 1.0 / (x * x)
        x = x + 1.0
    ixx = 1.0 / (x * x)
    result = (
        result
        + (
            1.0
            + 1.0 / (2.0 * x)
            + ixx * (f(1.0) / f(6.0) - ixx * (f(1.0) / f(30.0) - ixx * (f(1.0) / f(42.0))))
        )
        / x
    )
    return _where(reflect, -result, result)


def _polygamma(n: int, x: _T) -> _T:
    if n == 0:
        return _digamma(x)
    if n == 1:
        return _trigamma(x)
    # ((n % 2) ? 1 : -1) * exp(lgamma(n + 1)) * zeta(n + 1, x), the factor in T (n! is
    # exact up to the dtype's range, inf past it).
    with np.errstate(over="ignore"):
        factorial = _NP[x.dtype](float(math.factorial(n)) if n < 171 else math.inf)
    factor = factorial if n % 2 else -factorial
    return factor * _zeta(x.const(float(n + 1)), x)


@lowers(aten.special_zeta.default, aten.special_zeta.self_scalar, aten.special_zeta.other_scalar)
def _special_zeta(ctx, self, other):
    x, q = _operands(ctx, self, other)
    return _finish(ctx, _zeta(x, q))


# chlo.digamma returns NaN at 0 where PyTorch gives -inf (+0) / +inf (-0).
lowers(aten.digamma.default)(_unary_rule(_digamma))


@lowers(aten.polygamma.default)
def _polygamma_rule(ctx, n, self):
    if n < 0:
        raise ctx.fail(f"polygamma(n, x) does not support negative n (got {n})")
    (x,) = _operands(ctx, self)
    return _finish(ctx, _polygamma(n, x))


# -- regularized incomplete gamma functions (calc_igamma / calc_igammac, after SciPy) ------
class _IgammaConstants:
    def __init__(self, dt: torch.dtype) -> None:
        f64 = dt is torch.float64
        self.machep = 1.11022302462515654042e-16 if f64 else 5.9604644775390625e-8
        self.maxlog = 7.09782712893383996843e2 if f64 else 88.72283905206835
        self.big = 4.503599627370496e15 if f64 else 16777216.0
        self.biginv = 2.22044604925031308085e-16 if f64 else 5.9604644775390625e-8


_LANCZOS_G = 6.024680040776729583740234375
_IGAMMA_MAXITER = 2000


def _lanczos_sum_expg_scaled(a: _T) -> _T:
    """ratevl(a, num, 12, denom, 12): the rational function in a, or in 1/a for |a| > 1
    (the coefficients then run in reverse)."""
    small = _horner(a, tables.LANCZOS_NUM) / _horner(a, tables.LANCZOS_DENOM)
    y = 1.0 / a
    large = _horner(y, tables.LANCZOS_NUM[::-1]) / _horner(y, tables.LANCZOS_DENOM[::-1])
    return _where(a.abs() > 1.0, large, small)


def _igam_fac(a: _T, x: _T, k: _IgammaConstants) -> _T:
    """x^a e^{-x} / Gamma(a), through Lanczos' approximation where a ~ x."""
    ax = a * x.log() - x - a.lgamma()
    direct = _where(ax < -k.maxlog, 0.0, ax.exp())
    fac = a + _LANCZOS_G - 0.5
    res = (fac / _lit(a, 2.718281828459045)).sqrt() / _lanczos_sum_expg_scaled(a)
    moderate = res * ((a - x).exp() * _T(stablehlo.PowOp((x / fac).v, a.v).result))
    num = x - a - _LANCZOS_G + 0.5
    numfac = num / fac
    large = res * (a * ((numfac).log1p() - numfac) + x * (0.5 - _LANCZOS_G) / fac).exp()
    lanczos = _where((a < 200.0) & (x < 200.0), moderate, large)
    return _where((a - x).abs() > 0.4 * a.abs(), direct, lanczos)


def _igam_series(a: _T, x: _T, active: _T, k: _IgammaConstants) -> _T:
    """DLMF 8.11.4: the power series of the lower function."""
    ax = _igam_fac(a, x, k)
    one = a.const(1.0)

    def step(s):
        r, c, ans = s
        r = r + 1.0
        c = c * (x / r)
        ans = ans + c
        return ~(c <= k.machep * ans), [r, c, ans]

    _, _, ans = _loop(active & ax.ne(0.0) & ~ax.isnan(), [a, one, one], step, _IGAMMA_MAXITER)
    return _where(ax.eq(0.0), 0.0, ans * ax / a)


def _igamc_series(a: _T, x: _T, active: _T, k: _IgammaConstants) -> _T:
    """DLMF 8.7.3: the upper function from the series, avoiding cancellation."""
    zero = a.const(0.0)

    def step(s):
        n, fac, total = s
        n = n + 1.0
        fac = fac * (-x / n)
        term = fac / (a + n)
        total = total + term
        return ~(term.abs() <= k.machep * total.abs()), [n, fac, total]

    _, _, total = _loop(active, [zero, a.const(1.0), zero], step, _IGAMMA_MAXITER - 1)
    logx = x.log()
    term = -(a * logx - (1.0 + a).lgamma()).expm1()
    return term - (a * logx - a.lgamma()).exp() * total


def _igamc_continued_fraction(a: _T, x: _T, active: _T, k: _IgammaConstants) -> _T:
    """DLMF 8.9.2: the upper function's continued fraction."""
    ax = _igam_fac(a, x, k)
    y = 1.0 - a
    z = x + y + 1.0
    pkm1 = x + 1.0
    qkm1 = z * x
    ans = pkm1 / qkm1

    def step(s):
        c, y, z, pkm2, pkm1, qkm2, qkm1, ans = s
        c = c + 1.0
        y = y + 1.0
        z = z + 2.0
        yc = y * c
        pk = pkm1 * z - pkm2 * yc
        qk = qkm1 * z - qkm2 * yc
        nonzero = qk.ne(0.0)
        r = pk / qk
        t = _where(nonzero, ((ans - r) / r).abs(), 1.0)
        ans = _where(nonzero, r, ans)
        pkm2, pkm1, qkm2, qkm1 = pkm1, pk, qkm1, qk
        big = pk.abs() > k.big
        pkm2, pkm1, qkm2, qkm1 = (_where(big, v * k.biginv, v) for v in (pkm2, pkm1, qkm2, qkm1))
        return ~(t <= k.machep), [c, y, z, pkm2, pkm1, qkm2, qkm1, ans]

    init = [a.const(0.0), y, z, a.const(1.0), pkm1, x, qkm1, ans]
    *_, ans = _loop(active & ax.ne(0.0) & ~ax.isnan(), init, step, _IGAMMA_MAXITER)
    return _where(ax.eq(0.0), 0.0, ans * ax)


def _expand(x: _T, n: int) -> ir.Value:
    """x with a trailing dimension of size n (broadcast)."""
    shape = x.shape
    return stablehlo.BroadcastInDimOp(
        tensor_type(shape + [n], x.dtype), x.v, list(range(len(shape)))
    ).result


def _igam_asymptotic(a: _T, x: _T, lower: bool, k: _IgammaConstants) -> _T:
    """DLMF 8.12.3/8.12.4: Temme's uniform asymptotic expansion for large a ~ x. The
    coefficients c_k(eta) = sum_n d[k][n] eta^n of all 25 k are summed side by side
    along a trailing axis (each stopping at its own converged term), then the series
    in 1/a is summed in order with the kernel's two stopping rules."""
    f = _NP[a.dtype]
    rank = len(a.shape)
    lam = x / a
    sigma = (x - a) / a
    root = (-2.0 * (sigma.log1p() - sigma)).sqrt()
    eta = _chain(a.const(0.0), (lam > 1.0, root), (lam < 1.0, -root))
    sgn = -1.0 if lower else 1.0
    res = 0.5 * (sgn * eta * (a / 2.0).sqrt()).erfc()

    d = np.asarray(tables.IGAM_D, dtype=f)  # [k][n]
    kcount = d.shape[0]

    def column(n: int) -> _T:
        return _T(
            stablehlo.BroadcastInDimOp(
                tensor_type(a.shape + [kcount], a.dtype), array_constant(d[:, n], a.dtype), [rank]
            ).result
        )

    ck = column(0)
    going = _T(full(True, torch.bool, a.shape + [kcount]))
    etapow = eta
    for n in range(1, d.shape[1]):
        if n > 1:
            etapow = etapow * eta
        ckterm = column(n) * _T(_expand(etapow, kcount))
        new_ck = ck + ckterm
        ck = _where(going, new_ck, ck)
        going = going & ~(ckterm.abs() < k.machep * new_ck.abs())

    total = a.const(0.0)
    afac = a.const(1.0)
    absold = a.const(math.inf)
    going = _T(full(True, torch.bool, a.shape))
    for kk in range(kcount):
        ck_k = _T(
            stablehlo.ReshapeOp(
                tensor_type(a.shape, a.dtype),
                stablehlo.SliceOp(
                    ck.v, [0] * rank + [kk], a.shape + [kk + 1], [1] * (rank + 1)
                ).result,
            ).result
        )
        term = ck_k * afac
        absterm = term.abs()
        going = going & ~(absterm > absold)
        new_total = total + term
        total = _where(going, new_total, total)
        going = going & ~(absterm < k.machep * new_total.abs())
        absold = _where(going, absterm, absold)
        afac = _where(going, afac / a, afac)
    return (
        res
        + sgn
        * (-0.5 * a * eta * eta).exp()
        * total
        / (2.0 * f(math.pi).astype(np.float32).item() * a).sqrt()
    )


def _incomplete_gamma(a: _T, x: _T, *, lower: bool) -> _T:
    k = _IgammaConstants(a.dtype)
    nan = math.nan
    if lower:
        edges = [
            ((x < 0.0) | (a < 0.0), nan),
            (a.eq(0.0), _where(x > 0.0, a.const(1.0), nan)),
            (x.eq(0.0), 0.0),
            (a.isinf(), _where(x.isinf(), a.const(nan), 0.0)),
            (x.isinf(), 1.0),
        ]
    else:
        edges = [
            ((x < 0.0) | (a < 0.0), nan),
            (a.eq(0.0), _where(x > 0.0, a.const(0.0), nan)),
            (x.eq(0.0), 1.0),
            (a.isinf(), _where(x.isinf(), a.const(nan), 1.0)),
            (x.isinf(), 0.0),
        ]
    regular = _fallthrough(edges) & ~a.isnan() & ~x.isnan()
    absxma_a = (x - a).abs() / a
    asymptotic = ((a > 20.0) & (a < 200.0) & (absxma_a < 0.3)) | (
        (a > 200.0) & (absxma_a < 4.5 / a.sqrt())
    )
    rest = regular & ~asymptotic
    # Which helper each remaining element needs (calc_igammac's regimes).
    if lower:
        complement = (x > 1.0) & (x > a)
        use_series = rest & ~complement
        use_cf = rest & complement & _gt(x, 1.1)
        use_c_series = rest & complement & ~_gt(x, 1.1)
    else:
        high = _gt(x, 1.1)
        low = x <= 0.5
        series_first = _chain(x * 1.1 < a, (high, x < a), (low, -0.4 / x.log() < a))
        use_series = rest & series_first
        use_cf = rest & high & ~series_first
        use_c_series = rest & ~high & ~series_first
    series = _igam_series(a, x, use_series, k)
    cf = _igamc_continued_fraction(a, x, use_cf, k)
    c_series = _igamc_series(a, x, use_c_series, k)
    asym = _igam_asymptotic(a, x, lower, k)
    upper_value = _where(use_cf, cf, c_series)
    if lower:
        value = _chain(series, (asymptotic, asym), (use_cf | use_c_series, 1.0 - upper_value))
    else:
        value = _chain(upper_value, (asymptotic, asym), (use_series, 1.0 - series))
    # NaN operands fall through every test in the kernel and come out NaN.
    return _chain(value, *edges, (a.isnan() | x.isnan(), nan))


@lowers(aten.igamma.default)
def _igamma(ctx, self, other):
    a, x = _operands(ctx, self, other)
    return _finish(ctx, _incomplete_gamma(a, x, lower=True))


@lowers(aten.igammac.default)
def _igammac(ctx, self, other):
    a, x = _operands(ctx, self, other)
    return _finish(ctx, _incomplete_gamma(a, x, lower=False))
