"""Bessel functions of the first and second kind, the Airy function Ai, the spherical Bessel
j0 and the modified Bessel functions (i0/i0e/i1/i1e, k0/k1 and their scaled forms),
after PyTorch's Math.h (Cephes)."""

from __future__ import annotations

import math

import numpy as np
import torch

from ..registry import lowers
from . import _tables as tables
from ._values import _NP, _T, _chain, _chbevl, _horner, _lit, _loop, _unary_rule, _where

aten = torch.ops.aten


# -- Bessel functions of the first and second kind (Math.h bessel_{j,y}{0,1}_forward) ------
_PIO4 = 0.785398163397448309615660845819875721
_3PIO4 = 2.356194490192344928846982537459627163
_SQ2OPI = 0.797884560802865355879892119868763737
_TWOOPI = 0.636619772367581343075535053490057448


def _j0_small(x: _T) -> _T:
    """bessel_j0 for 0 <= x <= 5."""
    xx = x * x
    rp, rq = _horner(xx, tables.J0_RP), _horner(xx, tables.J0_RQ)
    series = (xx - 5.78318596294678452118e00) * (x * x - 3.04712623436620863991e01) * rp / rq
    return _where(x < 0.00001, 1.0 - x * x / 4.0, series)


def _bessel_asymptotic(x: _T, w: _T, t: dict, phase: float, kind: str) -> _T:
    """The large-x forms: (P cos(x - phase) -/+ 5/x Q sin(x - phase)) sqrt(2/pi) / sqrt(x),
    with the rational functions P, Q evaluated in `w` (25/x^2, spelled as each kernel
    does)."""
    pp, pq, qp, qq = (_horner(w, t[k]) for k in ("PP", "PQ", "QP", "QQ"))
    s = (x - phase).sin()
    c = (x - phase).cos()
    p = pp / pq
    q = 5.0 / x * (qp / qq)
    if kind == "j":
        value = p * c - q * s
    else:
        value = p * s + q * c
    return value * _SQ2OPI / x.sqrt()


def _table(prefix: str) -> dict:
    return {k[len(prefix) :]: getattr(tables, k) for k in dir(tables) if k.startswith(prefix)}


def _bessel_j0(x: _T) -> _T:
    x = x.abs()
    large = _bessel_asymptotic(x, 25.0 / (x * x), _table("J0_"), _PIO4, "j")
    return _where(x <= 5.0, _j0_small(x), large)


def _j1_nonnegative(x: _T) -> _T:
    xx = x * x
    rp, rq = _horner(xx, tables.J1_RP), _horner(xx, tables.J1_RQ)
    small = rp / rq * x * (x * x - 1.46819706421238932572e01) * (x * x - 4.92184563216946036703e01)
    large = _bessel_asymptotic(x, 5.0 / x * (5.0 / x), _table("J1_"), _3PIO4, "j")
    return _where(x <= 5.0, small, large)


def _bessel_j1(x: _T) -> _T:
    # The kernel recurses: j1(x) = -j1(-x) for x < 0.
    magnitude = _j1_nonnegative(x.abs())
    return _where(x < 0.0, -magnitude, magnitude)


def _bessel_y0(x: _T) -> _T:
    xx = x * x
    small = _horner(xx, tables.Y0_YP) / _horner(xx, tables.Y0_YQ) + _TWOOPI * x.log() * _bessel_j0(
        x
    )
    large = _bessel_asymptotic(x, 25.0 / (x * x), _table("Y0_"), _PIO4, "y")
    return _chain(large, (x.eq(0.0), -math.inf), (x < 0.0, math.nan), (x <= 5.0, small))


def _bessel_y1(x: _T) -> _T:
    xx = x * x
    small = x * (_horner(xx, tables.Y1_YP) / _horner(xx, tables.Y1_YQ)) + _TWOOPI * (
        _bessel_j1(x) * x.log() - 1.0 / x
    )
    large = _bessel_asymptotic(x, 5.0 / x * (5.0 / x), _table("Y1_"), _3PIO4, "y")
    return _chain(large, (x.eq(0.0), -math.inf), (x <= 0.0, math.nan), (x <= 5.0, small))


