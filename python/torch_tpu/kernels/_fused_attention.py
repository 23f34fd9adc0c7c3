"""Scaled dot-product attention as Pallas flash kernels -- the forward of
`flash_attention.py`, the backward of `_flash_backward.py` -- offered to the compiler's
attention lowerings (`core.kernel_slots.FUSED_ATTENTION_FORWARD` and `_BACKWARD`,
compiler/lowering/attention.py).

XLA has no flash fusion: the StableHLO lowering writes the (seq_q x seq_k) f32 scores to
device memory and reads them back twice. On a TPU v5e at a Llama prefill's sizes (batch 2,
16 query / 4 key-value heads, 2048 tokens, head dim 96, causal, bf16) that is 2.27 ms a
layer; the kernel, which keeps each query block's scores in VMEM, takes 0.54 ms (query
blocks of 256, key blocks of 512). At 512 tokens both take ~0.16 ms, so `auto` uses the
kernel from 1024 tokens on (docs/explanation/performance.md). Numerics are the lowering's:
bf16 operands accumulating in f32, f32 softmax, P rounded to bf16 before P V, the same
log-sum-exp, so either backward reads either forward's results.

Importing this module costs nothing (jax loads at the first lowering that uses the
kernel); `torch_tpu.kernels` imports it, and the device's `torch.backends` entry point
imports `torch_tpu.kernels`, so the kernel is offered from `import torch` on.
"""

from __future__ import annotations

import functools
import math
import threading
from typing import Any

import torch

from torch_tpu.core import config, kernel_slots

from ._jax_trace import ArraySpec, Traced, runtime_platform, trace

__all__ = ["lower_backward", "lower_forward"]

_REDUCED = (torch.bfloat16, torch.float16)
# Measured crossover on a v5e (see the docstring): shorter sequences stay in StableHLO.
_AUTO_MIN_SEQ = 1024
_BLOCK_Q, _BLOCK_K = 256, 512
# One program holds its row's whole K and V, double-buffered: keep them within a quarter
# of v5e's 32 MiB default scoped VMEM (longer sequences stay in StableHLO).
_KV_VMEM_BYTES = 8 << 20

_lock = threading.Lock()
_traces: dict[tuple, Traced] = {}


def _blocks(seq_q: int, seq_k: int) -> tuple[int, int] | None:
    """Query and key block sizes that divide the sequence lengths, or None."""
    block_q, block_k = min(_BLOCK_Q, seq_q), min(_BLOCK_K, seq_k)
    if seq_q % block_q or seq_k % block_k:
        return None
    return block_q, block_k


def _applies(choice: str, platform: str, dtype: torch.dtype, q: tuple, k: tuple, v: tuple) -> bool:
    (b, hq, seq_q, e), (bk, hk, seq_k, ek), ev = q, k, v[3]
    if hk == 0 or hq % hk or b != bk or e != ek or ev != e or v[:3] != k[:3]:
        return False
    # The forward and dQ hold a row's whole K and V; dK/dV one head's whole Q and dO.
    if 4 * max(seq_k, seq_q) * e * dtype.itemsize > _KV_VMEM_BYTES or _blocks(seq_q, seq_k) is None:
        return False
    if choice == "pallas":
        return dtype.is_floating_point
    return platform == "tpu" and dtype in _REDUCED and min(seq_q, seq_k) >= _AUTO_MIN_SEQ


def _jax_available() -> bool:
    try:
        import jax  # noqa: F401
        from jax.experimental import pallas  # noqa: F401
    except ImportError:
        return False
    return True


def lower_forward(ctx: Any, query: Any, key: Any, value: Any, attn_mask: Any, is_causal: bool,
                  scale: float | None) -> tuple | None:
    """`(out, logsumexp (B, Hq, L) f32)` of the Pallas kernel merged into the module being
    built, or None where it does not apply (a mask, a platform or size where StableHLO is
    as fast, no jax installed)."""
    return _lower(ctx, "forward", [query, key, value], attn_mask, is_causal, scale)


def lower_backward(ctx: Any, grad_out: Any, query: Any, key: Any, value: Any, out: Any, logsumexp: Any,
                   attn_mask: Any, is_causal: bool, scale: float | None) -> tuple | None:
    """`(dQ, dK, dV)` of the Pallas backward kernels (`_flash_backward.py`), or None where
    the forward's kernel would not apply."""
    from torch_tpu.compiler import ir as hlo
    from torch_tpu.compiler.context import ir

    lse = hlo.convert(logsumexp, ir.F32Type.get())
    return _lower(ctx, "backward", [query, key, value, out, grad_out, lse], attn_mask, is_causal, scale)


