"""`F.scaled_dot_product_attention` on tpu tensors: one fused attention op.

PyTorch picks an attention kernel per backend in C++; a PrivateUse1 backend gets the
math decomposition (both matmuls in float32, the scores materialised op by op) unless it
routes the call itself. The device does, with a kernel at the AutogradPrivateUse1 key:
where the fused op computes what SDPA would, the call becomes
`aten._scaled_dot_product_fused_attention_overrideable` -- the op PyTorch provides for
out-of-tree backends, with its own autograd formula and meta kernel -- which the
compiler lowers (compiler/lowering/attention.py: bf16 matmuls accumulating in float32,
as the flash kernels compute). Fake tensors of the tpu device carry the same key, so a
`torch.compile` trace holds the one op (and its backward) as well as an eager call does.
Everything else (dropout, other ranks, broadcast batches, mixed dtypes) runs PyTorch's
own composite kernel, exactly as before.
"""

from __future__ import annotations

import warnings

import torch

aten = torch.ops.aten
_SDPA = aten.scaled_dot_product_attention.default
_FUSED = aten._scaled_dot_product_fused_attention_overrideable.default
_FUSED_BACKWARD = aten._scaled_dot_product_fused_attention_overrideable_backward.default


def _mask_applies(mask, query, batch: int, heads: int, rows: int, cols: int) -> bool:
    """A mask the fused op reads as SDPA does: bool (True = attend) or additive in the
    query's dtype, broadcastable to (B, Hq, L, S) by leading dims and size-1 dims."""
    if mask is None:
        return True
    if not isinstance(mask, torch.Tensor) or mask.dim() > 4 or (mask.dtype != torch.bool and mask.dtype != query.dtype):
        return False
    full = (batch, heads, rows, cols)[4 - mask.dim():]
    return all(m == 1 or m == f for m, f in zip(mask.shape, full))


def fused_applies(query, key, value, attn_mask, dropout_p, is_causal, enable_gqa) -> bool:
    """Whether the fused op computes exactly what `scaled_dot_product_attention` would for
    these arguments (else PyTorch's composite kernel runs, with its own errors)."""
    tensors = (query, key, value)
    if dropout_p != 0.0 or (is_causal and attn_mask is not None):
        return False
    if any(t.dim() != 4 for t in tensors) or not query.is_floating_point():
        return False
    if key.dtype != query.dtype or value.dtype != query.dtype:
        return False
    b, hq, l, e = query.shape
    _, hk, s, ek = key.shape
    if key.shape[0] != b or value.shape[0] != b or value.shape[1] != hk or value.shape[2] != s or ek != e:
        return False
    if l == 0 or s == 0 or e == 0 or hk == 0:
        return False
    if hq != hk and not (enable_gqa and hq % hk == 0):
        return False
    return _mask_applies(attn_mask, query, b, hq, l, s)


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                                 enable_gqa=False):
    if fused_applies(query, key, value, attn_mask, dropout_p, is_causal, enable_gqa):
        return _FUSED(query, key, value, attn_mask, 0.0, is_causal, False, scale=scale)[0]
    return _SDPA.decompose(query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)


def install(impl_library, execute) -> set:
    """Registers the routing kernel, and the fused op's and its backward's device kernels
    (`execute`, the device's kernel of lowered ops, with undefined results made tensors);
    returns the overloads given a kernel here, which the device's lowered-op kernels must
    leave alone."""
    impl_library.impl(_SDPA, scaled_dot_product_attention, "AutogradPrivateUse1")
    ops = (_FUSED, _FUSED_BACKWARD)
    with warnings.catch_warnings():
        # PyTorch registers a kernel for each that raises "not implemented" for
        # PrivateUse1 backends, to be overridden -- which it warns about.
        warnings.filterwarnings("ignore", message=".*Overriding a previously registered kernel")
        for op in ops:
            impl_library.impl(op, _defined_results(op, execute), "PrivateUse1")
    return set(ops)


def _defined_results(op, execute):
    """`execute(op, ...)` as the schema's results: the forward's sequence lengths
    (`max_q`, `max_k`, SymInts: the device's plans return tensors only) from the query's
    and key's shapes, and each undefined result (what a fused kernel leaves undefined:
    cumulative sequence lengths, the debug mask, the gradient of an absent or constant
    mask) an empty tensor -- a kernel's Tensor result cannot be None from Python, and
    nothing reads these (autograd drops a gradient for an input that needs none)."""

    def kernel(*args, **kwargs):
        results = list(execute(op, *args, **kwargs))
        if op is _FUSED:
            results[4], results[5] = args[0].shape[-2], args[1].shape[-2]
        device = args[0].device
        return tuple(torch.empty(0, device=device) if r is None else r for r in results)

    return kernel