# -- Airy Ai (airy_ai_forward) -------------------------------------------------------------
def _airy_ai(x: _T) -> _T:
    c = 5.64189583547756286948e-01
    pi = float(np.float32(math.pi)) if x.dtype is torch.float32 else math.pi

    # x < -2.09: the oscillating asymptotic form (inputs outside the branch are mapped
    # to -3 so nothing overflows).
    neg_x = _where(x < -2.09, x, -3.0)
    zeta_n = -2.0 * neg_x * (-neg_x).sqrt() / 3.0
    z = 1.0 / zeta_n
    zz = z * z
    afn, afd = _horner(zz, tables.AIRY_AFN), _horner(zz, tables.AIRY_AFD)
    agn, agd = _horner(zz, tables.AIRY_AGN), _horner(zz, tables.AIRY_AGD)
    t = zeta_n + _lit(x, 0.25) * _lit(x, pi)
    negative = (
        c
        / (-neg_x).sqrt().sqrt()
        * (t.sin() * (1.0 + z * z * afn / afd) - t.cos() * (z * agn / agd))
    )

    # x >= 2.09: the decaying asymptotic form.
    pos_x = _where(x >= 2.09, x, 3.0)
    zeta_p = 2.0 * pos_x * pos_x.sqrt() / 3.0
    w = 1.0 / zeta_p
    an, ad = _horner(w, tables.AIRY_AN), _horner(w, tables.AIRY_AD)
    positive = c * (an / ad) / (2.0 * pos_x.sqrt().sqrt() * zeta_p.exp())

    # |x| < 2.09: the Maclaurin series, summed until the term is below epsilon.
    # (NaN takes this branch in the kernel too, and its loop stops after one step.)
    mid = ~((x < -2.09) | (x >= 2.09))
    xm = _where(mid, x, 0.0)
    eps = float(torch.finfo(x.dtype).eps)
    z3 = xm * xm * xm
    one = xm.const(1.0)

    def step(s):
        f, g, k, m, n = s
        m = m * z3
        k = k + 1.0
        m = m / k
        n = n * z3
        k = k + 1.0
        n = n / k
        m = m / k
        f = f + m
        k = k + 1.0
        n = n / k
        g = g + n
        return (m / f).abs() > eps, [f, g, k, m, n]

    f, g, *_ = _loop(mid, [one, xm, one, one, xm], step)
    series = _lit(x, 0.355028053887817239260) * f - _lit(x, 0.258819403792806798405) * g

    return _chain(
        series,
        (x.isinf(), math.nan),
        (x > 103.892, 0.0),
        (x < -2.09, negative),
        (x >= 2.09, positive),
    )


# -- spherical Bessel j0 -------------------------------------------------------------------
def _spherical_bessel_j0(x: _T) -> _T:
    f = _NP[x.dtype]
    xx = x * x
    # The kernel's T(1.0) / T(6.0) etc. are divisions in T.
    r = xx * (f(1.0) / f(6227020800.0))
    for d, sign in ((39916800.0, -1.0), (362880.0, 1.0), (5040.0, -1.0), (120.0, 1.0), (6.0, -1.0)):
        r = xx * (r + f(sign) / f(d))
    series = 1.0 + r
    return _chain(x.sin() / x, (x.isinf(), 0.0), (x.abs() < 0.5, series))


# -- modified Bessel functions (calc_i0/i0e/i1/i1e and modified_bessel_*_forward) ----------
def _i1e_tables(x: _T):
    if x.dtype is torch.float64:
        return tables.I1E_A_F64, tables.I1E_B_F64
    return tables.I1E_A_F32, tables.I1E_B_F32


def _i0(x: _T) -> _T:
    a = x.abs()
    small = a.exp() * _chbevl(a / 2.0 - 2.0, tables.I0E_A)
    large = a.exp() * _chbevl(32.0 / a - 2.0, tables.I0E_B) / a.sqrt()
    return _where(a <= 8.0, small, large)


def _i0e(x: _T) -> _T:
    a = x.abs()
    small = _chbevl(a / 2.0 - 2.0, tables.I0E_A)
    large = _chbevl(32.0 / a - 2.0, tables.I0E_B) / a.sqrt()
    return _where(a <= 8.0, small, large)