# The query's position among the lowered op's arguments (the backward ops: after grad_out).
_QUERY_POSITION = {"forward": 0, "backward": 1}


def _lower(ctx: Any, direction: str, operands: list, attn_mask: Any, is_causal: bool, scale: float | None):
    choice = config.get("TORCH_TPU_ATTENTION_KERNEL")
    if choice == "xla" or attn_mask is not None:
        return None
    from torch_tpu.compiler import ir as hlo

    shapes = [tuple(hlo.shape_of(t)) for t in operands]
    dtype = ctx.arg_meta(_QUERY_POSITION[direction]).dtype
    platform = runtime_platform()
    if not _applies(choice, platform, dtype, *shapes[:3]):
        return None
    if not _jax_available():
        if choice == "pallas":
            raise ctx.fail("TORCH_TPU_ATTENTION_KERNEL=pallas needs jax (pip install jax), or set it to auto")
        return None
    from torch_tpu.compiler.importer.foreign_module import ForeignModuleError, call_foreign_module

    traced = _trace(direction, platform, dtype, shapes, bool(is_causal), scale)
    try:
        return tuple(call_foreign_module(traced.stablehlo, operands, f"attention_{direction}.{traced.digest}",
                                         where=f"the Pallas attention {direction} kernel"))
    except ForeignModuleError as err:
        raise ctx.fail(f"the Pallas attention {direction} kernel: {err.reason} "
                       "(TORCH_TPU_ATTENTION_KERNEL=xla avoids it)") from None


def _trace(direction: str, platform: str, dtype: torch.dtype, shapes: list[tuple], causal: bool,
           scale: float | None) -> Traced:
    key = (direction, platform, dtype, tuple(shapes), causal, scale)
    with _lock:
        traced = _traces.get(key)
        if traced is None:
            import jax

            function = _forward if direction == "forward" else _backward
            fn = functools.partial(function, causal=causal, scale=scale, interpret=platform != "tpu")
            # The backward's sixth operand is the f32 log-sum-exp.
            specs = tuple(ArraySpec(s, torch.float32 if i == 5 else dtype) for i, s in enumerate(shapes))
            traced = trace(fn, jax.jit(fn), f"scaled_dot_product_attention_{direction}", specs)
            _traces[key] = traced
    return traced


def _geometry(q, k, causal: bool, scale: float | None) -> dict:
    hq, seq_q, e = q.shape[1:]
    hk, seq_k = k.shape[1], k.shape[2]
    block_q, block_k = _blocks(seq_q, seq_k)
    return dict(scale=scale if scale is not None else 1.0 / math.sqrt(e), causal=causal, block_q=block_q,
                block_k=block_k, group=hq // hk)


def _rows(x):
    """(B, H, ...) -> (B*H, ...)."""
    return x.reshape((-1,) + x.shape[2:])


def _forward(q, k, v, *, causal: bool, scale: float | None, interpret: bool):
    """q (B, Hq, L, E), k and v (B, Hk, S, E) -> (out (B, Hq, L, E), lse (B, Hq, L) f32)."""
    from .flash_attention import pallas_forward

    out, lse = pallas_forward(_rows(q), _rows(k), _rows(v), interpret=interpret, **_geometry(q, k, causal, scale))
    return out.reshape(q.shape), lse.reshape(q.shape[:3])


def _backward(q, k, v, out, grad_out, lse, *, causal: bool, scale: float | None, interpret: bool):
    """-> (dq, dk, dv) in the inputs' dtypes, from the forward's out and lse (B, Hq, L) f32."""
    from ._flash_backward import pallas_backward

    dq, dk, dv = pallas_backward(_rows(q), _rows(k), _rows(v), _rows(out), _rows(grad_out), _rows(lse),
                                 interpret=interpret, **_geometry(q, k, causal, scale))
    return dq.reshape(q.shape), dk.reshape(k.shape).astype(k.dtype), dv.reshape(v.shape).astype(v.dtype)


kernel_slots.offer(kernel_slots.FUSED_ATTENTION_FORWARD, lower_forward)
kernel_slots.offer(kernel_slots.FUSED_ATTENTION_BACKWARD, lower_backward)
