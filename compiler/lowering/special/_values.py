"""The special family's building blocks: `_T`, an elementwise value whose Python operators
build StableHLO ops; kernels' `if` chains as select cascades (`_chain`); their
data-dependent loops as `stablehlo.while` loops (`_loop`, `_while_values` over
compiler.ir's `while_loop`); and the dtype plumbing of a rule (`_operands`, `_finish`,
`_unary_rule`)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
import torch

from ...context import chlo, ir, stablehlo
from ... import ir as hlo
from ...dtypes import tensor_type
from ..helpers import broadcast_to, convert, dtype, full, is_value, rank_of, reduce, shape_of
from ..registry import LoweringContext


_NP = {torch.float32: np.float32, torch.float64: np.float64}


# -- an elementwise value with arithmetic operators ----------------------------------------
class _T:
    """An elementwise tensor whose Python operators build StableHLO ops. A Python number
    on either side becomes a splat constant of this value's dtype and shape (rounded
    to the dtype the way a C++ literal converted to `T` is). Ports of the C++ kernels
    read like the kernels this way."""

    __slots__ = ("v",)

    def __init__(self, v: ir.Value) -> None:
        self.v = v

    @property
    def dtype(self) -> torch.dtype:
        return dtype(self.v)

    @property
    def shape(self) -> list[int]:
        return shape_of(self.v)

    def const(self, c) -> _T:
        return _T(full(c, self.dtype, self.shape))

    def _o(self, other) -> ir.Value:
        if isinstance(other, _T):
            return other.v
        return full(other, self.dtype, self.shape)

    def to(self, dt: torch.dtype) -> _T:
        return _T(convert(self.v, dt))

    # arithmetic
    def __add__(self, o):
        return _T(stablehlo.AddOp(self.v, self._o(o)).result)

    def __radd__(self, o):
        return _T(stablehlo.AddOp(self._o(o), self.v).result)

    def __sub__(self, o):
        return _T(stablehlo.SubtractOp(self.v, self._o(o)).result)

    def __rsub__(self, o):
        return _T(stablehlo.SubtractOp(self._o(o), self.v).result)

    def __mul__(self, o):
        return _T(stablehlo.MulOp(self.v, self._o(o)).result)

    def __rmul__(self, o):
        return _T(stablehlo.MulOp(self._o(o), self.v).result)

    def __truediv__(self, o):
        return _T(stablehlo.DivOp(self.v, self._o(o)).result)

    def __rtruediv__(self, o):
        return _T(stablehlo.DivOp(self._o(o), self.v).result)

    def __neg__(self):
        return _T(stablehlo.NegOp(self.v).result)

    def __mod__(self, o):
        return _T(stablehlo.RemOp(self.v, self._o(o)).result)

    # comparisons (bool results); == and != stay Python's, use eq()/ne()
    def _cmp(self, o, direction: str) -> _T:
        kind = (
            "FLOAT"
            if self.dtype.is_floating_point
            else ("UNSIGNED" if self.dtype is torch.bool else "SIGNED")
        )
        return _T(
            stablehlo.CompareOp(
                self.v,
                self._o(o),
                ir.Attribute.parse(f"#stablehlo<comparison_direction {direction}>"),
                compare_type=ir.Attribute.parse(f"#stablehlo<comparison_type {kind}>"),
                results=[tensor_type(self.shape, torch.bool)],
            ).result
        )

    def __lt__(self, o):
        return self._cmp(o, "LT")

    def __le__(self, o):
        return self._cmp(o, "LE")

    def __gt__(self, o):
        return self._cmp(o, "GT")

    def __ge__(self, o):
        return self._cmp(o, "GE")

    def eq(self, o) -> _T:
        return self._cmp(o, "EQ")

    def ne(self, o) -> _T:
        return self._cmp(o, "NE")

    # boolean logic
    def __and__(self, o):
        return _T(stablehlo.AndOp(self.v, self._o(o)).result)

    def __or__(self, o):
        return _T(stablehlo.OrOp(self.v, self._o(o)).result)

    def __invert__(self):
        return _T(stablehlo.NotOp(self.v).result)

    # math
    def _un(self, op_class) -> _T:
        return _T(op_class(self.v).result)

    def abs(self):
        return self._un(stablehlo.AbsOp)

    def exp(self):
        return self._un(stablehlo.ExpOp)

    def expm1(self):
        return self._un(stablehlo.Expm1Op)

    def log(self):
        return self._un(stablehlo.LogOp)

    def log1p(self):
        return self._un(stablehlo.Log1pOp)

    def sqrt(self):
        return self._un(stablehlo.SqrtOp)

    def sin(self):
        return self._un(stablehlo.SineOp)

    def cos(self):
        return self._un(stablehlo.CosineOp)

    def tan(self):
        return self._un(stablehlo.TanOp)

    def acos(self):
        return self._un(chlo.AcosOp)

    def floor(self):
        return self._un(stablehlo.FloorOp)

    def lgamma(self):
        return self._un(chlo.LgammaOp)

    def erfc(self):
        return self._un(chlo.ErfcOp)

    def trunc(self):
        return self.abs().floor() * self._un(stablehlo.SignOp)

    def isnan(self):
        return self.ne(self)

    def isinf(self):
        return self.abs().eq(math.inf)

    def isfinite(self):
        return self._un(stablehlo.IsFiniteOp)


def _where(cond: _T, a, b) -> _T:
    """select(cond, a, b); either branch may be a Python number."""
    ref = a if isinstance(a, _T) else b
    return _T(stablehlo.SelectOp(cond.v, ref._o(a), ref._o(b)).result)


def _chain(default, *cases) -> _T:
    """An `if (c1) return v1; else if (c2) return v2; ... else return default` chain:
    `cases` are (condition, value) pairs, first match wins."""
    result = default
    for cond, value in reversed(cases):
        result = _where(cond, value, result)
    return result


def _lit(x: _T, c: float):
    """The C++ literal `T(c)`: `c` rounded to x's dtype (numpy does the rounding)."""
    return _NP[x.dtype](c)


