"""Scaled dot-product attention.

On CPU, `F.scaled_dot_product_attention` reaches the graph as
`_scaled_dot_product_flash_attention_for_cpu` (make_fx and aot_autograd alike; a bool
mask is first turned into an additive float mask by `where`), and its backward as
`_scaled_dot_product_flash_attention_for_cpu_backward`. Both are lowered whole, as
softmax(Q K^T * scale + mask) V with dot_general, returning the logsumexp the schema
has. Grouped-query attention (fewer K/V heads than Q heads) is handled by grouping the
query heads over the K/V heads inside dot_general, without repeating K and V.

Numerics follow the CPU flash kernel: scores, softmax and the output accumulate in f32
for f16/bf16 inputs (the probabilities are rounded to the input type before the P V
product, as the kernel does; the backward's four matmuls likewise take P and dS rounded to
the input type), the causal mask is top-left aligned (query i sees keys
j <= i), and a fully masked row yields 0 with logsumexp 0 instead of NaN. A compiled graph
rounds the scores to the input type first where the user allows reduced-precision
attention (`scores_rounded`).
`_scaled_dot_product_efficient_attention` (what a CUDA trace holds) shares the forward.
"""

from __future__ import annotations

import math

import torch

from torch_tpu.core import config, kernel_slots

from ..context import ir, stablehlo
from ..dtypes import tensor_type
from .helpers import compare, convert, dtype, full, reduce, reshape, select, shape_of
from .linear import dot_general
from .padded import arg_position, dynamic_dims, reject_when, schema_arg, symbolic_arg
from .registry import LoweringContext, lowers, Padding

aten = torch.ops.aten

_REDUCED = (torch.float16, torch.bfloat16)


def _acc(dt: torch.dtype) -> torch.dtype:
    return torch.float32 if dt in _REDUCED else dt


def _bcast(value: ir.Value, shape, dims) -> ir.Value:
    return stablehlo.BroadcastInDimOp(tensor_type(shape, dtype(value)), value, list(dims)).result


def _row_reduce(x: ir.Value, op_class, init) -> ir.Value:
    dt = dtype(x)
    (out,) = reduce([x], [full(init, dt, [])], [len(shape_of(x)) - 1], lambda a, b: [op_class(a[0], b[0]).result])
    return out


class _Heads:
    """Shapes of one attention call: q (B, Hq, L, E), k (B, Hk, S, E), v (B, Hk, S, Ev),
    with Hq = Hk * G."""

    def __init__(self, ctx: LoweringContext, q, k, v):
        for name, t in (("query", q), ("key", k), ("value", v)):
            if len(shape_of(t)) != 4:
                raise ctx.fail(f"attention expects 4-d (batch, heads, seq, dim) {name}, got {shape_of(t)}")
        self.b, self.hq, self.l, self.e = shape_of(q)
        _, self.hk, self.s, _ = shape_of(k)
        self.ev = shape_of(v)[3]
        if self.hk == 0 or self.hq % self.hk:
            raise ctx.fail(f"query heads ({self.hq}) must be a multiple of key/value heads ({self.hk})")
        self.g = self.hq // self.hk

    def grouped(self, x: ir.Value) -> ir.Value:
        """(B, Hq, L, X) -> (B, Hk, G, L, X)."""
        s = shape_of(x)
        return reshape(x, [self.b, self.hk, self.g, s[2], s[3]])

    def flat(self, x: ir.Value) -> ir.Value:
        """(B, Hk, G, L, X) -> (B, Hq, L, X)."""
        s = shape_of(x)
        return reshape(x, [self.b, self.hq, s[3], s[4]])


def _scale_value(scale, e: int) -> float:
    return float(scale) if scale is not None else 1.0 / math.sqrt(e)


def reduced_precision_allowed() -> bool:
    """`torch.backends.cuda.allow_fp16_bf16_reduction_math_sdp(True)`: PyTorch's switch that
    lets attention reduce in 16 bits (its math backend's; off by default)."""
    return torch._C._get_math_sdp_allow_fp16_bf16_reduction()


