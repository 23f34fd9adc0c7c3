"""Cholesky (native `stablehlo.cholesky`), triangular solves (`stablehlo.triangular_solve`)
and what PyTorch builds on them: cholesky_solve, cholesky_inverse, and LAPACK potrf's `info`."""

from __future__ import annotations

import torch

from ...context import ir, stablehlo
from ... import ir as hlo
from ..helpers import (
    broadcast_shapes,
    broadcast_to,
    compare,
    conj,
    convert,
    dtype,
    full,
    iota,
    reshape,
    select,
    shape_of,
    transpose,
)
from ..registry import lowers
from ._builders import (
    _batch_broadcast,
    _check_dtype,
    _diagonal,
    _dynamic_slice_last,
    _expand_last,
    _eye,
    _is_empty,
    _mH,
    _real,
    _real_dtype,
    _to_complex,
    _tril,
    real_splat_like,
)

aten = torch.ops.aten


# -- Cholesky ----------------------------------------------------------------------------------------
def _cholesky_lower(a: ir.Value) -> tuple[ir.Value, ir.Value]:
    """(L, info): the lower Cholesky factor (upper triangle zeroed) and LAPACK potrf's
    info (see `_cholesky_info`)."""
    shape = shape_of(a)
    if _is_empty(shape):
        return a, full(0, torch.int32, shape[:-2])
    factor = stablehlo.CholeskyOp(a, lower=ir.BoolAttr.get(True), results=[a.type]).result
    return _tril(factor), _cholesky_info(a)


@lowers(aten.linalg_cholesky_ex.default)
def _linalg_cholesky_ex(ctx, self, *, upper=False, check_errors=False):
    _check_dtype(ctx, dtype(self))
    factor, info = _cholesky_lower(self)
    return (_mH(factor) if upper else factor), info


@lowers(aten.cholesky.default)
def _cholesky(ctx, self, upper=False):
    return _linalg_cholesky_ex(ctx, self, upper=upper)[0]


# -- triangular solves --------------------------------------------------------------------------------
def _trsm(a: ir.Value, b: ir.Value, *, left: bool, lower: bool, unit: bool, op: str = "NO_TRANSPOSE") -> ir.Value:
    """stablehlo.triangular_solve on equal batch dims: op(a) x = b (left) or
    x op(a) = b; only the `lower`/upper triangle of a is read."""
    if _is_empty(shape_of(b)):  # (a 0x0 a means an empty b)
        return b
    attr = ir.Attribute.parse(f"#stablehlo<transpose {op}>")
    return stablehlo.TriangularSolveOp(a, b, left, lower, unit, attr, results=[b.type]).result


def _broadcast_pair(a: ir.Value, b: ir.Value, out_dtype: torch.dtype) -> tuple[ir.Value, ir.Value]:
    """Converts both to `out_dtype` and broadcasts their batch dims together."""
    a, b = convert(a, out_dtype), convert(b, out_dtype)
    batch = broadcast_shapes(shape_of(a)[:-2], shape_of(b)[:-2])
    return _batch_broadcast(a, batch), _batch_broadcast(b, batch)


@lowers(aten.linalg_solve_triangular.default)
def _linalg_solve_triangular(ctx, self, B, *, upper, left=True, unitriangular=False):
    out = ctx.result_dtype()
    _check_dtype(ctx, out)
    a, b = _broadcast_pair(self, B, out)
    return _trsm(a, b, left=left, lower=not upper, unit=unitriangular)


@lowers(aten.triangular_solve.default)
def _triangular_solve(ctx, self, A, upper=True, transpose=False, unitriangular=False):
    out = ctx.result_dtype(0)
    _check_dtype(ctx, out)
    a, b = _broadcast_pair(A, self, out)
    op = "TRANSPOSE" if transpose else "NO_TRANSPOSE"
    return _trsm(a, b, left=True, lower=not upper, unit=unitriangular, op=op), a


def _cholesky_solve_impl(b: ir.Value, factor: ir.Value, upper: bool) -> ir.Value:
    """A^-1 b with A = L L^H (lower) or U^H U (upper)."""
    if upper:
        y = _trsm(factor, b, left=True, lower=False, unit=False, op="ADJOINT")
        return _trsm(factor, y, left=True, lower=False, unit=False)
    y = _trsm(factor, b, left=True, lower=True, unit=False)
    return _trsm(factor, y, left=True, lower=True, unit=False, op="ADJOINT")


@lowers(aten.cholesky_solve.default)
def _cholesky_solve(ctx, self, input2, upper=False):
    out = ctx.result_dtype()
    _check_dtype(ctx, out)
    factor, b = _broadcast_pair(input2, self, out)
    return _cholesky_solve_impl(b, factor, upper)


@lowers(aten.cholesky_inverse.default)
def _cholesky_inverse(ctx, self, upper=False):
    out = ctx.result_dtype()
    _check_dtype(ctx, out)
    factor = convert(self, out)
    return _cholesky_solve_impl(_eye(shape_of(factor), out), factor, upper)


def _cholesky_info(a: ir.Value) -> ir.Value:
    """LAPACK potrf's info for each matrix of the batch: 1 + the first k whose pivot
    a_kk - sum_j |l_kj|^2 is not positive (or NaN), else 0. XLA's Cholesky fills a
    failed factor with NaN entirely, so the failure point is found by an unblocked
    right-looking factorization of its own (dead code, removed by XLA, when the info
    output is unused, as under `torch.linalg.cholesky`)."""
    shape = shape_of(a)
    batch, n = shape[:-2], shape[-1]
    real = _real_dtype(dtype(a))

    def body(k, vals):
        x, info = vals
        col = reshape(_dynamic_slice_last(x, k), batch + [n])
        d = _real(reshape(_dynamic_slice_last(_diagonal(x), k), batch))
        bad = hlo.logical_not(compare(d, full(0, real, batch), "GT"))
        kk = broadcast_to(k, batch)
        info = select(hlo.logical_and(bad, compare(info, full(0, torch.int32, batch), "EQ")), hlo.add(kk, full(1, torch.int32, batch)), info)
        below = compare(iota(batch + [n], len(batch), torch.int32), broadcast_to(k, batch + [n]), "GT")
        l = select(below, hlo.div(col, _to_complex(broadcast_to(reshape(hlo.sqrt(d), batch + [1]), batch + [n]), dtype(a))), real_splat_like(0, col))
        outer = hlo.mul(_expand_last(l, n, -1), conj(_expand_last(l, n, -2)))
        x = hlo.sub(x, outer)
        return [x, info]

    return hlo.fori_loop(0, n, [a, full(0, torch.int32, batch)], body)[1]