def _lt(x: _T, c: float) -> _T:
    """`x < c` for a double constant `c` compared exactly (the C++ comparison promotes a
    float `x` to double): against float32 `x`, `c` is replaced by the float32 threshold
    that splits the floats the same way."""
    if x.dtype is torch.float64 or float(np.float32(c)) == c:
        return x < c
    cf = np.float32(c)
    return x <= cf if float(cf) < c else x < cf


def _gt(x: _T, c: float) -> _T:
    if x.dtype is torch.float64 or float(np.float32(c)) == c:
        return x > c
    cf = np.float32(c)
    return x >= cf if float(cf) > c else x > cf


def _horner(z: _T, coeffs: Sequence[float]) -> _T:
    """`r = 0; for c in coeffs: r = r * z + c` (Cephes' polevl; highest power first)."""
    r = z.const(coeffs[0])
    for c in coeffs[1:]:
        r = r * z + c
    return r


def _chbevl(x: _T, coeffs: Sequence[float]) -> _T:
    """Cephes' chbevl: the Chebyshev series sum at x via Clenshaw's recurrence."""
    b0, b1, b2 = x.const(coeffs[0]), None, None
    for c in coeffs[1:]:
        b2, b1 = b1, b0
        t = x * b1
        if b2 is not None:
            t = t - b2
        b0 = t + c
    return (b0 - b2) * 0.5 if b2 is not None else b0 * 0.5


# -- loops ---------------------------------------------------------------------------------
def _any(mask: _T) -> ir.Value:
    """A 0-d bool: whether any element of `mask` is true."""
    if rank_of(mask.v) == 0:
        return mask.v
    false = full(False, torch.bool, [])
    (out,) = reduce(
        [mask.v],
        [false],
        list(range(rank_of(mask.v))),
        lambda acc, new: [stablehlo.OrOp(acc[0], new[0]).result],
    )
    return out


def _while_values(
    init: Sequence[_T],
    cond: Callable[[list[_T]], ir.Value],
    body: Callable[[list[_T]], Sequence[_T]],
) -> list[_T]:
    """compiler.ir's `while_loop` over `_T` values: `cond(values)` returns a 0-d bool,
    `body(values)` the next values."""
    results = hlo.while_loop(
        [v.v for v in init],
        lambda values: cond([_T(a) for a in values]),
        lambda values: [o.v for o in body([_T(a) for a in values])],
    )
    return [_T(r) for r in results]


def _loop(
    active: _T,
    state: Sequence[_T],
    step: Callable[[list[_T]], tuple[_T, Sequence[_T]]],
    max_iter: int | None = None,
) -> list[_T]:
    """Runs a per-element loop: while any element is `active`, `step(state)` gives
    (still_active, new_state) computed for every element; elements that were active
    take the new state, the others keep theirs (they have left their loop). With
    `max_iter`, at most that many steps run (the kernels' MAXITER)."""
    counter = _T(full(0, torch.int32, []))

    def cond(vals):
        going = _any(vals[1])
        if max_iter is None:
            return going
        return stablehlo.AndOp(going, (vals[0] < max_iter).v).result

    def body(vals):
        i, act, *st = vals
        more, new = step(st)
        st = [_where(act, n, s) for n, s in zip(new, st)]
        return [i + 1, act & more, *st]

    out = _while_values([counter, active, *state], cond, body)
    return out[2:]


# -- dtype plumbing ------------------------------------------------------------------------
def _compute_dtype(out: torch.dtype) -> torch.dtype:
    """The dtype PyTorch's CPU kernel computes in: double for double, float otherwise
    (the kernels upcast half/bfloat16 to float; integer inputs promote to float)."""
    return torch.float64 if out is torch.float64 else torch.float32


def _operands(ctx: LoweringContext, *args) -> list[_T]:
    """The tensor/scalar operands in the compute dtype, broadcast to the result shape."""
    out_dt = ctx.result_dtype()
    cd = _compute_dtype(out_dt)
    shape = ctx.result_shape()
    # Operands are first converted to the result dtype (TensorIterator's common dtype),
    # which is what the kernel sees, then to the compute dtype.
    return [
        _T(
            convert(
                convert(broadcast_to(a, shape), out_dt) if is_value(a) else full(a, out_dt, shape),
                cd,
            )
        )
        for a in args
    ]


def _finish(ctx: LoweringContext, r: _T) -> ir.Value:
    return convert(r.v, ctx.result_dtype())


def _unary_rule(fn: Callable[[_T], _T]):
    def rule(ctx: LoweringContext, x):
        (t,) = _operands(ctx, x)
        return _finish(ctx, fn(t))

    rule.__name__ = fn.__name__
    rule.__module__ = __name__
    return rule