def scores_rounded(ctx: LoweringContext) -> bool:
    """Whether a compiled graph's attention rounds Q K^T to the inputs' dtype before the
    softmax (which still runs in float32), as the user allows with
    `reduced_precision_allowed()`: the scores JAX's reference attention computes, stored in
    half the bytes (on the chip, the 4-layer training step at 512 tokens 16.25 ms against
    17.10, 22nd session). Compiled graphs only: their programs are keyed by the switch
    (`_precision_identity`), an eager op's are not, so eager attention keeps float32 scores
    whatever the switch says (a permission, not a requirement)."""
    return ctx.node is not None and reduced_precision_allowed()


def _scores(ctx, heads: _Heads, q, k, attn_mask, is_causal, scale) -> ir.Value:
    """scale * Q K^T + mask, with causal/bool masking as -inf: (B, Hk, G, L, S) in the
    accumulation type (Q K^T rounded to q's dtype first where `scores_rounded()`)."""
    dt = dtype(q)
    acc = _acc(dt)
    rounded = dt in _REDUCED and scores_rounded(ctx)
    s = dot_general(heads.grouped(q), k, ([4], [3]), ([0, 1], [0, 1]), out_dtype=dt if rounded else acc)
    s = convert(s, acc)
    shape = shape_of(s)
    s = stablehlo.MulOp(s, full(_scale_value(scale, heads.e), acc, shape)).result
    ninf = full(float("-inf"), acc, shape)
    if attn_mask is not None:
        m = attn_mask
        ms = shape_of(m)
        # Broadcast the mask (any prefix of (B, Hq, L, S)) to (B, Hq, L, S), then group.
        full_shape = [heads.b, heads.hq, heads.l, heads.s]
        m = _bcast(m, full_shape, range(4 - len(ms), 4))
        m = heads.grouped(m)
        if dtype(m) is torch.bool:
            s = select(m, s, ninf)
        else:
            s = stablehlo.AddOp(s, convert(m, acc)).result
    if is_causal:
        # Positions in int32 (a TPU emulates int64: its comparison is several 32-bit ones,
        # per score); every sequence length fits.
        rows = stablehlo.IotaOp(tensor_type(shape, torch.int32), 3).result
        cols = stablehlo.IotaOp(tensor_type(shape, torch.int32), 4).result
        s = select(compare(cols, rows, "LE"), s, ninf)
    return s


def _slot_identity(slot: str) -> str:
    """What keys a program of a lowering that asks `slot` besides the compiler's code: the
    kernels offered for it and the env var that chooses among them ("" when none is)."""
    kernels = kernel_slots.offered(slot)
    if not kernels:
        return ""
    names = ",".join(f"{k.__module__}.{k.__qualname__}" for k in kernels)
    return f"kernels={names};{config.get('TORCH_TPU_ATTENTION_KERNEL')}"


def _precision_identity() -> str:
    return ";scores=input-dtype" if reduced_precision_allowed() else ""


def _forward_identity(record) -> str:
    return _slot_identity(kernel_slots.FUSED_ATTENTION_FORWARD) + _precision_identity()


def _backward_identity(record) -> str:
    return _slot_identity(kernel_slots.FUSED_ATTENTION_BACKWARD) + _precision_identity()


def _static_operands(ctx) -> bool:
    """Whether query, key and value have no dynamic (padded) dim: kernels see static
    shapes only; on padded operands the lowering's own masking applies."""
    return ctx.dynamic is None or not any(dynamic_dims(ctx, arg_position(ctx, name))
                                          for name in ("query", "key", "value"))


def _offered(slot: str, ctx, *operands):
    """The result of the first kernel offered for `slot` that takes these operands
    (`kernel_slots`: a Pallas flash kernel on a TPU, kernels/_fused_attention.py), or None."""
    kernels = kernel_slots.offered(slot)
    if not kernels or not _static_operands(ctx):
        return None
    for kernel in kernels:
        result = kernel(ctx, *operands)
        if result is not None:
            kernel_slots.used(slot)  # XLA may still reject it: the program is then built without
            return result
    return None


