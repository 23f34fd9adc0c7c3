"""Orthogonal polynomials (Math.h *_polynomial_*_forward): Chebyshev T/U/V/W and their
shifted forms, Hermite H/He, Laguerre L and Legendre P."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from ..helpers import broadcast_to, convert, full
from ..registry import LoweringContext, lowers
from ._values import _T, _any, _chain, _finish, _operands, _where, _while_values

aten = torch.ops.aten


# -- orthogonal polynomials (Math.h *_polynomial_*_forward) --------------------------------
class _Degree:
    """The degree operand as the kernels see it: `static_cast<int64_t>(n)` of the value in
    T. NaN, infinite and out-of-range degrees convert to a negative int64 on the x86
    hosts eager runs on (and hermite_polynomial_h maps them to -1 explicitly), so they
    all become -1 here: the polynomial is then 0."""

    def __init__(self, n: _T) -> None:
        valid = n.isfinite() & (n.abs() < float(2.0**63))
        self.i = _where(
            valid, _T(convert(_where(valid, n, 0.0).v, torch.int64)), -1
        )  # trunc toward 0
        self.dtype = n.dtype

    def t(self, offset: int = 0) -> _T:
        """`n + offset` (int64 arithmetic) converted to T."""
        return (self.i + offset if offset else self.i).to(self.dtype)

    def even(self) -> _T:
        return (self.i % 2).eq(0)

    def odd_negated(self, value: _T) -> _T:
        """`n % 2 == 0 ? value : -value`."""
        return _where(self.even(), value, -value)


def _recurrence(
    x: _T,
    regime: _T,
    first_k: int,
    last_k: _T,
    init: Sequence[_T],
    step,
    *,
    stop_at_nan: bool,
) -> _T:
    """The kernels' `for (k = first_k; k <= last_k [&& !isnan(q)]; k++) { r = step(k, p, q);
    p = q; q = r; }` per element, for the elements in `regime`; returns r."""
    counter = _T(full(first_k, torch.int64, []))

    def live(k: _T, q: _T) -> _T:
        going = regime & (_T(broadcast_to(k.v, x.shape)) <= last_k)
        return going & ~q.isnan() if stop_at_nan else going

    def cond(vals):
        k, _, q, _ = vals
        return _any(live(k, q))

    def body(vals):
        k, p, q, r = vals
        active = live(k, q)
        kt = _T(broadcast_to(k.to(x.dtype).v, x.shape))
        new_r = step(kt, p, q)
        return [k + 1, _where(active, q, p), _where(active, new_r, q), _where(active, new_r, r)]

    _, _, _, r = _while_values([counter, *init], cond, body)
    return r


def _two_n_plus_1(n: _Degree) -> _T:
    return (n.i + n.i + 1).to(n.dtype)


def _plus_minus_one(n: _Degree, like: _T) -> _T:
    """`n % 2 == 0 ? 1 : -1`."""
    return _where(n.even(), like.const(1.0), -1.0)


def _fallthrough(cases) -> _T:
    """Where none of an if-chain's conditions hold (the code after the chain runs)."""
    mask = None
    for cond, _ in cases:
        mask = ~cond if mask is None else mask & ~cond
    return mask


def _chebyshev_loop(x: _T, n: _Degree, two_y: _T, q1: _T, regime: _T) -> _T:
    """`p = 1; q = q1; for (k = 2; k <= n && !isnan(q); k++) { r = two_y * q - p; ... }`."""
    return _recurrence(
        x,
        regime,
        2,
        n.i,
        [x.const(1.0), q1, q1],
        lambda k, p, q: two_y * q - p,
        stop_at_nan=True,
    )


def _trig_u(y: _T, n: _Degree) -> _T:
    """U_n(y) = sin((n+1) acos y) / sin(acos y), or its limit where sin(acos y) is 0."""
    theta = y.acos()
    s = theta.sin()
    return _where(s.ne(0.0), (n.t(1) * theta).sin() / s, n.t(1) * (n.t(1) * theta).cos() / y)


def _trig_v(y: _T, n: _Degree) -> _T:
    theta = y.acos()
    half = theta / 2.0
    return _where(
        half.sin().ne(1.0),
        ((n.t() + 0.5) * theta).cos() / half.cos(),
        n.odd_negated(_two_n_plus_1(n)),
    )


def _trig_w(y: _T, n: _Degree, fallback: _T) -> _T:
    theta = y.acos()
    half = theta / 2.0
    return _where(half.cos().ne(1.0), ((n.t() + 0.5) * theta).sin() / half.sin(), fallback)


def _chebyshev_t(x: _T, n: _Degree) -> _T:
    unit = x.abs().eq(1.0)
    cases = [
        (n.i < 0, 0.0),
        (unit, _where((x > 0.0) | n.even(), x.const(1.0), -1.0)),
        ((n.i > 6) & (x.abs() < 1.0), (n.t() * x.acos()).cos()),
        (n.i.eq(0), 1.0),
        (n.i.eq(1), x),
    ]
    return _chain(_chebyshev_loop(x, n, x + x, x, _fallthrough(cases)), *cases)


def _chebyshev_u(x: _T, n: _Degree) -> _T:
    unit = x.abs().eq(1.0)
    cases = [
        (n.i < 0, 0.0),
        (unit, _where((x > 0.0) | n.even(), n.t(1), -n.t(1))),
        ((n.i > 8) & (x.abs() < 1.0), _trig_u(x, n)),
        (n.i.eq(0), 1.0),
        (n.i.eq(1), x + x),
    ]
    return _chain(_chebyshev_loop(x, n, x + x, x + x, _fallthrough(cases)), *cases)


def _chebyshev_v(x: _T, n: _Degree) -> _T:
    unit = x.abs().eq(1.0)
    cases = [
        (n.i < 0, 0.0),
        (unit, _where(x > 0.0, x.const(1.0), n.odd_negated(_two_n_plus_1(n)))),
        ((n.i > 8) & (x.abs() < 1.0), _trig_v(x, n)),
        (n.i.eq(0), 1.0),
        (n.i.eq(1), x + x - 1.0),
    ]
    return _chain(_chebyshev_loop(x, n, x + x, x + x - 1.0, _fallthrough(cases)), *cases)


def _chebyshev_w(x: _T, n: _Degree) -> _T:
    unit = x.abs().eq(1.0)
    at_unit = _where(x > 0.0, _two_n_plus_1(n), _plus_minus_one(n, x))
    cases = [
        (n.i < 0, 0.0),
        (unit, at_unit),
        ((n.i > 8) & (x.abs() < 1.0), _trig_w(x, n, at_unit)),
        (n.i.eq(0), 1.0),
        (n.i.eq(1), x + x + 1.0),
    ]
    return _chain(_chebyshev_loop(x, n, x + x, x + x + 1.0, _fallthrough(cases)), *cases)


def _shifted_chebyshev_t(x: _T, n: _Degree) -> _T:
    y = x + x - 1.0
    cases = [
        (n.i < 0, 0.0),
        (x.eq(1.0), 1.0),
        (x.eq(0.0), _plus_minus_one(n, x)),
        ((n.i > 6) & (y.abs() < 1.0), (n.t() * y.acos()).cos()),
        (n.i.eq(0), 1.0),
        (n.i.eq(1), y),
    ]
    return _chain(_chebyshev_loop(x, n, y + y, y, _fallthrough(cases)), *cases)


def _shifted_chebyshev_u(x: _T, n: _Degree) -> _T:
    y = x + x - 1.0
    cases = [
        (n.i < 0, 0.0),
        (x.eq(1.0), n.t(1)),
        (x.eq(0.0), n.odd_negated(n.t(1))),
        ((n.i > 6) & (y.abs() < 1.0), _trig_u(y, n)),
        (n.i.eq(0), 1.0),
        (n.i.eq(1), y + y),
    ]
    return _chain(_chebyshev_loop(x, n, y + y, y + y, _fallthrough(cases)), *cases)


def _shifted_chebyshev_v(x: _T, n: _Degree) -> _T:
    y = x + x - 1.0
    cases = [
        (n.i < 0, 0.0),
        (x.eq(1.0), 1.0),
        (x.eq(0.0), n.odd_negated(_two_n_plus_1(n))),
        ((n.i > 6) & (y.abs() < 1.0), _trig_v(y, n)),
        (n.i.eq(0), 1.0),
        (n.i.eq(1), y + y - 1.0),
    ]
    return _chain(_chebyshev_loop(x, n, y + y, y + y - 1.0, _fallthrough(cases)), *cases)


def _shifted_chebyshev_w(x: _T, n: _Degree) -> _T:
    y = x + x - 1.0
    cases = [
        (n.i < 0, 0.0),
        (x.eq(1.0), _two_n_plus_1(n)),
        (x.eq(0.0), _plus_minus_one(n, x)),
        ((n.i > 4) & (y.abs() < 1.0), _trig_w(y, n, _plus_minus_one(n, x))),
        (n.i.eq(0), 1.0),
        (n.i.eq(1), y + y + 1.0),
    ]
    return _chain(_chebyshev_loop(x, n, y + y, y + y + 1.0, _fallthrough(cases)), *cases)


def _hermite_limit(x: _T) -> int:
    return 128 if x.dtype is torch.float32 else 512


def _hermite_h(x: _T, n: _Degree) -> _T:
    # for (k = 2; k < n + n; k += 2): r = (x + x) * q - k * p, i.e. k = 2j, j = 1 .. n-1.
    two_x = x + x
    cases = [
        (n.i < 0, 0.0),
        (n.i.eq(0), 1.0),
        (n.i.eq(1), two_x),
        (n.i > _hermite_limit(x), math.nan),
    ]

    def step(j, p, q):
        return two_x * q - (j + j) * p

    init = [x.const(1.0), two_x, x.const(0.0)]
    r = _recurrence(x, _fallthrough(cases), 1, n.i - 1, init, step, stop_at_nan=False)
    return _chain(r, *cases)


def _hermite_he(x: _T, n: _Degree) -> _T:
    cases = [(n.i < 0, 0.0), (n.i.eq(0), 1.0), (n.i.eq(1), x), (n.i > _hermite_limit(x), math.nan)]
    r = _recurrence(
        x,
        _fallthrough(cases),
        1,
        n.i - 1,
        [x.const(1.0), x, x],
        lambda k, p, q: x * q - k * p,
        stop_at_nan=False,
    )
    return _chain(r, *cases)


def _laguerre_l(x: _T, n: _Degree) -> _T:
    one_minus_x = 1.0 - x
    cases = [(n.i < 0, 0.0), (x.abs().eq(0.0), 1.0), (n.i.eq(0), 1.0), (n.i.eq(1), one_minus_x)]

    def step(k, p, q):
        return (((k + k) + one_minus_x) * q - k * p) / (k + 1.0)

    r = _recurrence(
        x,
        _fallthrough(cases),
        1,
        n.i - 1,
        [x.const(1.0), one_minus_x, one_minus_x],
        step,
        stop_at_nan=True,
    )
    return _chain(r, *cases)


def _legendre_p(x: _T, n: _Degree) -> _T:
    cases = [
        (n.i < 0, 0.0),
        (x.abs().eq(1.0), _where((x > 0.0) | n.even(), x.const(1.0), -1.0)),
        (n.i.eq(0), 1.0),
        (n.i.eq(1), x),
    ]

    def step(k, p, q):
        return ((k + k + 1.0) * x * q - k * p) / (k + 1.0)

    r = _recurrence(
        x, _fallthrough(cases), 1, n.i - 1, [x.const(1.0), x, x], step, stop_at_nan=True
    )
    return _chain(r, *cases)


_POLYNOMIALS = {
    aten.special_chebyshev_polynomial_t: _chebyshev_t,
    aten.special_chebyshev_polynomial_u: _chebyshev_u,
    aten.special_chebyshev_polynomial_v: _chebyshev_v,
    aten.special_chebyshev_polynomial_w: _chebyshev_w,
    aten.special_shifted_chebyshev_polynomial_t: _shifted_chebyshev_t,
    aten.special_shifted_chebyshev_polynomial_u: _shifted_chebyshev_u,
    aten.special_shifted_chebyshev_polynomial_v: _shifted_chebyshev_v,
    aten.special_shifted_chebyshev_polynomial_w: _shifted_chebyshev_w,
    aten.special_hermite_polynomial_h: _hermite_h,
    aten.special_hermite_polynomial_he: _hermite_he,
    aten.special_laguerre_polynomial_l: _laguerre_l,
    aten.special_legendre_polynomial_p: _legendre_p,
}


def _polynomial_rule(fn):
    def rule(ctx: LoweringContext, x, n):
        xt, nt = _operands(ctx, x, n)
        return _finish(ctx, fn(xt, _Degree(nt)))

    rule.__name__ = fn.__name__
    return rule


for _packet, _fn in _POLYNOMIALS.items():
    lowers(_packet.default, _packet.x_scalar, _packet.n_scalar)(_polynomial_rule(_fn))
