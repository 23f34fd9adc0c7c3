"""ATen's opmath convention (float16/bfloat16 compute in float32 and round once at the end)
and the formula shorthands the pointwise, activations, losses and distances families share."""

from __future__ import annotations

import torch

from ..context import ir, stablehlo
from .helpers import (
    absolute,
    add,
    div,
    exp,
    constant_like,
    log,
    log1p,
    logical_and,
    logical_or,
    maximum,
    minimum,
    mul,
    neg,
    sign,
    sub,
    broadcast_to,
    compare,
    convert,
    dtype,
    full,
    reduce,
)
from .registry import LoweringContext


# -- small builders -----------------------------------------------------------------------------------
def _opmath(dt: torch.dtype) -> torch.dtype:
    return torch.float32 if dt in (torch.float16, torch.bfloat16) else dt


# Formula shorthands shared with the other families (helpers.py).
_c = constant_like
_add, _sub, _mul, _div = add, sub, mul, div
_and, _or, _max, _min = logical_and, logical_or, maximum, minimum
_abs, _exp, _log, _log1p, _neg, _sign = absolute, exp, log, log1p, neg, sign


def _cmp(a, b, direction: str):
    return compare(a, b, direction)


def _isnan(x):
    return compare(x, x, "NE")


def _conj(x):
    if not dtype(x).is_complex:
        return x
    return stablehlo.ComplexOp(stablehlo.RealOp(x).result, _neg(stablehlo.ImagOp(x).result)).result


def _inputs(ctx: LoweringContext, *args, compute: torch.dtype | None = None):
    """The tensor/scalar arguments as values of the compute dtype (opmath of the result
    dtype) broadcast to the result shape; returns (values, result dtype)."""
    out = ctx.result_dtype()
    cdt = compute or _opmath(out)
    shape = ctx.result_shape()
    values = []
    for a in args:
        if isinstance(a, ir.Value):
            values.append(broadcast_to(convert(a, cdt), shape))
        else:
            values.append(full(a, cdt, shape))
    return values, out


def _log_sigmoid(x: ir.Value) -> tuple[ir.Value, ir.Value]:
    """(log_sigmoid(x), exp(-|x|)) = (min(0, x) - log1p(exp(-|x|)), buffer)."""
    z = _exp(_neg(_abs(x)))
    return _sub(_min(_c(0, x), x), _log1p(z)), z


def _sum_dim(x: ir.Value, dim: int) -> ir.Value:
    (result,) = reduce([x], [full(0, dtype(x), [])], [dim], lambda acc, new: [_add(acc[0], new[0])])
    return result