def _forward(ctx, q, k, v, attn_mask, is_causal, scale):
    """Returns (output (B, Hq, L, Ev) in q's dtype, logsumexp (B, Hq, L) in the
    accumulation type)."""
    offered = _offered(kernel_slots.FUSED_ATTENTION_FORWARD, ctx, q, k, v, attn_mask, is_causal, scale)
    if offered is not None:
        return offered
    heads = _Heads(ctx, q, k, v)
    dt = dtype(q)
    acc = _acc(dt)
    s = _scores(ctx, heads, q, k, attn_mask, is_causal, scale)
    shape = shape_of(s)
    row = shape[:4]
    m = _row_reduce(s, stablehlo.MaxOp, float("-inf"))
    # A fully masked row: max -inf -> 0 and sum 0 -> 1, so the row is 0 and lse is 0.
    m = select(compare(m, full(float("-inf"), acc, row), "EQ"), full(0, acc, row), m)
    p = stablehlo.ExpOp(stablehlo.SubtractOp(s, _bcast(m, shape, range(4))).result).result
    total = _row_reduce(p, stablehlo.AddOp, 0)
    total = select(compare(total, full(0, acc, row), "EQ"), full(1, acc, row), total)
    pv = convert(p, dt) if dt in _REDUCED else p
    o = dot_general(pv, v, ([4], [2]), ([0, 1], [0, 1]), out_dtype=acc)  # (B, Hk, G, L, Ev)
    inv = stablehlo.DivOp(full(1, acc, row), total).result
    o = stablehlo.MulOp(o, _bcast(inv, shape_of(o), range(4))).result
    lse = stablehlo.AddOp(m, stablehlo.LogOp(total).result).result
    return convert(heads.flat(o), dt), reshape(lse, [heads.b, heads.hq, heads.l])


def _head_dim_dynamic_without_scale(ctx: LoweringContext, args, kwargs) -> bool:
    """Whether the query's head dim is dynamic and no `scale` is given: the default scale
    is 1/sqrt(head dim), a size used as a value."""
    position = arg_position(ctx, "query")
    sym = symbolic_arg(ctx, position)
    return schema_arg(ctx, args, kwargs, "scale") is None and (sym.dim() - 1) in dynamic_dims(ctx, position)


def _heads_dynamic(ctx: LoweringContext, args, kwargs) -> bool:
    """Whether a head count (dim 1 of query, key or value) is dynamic: grouping query heads
    over key/value heads reshapes along it, which would read the padding."""
    return any(1 in dynamic_dims(ctx, arg_position(ctx, name)) for name in ("query", "key", "value"))


def _attention_beyond_padding(ctx: LoweringContext, args, kwargs) -> bool:
    return _heads_dynamic(ctx, args, kwargs) or _head_dim_dynamic_without_scale(ctx, args, kwargs)


# Bounded dynamism: every attention lowering shares one rule (its default scale uses the
# head dim's size as a value; its head grouping reshapes along the head counts).
_ATTENTION = {
    "dynamic": Padding.SIZE,
    "dynamic_rule": reject_when(
        _attention_beyond_padding,
        "attention with a dynamic head count, or a dynamic head dimension and the default scale",
    ),
}


@lowers(aten._scaled_dot_product_flash_attention_for_cpu.default, **_ATTENTION, identity=_forward_identity)
def _flash_attention_cpu(ctx, query, key, value, dropout_p=0.0, is_causal=False, *, attn_mask=None, scale=None):
    if dropout_p:
        raise ctx.fail("attention dropout is not supported (the CPU flash kernel rejects dropout_p > 0 too)")
    out, lse = _forward(ctx, query, key, value, attn_mask, is_causal, scale)
    return out, convert(lse, ctx.result_dtype(1))


