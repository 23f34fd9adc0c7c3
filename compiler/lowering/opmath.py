"""ATen's opmath convention, shared by the pointwise, activations, losses, distances,
reduction, normalization, pooling, resampling and embedding families: float16/bfloat16
compute (and accumulate) in float32 and round once at the end."""

from __future__ import annotations

import torch

from .. import ir as hlo
from ..context import ir
from .helpers import broadcast_to, constant_like, convert, full
from .registry import LoweringContext


def opmath_dtype(dt: torch.dtype) -> torch.dtype:
    """The dtype PyTorch's CPU kernels compute and accumulate `dt` in: float32 for the
    16-bit floats, `dt` itself otherwise."""
    return torch.float32 if dt in (torch.float16, torch.bfloat16) else dt


def to_opmath(t: torch.Tensor | None) -> torch.Tensor | None:
    """A torch tensor in its opmath dtype (for decompositions written with torch ops; None
    stays None)."""
    return t if t is None else t.to(opmath_dtype(t.dtype))


def opmath_operands(ctx: LoweringContext, *args, compute: torch.dtype | None = None):
    """The tensor/scalar arguments as values of the compute dtype (opmath of the result
    dtype, or `compute`) broadcast to the result shape; returns (values, result dtype)."""
    out = ctx.result_dtype()
    cdt = compute or opmath_dtype(out)
    shape = ctx.result_shape()
    values = []
    for a in args:
        if isinstance(a, ir.Value):
            values.append(broadcast_to(convert(a, cdt), shape))
        else:
            values.append(full(a, cdt, shape))
    return values, out


def log_sigmoid_parts(x: ir.Value) -> tuple[ir.Value, ir.Value]:
    """(log_sigmoid(x), exp(-|x|)) = (min(0, x) - log1p(exp(-|x|)), the buffer the
    backward of log_sigmoid reuses)."""
    z = hlo.exp(hlo.neg(hlo.absolute(x)))
    return hlo.sub(hlo.minimum(constant_like(0, x), x), hlo.log1p(z)), z