def _i1(x: _T) -> _T:
    a = x.abs()
    ta, tb = _i1e_tables(x)
    small = a.exp() * a * _chbevl(a / 2.0 - 2.0, ta)
    large = a.exp() * _chbevl(32.0 / a - 2.0, tb) / a.sqrt()
    out = _where(a <= 8.0, small, large)
    return _where(x < 0.0, -out, out)


def _i1e(x: _T) -> _T:
    a = x.abs()
    ta, tb = _i1e_tables(x)
    small = _chbevl(a / 2.0 - 2.0, ta) * a
    large = _chbevl(32.0 / a - 2.0, tb) / a.sqrt()
    out = _where(a <= 8.0, small, large)
    return _where(x < 0.0, -out, out)


def _modified_bessel_i0(x: _T) -> _T:
    a = x.abs()
    small = a.exp() * _chbevl(a / 2.0 - 2.0, tables.MI0_A)
    large = a.exp() * _chbevl(32.0 / a - 2.0, tables.MI0_B) / a.sqrt()
    return _where(a <= 8.0, small, large)


def _modified_bessel_i1(x: _T) -> _T:
    a = x.abs()
    small = _chbevl(a / 2.0 - 2.0, tables.MI1_A) * a * a.exp()
    large = a.exp() * _chbevl(32.0 / a - 2.0, tables.MI1_B) / a.sqrt()
    out = _where(a <= 8.0, small, large)
    return _where(x < 0.0, -out, out)


def _k_small_series(x: _T, coeffs) -> _T:
    return _chbevl(x * x - 2.0, coeffs)


def _k_large_series(x: _T, coeffs) -> _T:
    return _chbevl(8.0 / x - 2.0, coeffs)


def _k_edge(x: _T, value: _T) -> _T:
    return _chain(value, (x.eq(0.0), math.inf), (x < 0.0, math.nan))


def _modified_bessel_k0(x: _T) -> _T:
    small = _k_small_series(x, tables.MK0_A) - (x * 0.5).log() * _modified_bessel_i0(x)
    large = (-x).exp() * _k_large_series(x, tables.MK0_B) / x.sqrt()
    return _k_edge(x, _where(x <= 2.0, small, large))


def _modified_bessel_k1(x: _T) -> _T:
    small = (x * 0.5).log() * _modified_bessel_i1(x) + _k_small_series(x, tables.MK1_A) / x
    large = (-x).exp() * _k_large_series(x, tables.MK1_B) / x.sqrt()
    return _k_edge(x, _where(x <= 2.0, small, large))


def _scaled_modified_bessel_k0(x: _T) -> _T:
    small = (_k_small_series(x, tables.MK0_A) - (x * 0.5).log() * _modified_bessel_i0(x)) * x.exp()
    large = _k_large_series(x, tables.MK0_B) / x.sqrt()
    return _k_edge(x, _where(x <= 2.0, small, large))


def _scaled_modified_bessel_k1(x: _T) -> _T:
    small = (
        (x * 0.5).log() * _modified_bessel_i1(x) + _k_small_series(x, tables.MK1_A) / x
    ) * x.exp()
    large = _k_large_series(x, tables.MK1_B) / x.sqrt()
    return _k_edge(x, _where(x <= 2.0, small, large))


# -- registrations ---------------------------------------------------------------------------
_UNARY = {
    aten.special_airy_ai.default: _airy_ai,
    aten.special_bessel_j0.default: _bessel_j0,
    aten.special_bessel_j1.default: _bessel_j1,
    aten.special_bessel_y0.default: _bessel_y0,
    aten.special_bessel_y1.default: _bessel_y1,
    aten.special_spherical_bessel_j0.default: _spherical_bessel_j0,
    aten.i0.default: _i0,
    aten.special_i0e.default: _i0e,
    aten.special_i1.default: _i1,
    aten.special_i1e.default: _i1e,
    aten.special_modified_bessel_i0.default: _modified_bessel_i0,
    aten.special_modified_bessel_i1.default: _modified_bessel_i1,
    aten.special_modified_bessel_k0.default: _modified_bessel_k0,
    aten.special_modified_bessel_k1.default: _modified_bessel_k1,
    aten.special_scaled_modified_bessel_k0.default: _scaled_modified_bessel_k0,
    aten.special_scaled_modified_bessel_k1.default: _scaled_modified_bessel_k1,
}
for _op, _fn in _UNARY.items():
    lowers(_op)(_unary_rule(_fn))