def _backward(ctx, grad_out, query, key, value, out, logsumexp, attn_mask, is_causal, scale):
    """(dQ, dK, dV in their inputs' dtypes, dS: the scores' gradient (B, Hk, G, L, S) in the
    accumulation type, which is the gradient of an additive mask)."""
    heads = _Heads(ctx, query, key, value)
    dt = dtype(query)
    acc = _acc(dt)
    s = _scores(ctx, heads, query, key, attn_mask, is_causal, scale)
    shape = shape_of(s)
    lse = reshape(convert(logsumexp, acc), [heads.b, heads.hk, heads.g, heads.l])
    p = stablehlo.ExpOp(stablehlo.SubtractOp(s, _bcast(lse, shape, range(4))).result).result
    # As the flash kernels' backward: the four matmuls take the input dtype (P and dS
    # rounded to it) and accumulate in f32; the row terms stay in f32.
    do = heads.grouped(convert(grad_out, dt))  # (B, Hk, G, L, Ev)
    o = heads.grouped(convert(out, acc))
    p_in = convert(p, dt) if dt != acc else p
    # dV = P^T dO, summed over the query heads of each group.
    grad_v = dot_general(p_in, do, ([2, 3], [2, 3]), ([0, 1], [0, 1]), out_dtype=acc)  # (B, Hk, S, Ev)
    dp = dot_general(do, convert(value, dt), ([4], [3]), ([0, 1], [0, 1]), out_dtype=acc)  # (B, Hk, G, L, S)
    d = _row_reduce(stablehlo.MulOp(convert(do, acc), o).result, stablehlo.AddOp, 0)  # (B, Hk, G, L)
    ds = stablehlo.MulOp(p, stablehlo.SubtractOp(dp, _bcast(d, shape, range(4))).result).result
    ds_in = convert(ds, dt) if dt != acc else ds
    sc = _scale_value(scale, heads.e)
    grad_q = dot_general(ds_in, key, ([4], [2]), ([0, 1], [0, 1]), out_dtype=acc)  # (B, Hk, G, L, E)
    grad_q = stablehlo.MulOp(grad_q, full(sc, acc, shape_of(grad_q))).result
    grad_k = dot_general(ds_in, heads.grouped(query), ([2, 3], [2, 3]), ([0, 1], [0, 1]), out_dtype=acc)
    grad_k = stablehlo.MulOp(grad_k, full(sc, acc, shape_of(grad_k))).result  # (B, Hk, S, E)
    return convert(heads.flat(grad_q), dt), convert(grad_k, dt), convert(grad_v, dtype(value)), ds


@lowers(aten._scaled_dot_product_flash_attention_for_cpu_backward.default, **_ATTENTION, identity=_backward_identity)
def _flash_attention_cpu_backward(ctx, grad_out, query, key, value, out, logsumexp, dropout_p, is_causal, *,
                                  attn_mask=None, scale=None):
    if dropout_p:
        raise ctx.fail("attention dropout is not supported (the CPU flash kernel rejects dropout_p > 0 too)")
    offered = _offered(kernel_slots.FUSED_ATTENTION_BACKWARD, ctx, grad_out, query, key, value, out, logsumexp,
                       attn_mask, is_causal, scale)
    if offered is not None:
        return offered
    grad_q, grad_k, grad_v, _ = _backward(ctx, grad_out, query, key, value, out, logsumexp, attn_mask, is_causal,
                                          scale)
    return grad_q, grad_k, grad_v


# The attention op PyTorch provides for out-of-tree backends (PrivateUse1): what
# `F.scaled_dot_product_attention` on tpu tensors becomes (the device's SDPA kernel,
# python/torch_tpu/device/_attention.py), eager and traced alike, so a compiled graph holds
# one attention op -- bf16 matmuls accumulating in f32 -- instead of PyTorch's math
# decomposition, which runs both matmuls in f32.
@lowers(aten._scaled_dot_product_fused_attention_overrideable.default, **_ATTENTION, identity=_forward_identity)
def _fused_attention_overrideable(ctx, query, key, value, attn_bias=None, dropout_p=0.0, is_causal=False,
                                  return_debug_mask=False, *, scale=None):
    if dropout_p:
        raise ctx.fail("attention dropout is not lowered (the device routes dropout_p > 0 to PyTorch's math "
                       "attention)")
    if return_debug_mask:
        raise ctx.fail("return_debug_mask=True is not supported")
    out, lse = _forward(ctx, query, key, value, attn_bias, is_causal, scale)
    seed = full(0, ctx.result_dtype(6), ctx.result_shape(6))
    offset = full(0, ctx.result_dtype(7), ctx.result_shape(7))
    l, s = shape_of(query)[2], shape_of(key)[2]
    return out, convert(lse, ctx.result_dtype(1)), None, None, l, s, seed, offset, None


