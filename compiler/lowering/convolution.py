"""Convolutions: `convolution` (1-d/2-d/3-d, strided, padded, dilated, grouped and
transposed), `_convolution`, and `convolution_backward`.

Everything is one `stablehlo.convolution`. The backward pass is derived from the
convolution algebra (as JAX's conv transpose rules do):

* a transposed convolution is a convolution of the stride-dilated input
  (`lhs_dilation`) with the spatially flipped kernel whose in/out channels are swapped
  within each group;
* the input gradient of a convolution is the transposed convolution of the output
  gradient (with the output padding that restores the input size), and the input
  gradient of a transposed convolution is the plain convolution of the output gradient;
* the weight gradient of a convolution correlates the input with the output gradient
  over the batch (the batch becomes the contracted feature dim, the channels the batch
  dim, `batch_group_count = groups`); a transposed convolution's weight gradient is the
  same with input and output gradient swapped.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from ..context import ir, stablehlo
from ..dtypes import tensor_type
from .helpers import convert, dtype, full, reduce, reshape, shape_of, transpose
from .helpers import rank_of as rank
from .padded import dynamic_dims, reject_when
from .registry import LoweringContext, lowers, Padding

aten = torch.ops.aten


def _expand(param: Sequence[int] | int, n: int) -> list[int]:
    """ATen expands a one-element stride/padding/dilation list to every spatial dim."""
    values = [int(param)] if isinstance(param, int) else [int(p) for p in param]
    return values * n if len(values) == 1 else values


def _dilated(size: int, dilation: int) -> int:
    return 0 if size == 0 else (size - 1) * dilation + 1


def conv_general(
    lhs: ir.Value,
    rhs: ir.Value,
    specs: tuple[str, str, str],
    *,
    strides: Sequence[int],
    padding: Sequence[tuple[int, int]],
    lhs_dilation: Sequence[int] | None = None,
    rhs_dilation: Sequence[int] | None = None,
    feature_groups: int = 1,
    batch_groups: int = 1,
    out_dtype: torch.dtype | None = None,
) -> ir.Value:
    """`stablehlo.convolution` with layouts given as strings over the operand dims:
    lhs letters `b` (batch), `f` (feature); rhs `o`, `i`; output `b`, `f`; spatial dims are
    digits, e.g. ("bf01", "oi01", "bf01") for NCHW x OIHW -> NCHW."""
    lhs_spec, rhs_spec, out_spec = specs
    n = len(lhs_spec) - 2
    lhs_dilation = list(lhs_dilation or [1] * n)
    rhs_dilation = list(rhs_dilation or [1] * n)
    ls, rs = shape_of(lhs), shape_of(rhs)
    spatial = []
    for d in range(n):
        size = _dilated(ls[lhs_spec.index(str(d))], lhs_dilation[d]) + padding[d][0] + padding[d][1]
        window = _dilated(rs[rhs_spec.index(str(d))], rhs_dilation[d])
        spatial.append(max(0, (size - window) // strides[d] + 1) if size >= window else 0)
    sizes = {"b": ls[lhs_spec.index("b")] // batch_groups, "f": rs[rhs_spec.index("o")]}
    out_shape = [sizes[c] if c in sizes else spatial[int(c)] for c in out_spec]
    fmt = lambda spec: "[" + ", ".join(spec) + "]"
    attr = ir.Attribute.parse(f"#stablehlo.conv<{fmt(lhs_spec)}x{fmt(rhs_spec)}->{fmt(out_spec)}>")
    out_dtype = out_dtype or dtype(lhs)
    return stablehlo.ConvolutionOp(
        tensor_type(out_shape, out_dtype),
        lhs,
        rhs,
        attr,
        feature_groups,
        batch_groups,
        window_strides=list(strides),
        padding=np.array(padding, dtype=np.int64).reshape(n, 2),
        lhs_dilation=lhs_dilation,
        rhs_dilation=rhs_dilation,
    ).result


def _specs(n: int) -> tuple[str, str, str]:
    digits = "".join(str(d) for d in range(n))
    return "bf" + digits, "oi" + digits, "bf" + digits


def _conv_forward(x, w, stride, padding, dilation, groups):
    """A plain convolution: x (N, Cin, *), w (Cout, Cin/g, *k)."""
    n = rank(x) - 2
    return conv_general(
        x, w, _specs(n), strides=stride, padding=[(p, p) for p in padding],
        rhs_dilation=dilation, feature_groups=groups,
    )


def _conv_transpose(x, w, stride, padding, dilation, output_padding, groups):
    """A transposed convolution: x (N, Cin, *), w (Cin, Cout/g, *k)."""
    n = rank(x) - 2
    ws = shape_of(w)
    cin, cout_g, kernel = ws[0], ws[1], ws[2:]
    # (Cin, Cout/g, k) -> (g, Cin/g, Cout/g, k) -> (g, Cout/g, Cin/g, k) -> (Cout, Cin/g, k)
    w = reshape(w, [groups, cin // groups, cout_g, *kernel])
    w = transpose(w, [0, 2, 1, *range(3, 3 + n)])
    w = reshape(w, [groups * cout_g, cin // groups, *kernel])
    w = stablehlo.ReverseOp(w, list(range(2, 2 + n))).result
    pads = []
    for d in range(n):
        edge = dilation[d] * (kernel[d] - 1) - padding[d]
        pads.append((edge, edge + output_padding[d]))
    return conv_general(
        x, w, _specs(n), strides=[1] * n, padding=pads, lhs_dilation=stride,
        rhs_dilation=dilation, feature_groups=groups,
    )


def _conv_weight_grad(x, gy, kernel, stride, padding, dilation, groups):
    """d(conv(x, w))/dw contracted with gy: gw (Cout, Cin/g, *kernel)."""
    n = rank(x) - 2
    xs, gs = shape_of(x), shape_of(gy)
    pads = []
    for d in range(n):
        lo = padding[d]
        hi = _dilated(gs[2 + d], stride[d]) - xs[2 + d] + _dilated(kernel[d], dilation[d]) - lo - 1
        pads.append((lo, hi))
    digits = "".join(str(d) for d in range(n))
    return conv_general(
        x, gy, ("fb" + digits, "io" + digits, "fb" + digits), strides=dilation, padding=pads,
        rhs_dilation=stride, batch_groups=groups,
    )


def _params(x, stride, padding, dilation, output_padding):
    n = rank(x) - 2
    return (_expand(stride, n), _expand(padding, n), _expand(dilation, n), _expand(output_padding, n))


def _add_bias(y, bias):
    bias = convert(bias, dtype(y))
    shape = shape_of(y)
    b = stablehlo.BroadcastInDimOp(tensor_type(shape, dtype(y)), bias, [1]).result
    return stablehlo.AddOp(y, b).result


# XLA rejects convolutions over a dynamic spatial dim ("Dynamic Spatial Convolution is not
# supported") and a dynamic kernel feature dim ("Dynamic output feature dim on convolution
# kernel is not supported"); batch-dynamic convolutions are fine.
def _dynamic_beyond_batch(ctx: LoweringContext, args, kwargs) -> bool:
    """Whether a tensor argument has a dynamic dim other than the batch dim of the
    input/grad_output (every dim of the weight counts)."""
    names = [a.name for a in ctx.node.target._schema.arguments]
    for position, name in enumerate(names[: len(ctx.node.args)]):
        if not isinstance(ctx.node.args[position], torch.fx.Node):
            continue
        first = 1 if name in ("input", "grad_output", "self") else 0
        if any(d >= first for d in dynamic_dims(ctx, position)):
            return True
    return False


_CONVOLUTION = {
    "dynamic": Padding.WINDOW,
    "dynamic_rule": reject_when(
        _dynamic_beyond_batch, "convolution with a dynamic dimension other than the batch"
    ),
}


@lowers(aten.convolution.default, **_CONVOLUTION)
def _convolution(ctx: LoweringContext, x, weight, bias, stride, padding, dilation, transposed,
                 output_padding, groups):
    if rank(x) < 3:
        raise ctx.fail(f"convolution needs a batched input of rank >= 3, got rank {rank(x)}")
    stride, padding, dilation, output_padding = _params(x, stride, padding, dilation, output_padding)
    if transposed:
        y = _conv_transpose(x, weight, stride, padding, dilation, output_padding, groups)
    else:
        y = _conv_forward(x, weight, stride, padding, dilation, groups)
    if bias is not None:
        y = _add_bias(y, bias)
    return y


@lowers(aten._convolution.default, **_CONVOLUTION)
def _convolution_full(ctx, x, weight, bias, stride, padding, dilation, transposed, output_padding, groups,
                      benchmark=False, deterministic=False, cudnn_enabled=True, allow_tf32=True):
    return _convolution(ctx, x, weight, bias, stride, padding, dilation, transposed, output_padding, groups)


@lowers(aten._convolution.deprecated, **_CONVOLUTION)
def _convolution_deprecated(ctx, x, weight, bias, stride, padding, dilation, transposed, output_padding,
                            groups, benchmark=False, deterministic=False, cudnn_enabled=True):
    return _convolution(ctx, x, weight, bias, stride, padding, dilation, transposed, output_padding, groups)


@lowers(aten.convolution_backward.default, **_CONVOLUTION)
def _convolution_backward(ctx: LoweringContext, grad_output, x, weight, bias_sizes, stride, padding,
                          dilation, transposed, output_padding, groups, output_mask):
    stride, padding, dilation, output_padding = _params(x, stride, padding, dilation, output_padding)
    n = rank(x) - 2
    kernel = shape_of(weight)[2:]
    grad_input = grad_weight = grad_bias = None
    if output_mask[0]:
        if transposed:
            grad_input = _conv_forward(grad_output, weight, stride, padding, dilation, groups)
        else:
            xs, gs = shape_of(x), shape_of(grad_output)
            # The output padding that makes the transposed convolution restore x's size.
            restore = [
                xs[2 + d] - ((gs[2 + d] - 1) * stride[d] - 2 * padding[d] + _dilated(kernel[d], dilation[d]))
                for d in range(n)
            ]
            grad_input = _conv_transpose(grad_output, weight, stride, padding, dilation, restore, groups)
    if output_mask[1]:
        if transposed:
            grad_weight = _conv_weight_grad(grad_output, x, kernel, stride, padding, dilation, groups)
        else:
            grad_weight = _conv_weight_grad(x, grad_output, kernel, stride, padding, dilation, groups)
    if output_mask[2]:
        dims = [d for d in range(rank(grad_output)) if d != 1]
        g = grad_output
        acc = torch.float32 if dtype(g) in (torch.float16, torch.bfloat16) else dtype(g)
        g = convert(g, acc)
        (grad_bias,) = reduce([g], [full(0, acc, [])], dims, lambda a, b: [stablehlo.AddOp(a[0], b[0]).result])
        grad_bias = convert(grad_bias, ctx.result_dtype(2))
    return grad_input, grad_weight, grad_bias



# conv_tbc (time-major) has no rule for a dynamic time dim: it runs in eager.
@lowers(aten.conv_tbc.default, dynamic=Padding.WINDOW)
def _conv_tbc(ctx: LoweringContext, x, weight, bias, pad=0):
    """Time-batch-channel 1-d convolution: x (T, B, Cin), weight (K, Cin, Cout)."""
    y = conv_general(x, weight, ("0bf", "0io", "0bf"), strides=[1], padding=[(pad, pad)])
    b = stablehlo.BroadcastInDimOp(tensor_type(shape_of(y), dtype(y)), convert(bias, dtype(y)), [2]).result
    return stablehlo.AddOp(y, b).result