@lowers(aten._scaled_dot_product_fused_attention_overrideable_backward.default, **_ATTENTION, identity=_backward_identity)
def _fused_attention_overrideable_backward(ctx, grad_out, query, key, value, attn_bias, grad_input_mask, out,
                                           logsumexp, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal,
                                           philox_seed, philox_offset, *, scale=None):
    if dropout_p:
        raise ctx.fail("attention dropout is not lowered")
    if attn_bias is None:
        offered = _offered(kernel_slots.FUSED_ATTENTION_BACKWARD, ctx, grad_out, query, key, value, out,
                           logsumexp, None, is_causal, scale)
        if offered is not None:
            return (*offered, None)
    grad_q, grad_k, grad_v, ds = _backward(ctx, grad_out, query, key, value, out, logsumexp, attn_bias, is_causal,
                                           scale)
    if attn_bias is None:
        return grad_q, grad_k, grad_v, None
    if len(grad_input_mask) > 3 and grad_input_mask[3]:
        return grad_q, grad_k, grad_v, _bias_gradient(ctx, ds, attn_bias)
    # PyTorch's meta kernel gives a mask's gradient the mask's shape even when it is not
    # asked for (nothing reads it): zeros, a constant.
    return grad_q, grad_k, grad_v, full(0, dtype(attn_bias), shape_of(attn_bias))


def _bias_gradient(ctx, ds: ir.Value, bias: ir.Value) -> ir.Value:
    """An additive mask's gradient: dS (B, Hk, G, L, S) as (B, Hq, L, S), summed over the
    dimensions the mask was broadcast along (any prefix of (B, Hq, L, S), size-1 dims)."""
    ds_shape = shape_of(ds)
    flat = reshape(ds, [ds_shape[0], ds_shape[1] * ds_shape[2], ds_shape[3], ds_shape[4]])
    target = shape_of(bias)
    lead = 4 - len(target)
    summed = [d for d in range(4) if d < lead or target[d - lead] == 1]
    total = _sum(flat, summed) if summed else flat
    return convert(reshape(total, target), dtype(bias))


def _sum(x: ir.Value, dims) -> ir.Value:
    (out,) = reduce([x], [full(0, dtype(x), [])], dims, lambda a, b: [stablehlo.AddOp(a[0], b[0]).result])
    return out


@lowers(aten._scaled_dot_product_efficient_attention.default, **_ATTENTION, identity=_forward_identity)
def _efficient_attention(ctx, query, key, value, attn_bias, compute_log_sumexp, dropout_p=0.0, is_causal=False, *,
                         scale=None):
    if dropout_p:
        raise ctx.fail("attention dropout is not supported")
    out, lse = _forward(ctx, query, key, value, attn_bias, is_causal, scale)
    lse_shape = ctx.result_shape(1)
    lse_dtype = ctx.result_dtype(1)
    lse = convert(lse, lse_dtype)
    pad = lse_shape[2] - shape_of(lse)[2]
    if lse_shape[2] == 0:
        lse = full(0, lse_dtype, lse_shape)
    elif pad:
        # The kernel pads logsumexp to a multiple of 32 rows; the padding is never read.
        lse = stablehlo.PadOp(lse, full(float("inf"), lse_dtype, []), [0, 0, 0], [0, 0, pad], [0, 0, 0]).result
    seed = full(0, ctx.result_dtype(2), ctx.result_shape(2))
    offset = full(0, ctx.result_dtype(3), ctx.result_shape(3))
    return out, lse, seed, offset
