"""Scaled dot-product attention as Pallas flash kernels -- the forward of
`flash_attention.py`, the backward of `_flash_backward.py` -- offered to the compiler's
attention lowerings (`core.kernel_slots.FUSED_ATTENTION_FORWARD` and `_BACKWARD`,
compiler/lowering/attention.py).

XLA has no flash fusion: the StableHLO lowering writes the (seq_q x seq_k) f32 scores to
device memory and reads them back twice. On a TPU v5e at a Llama prefill's sizes (batch 2,
16 query / 4 key-value heads, 2048 tokens, head dim 96, causal, bf16) that is 2.27 ms a
layer forward, 6.71 ms forward and backward; the kernels, which keep each block's scores in
VMEM, take 0.54 and 1.64 ms. At 512 tokens they gain nothing measurable in a training step,
so `auto` uses them from 1024 tokens on (docs/explanation/performance.md). Numerics are the lowering's:
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
# Measured on a v5e (docs/explanation/performance.md, bf16, head dim 96, 16/4 heads,
# causal): at 512 tokens the forward kernel is as fast as StableHLO and the backward's 9 %
# faster alone, but the whole training step at 512 was not faster with it (59.9 vs 57.9 ms,
# within run-to-run spread); at 2048 both are ~4x faster. Shorter sequences stay in StableHLO.
_AUTO_MIN_SEQ = {"forward": 1024, "backward": 1024}
# The fastest (query, key) blocks measured: forward 256 x 512 (0.54 ms vs 0.71 for 128 x 512
# at 2048 tokens), backward 512 x 512 (1.64 ms fwd+bwd vs 1.85 for 256 x 512).
_BLOCKS = {"forward": (256, 512), "backward": (512, 512)}
# One program holds a row's whole K and V (forward, dQ) or one head's whole Q and dO (dK
# and dV), double-buffered: keep them within a quarter of the default scoped VMEM (longer
# sequences stay in StableHLO).
_KV_VMEM_BYTES = 8 << 20

_lock = threading.Lock()
_traces: dict[tuple, Traced] = {}


def _block(size: int, preferred: int) -> int | None:
    """The largest of `preferred`, its halves down to 128 that divides `size` (Mosaic tiles
    lanes by 128), or `size` itself when it is at most `preferred`; None otherwise."""
    if size <= preferred:
        return size
    block = preferred
    while block >= 128:
        if size % block == 0:
            return block
        block //= 2
    return None


def _blocks(direction: str, seq_q: int, seq_k: int) -> tuple[int, int] | None:
    """Query and key block sizes of `direction`'s kernels for these lengths, or None."""
    preferred_q, preferred_k = _BLOCKS[direction]
    block_q, block_k = _block(seq_q, preferred_q), _block(seq_k, preferred_k)
    return None if block_q is None or block_k is None else (block_q, block_k)


def _applies(direction: str, choice: str, platform: str, dtype: torch.dtype, q: tuple, k: tuple, v: tuple) -> bool:
    (b, hq, seq_q, e), (bk, hk, seq_k, ek), ev = q, k, v[3]
    if hk == 0 or hq % hk or b != bk or e != ek or ev != e or v[:3] != k[:3]:
        return False
    if 4 * max(seq_k, seq_q) * e * dtype.itemsize > _KV_VMEM_BYTES or _blocks(direction, seq_q, seq_k) is None:
        return False
    if choice == "pallas":
        return dtype.is_floating_point
    return platform == "tpu" and dtype in _REDUCED and min(seq_q, seq_k) >= _AUTO_MIN_SEQ[direction]


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
    if not _applies(direction, choice, platform, dtype, *shapes[:3]):
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
            fn = functools.partial(function, causal=causal, scale=scale, interpret=platform != "tpu",
                                   blocks=_blocks(direction, shapes[0][2], shapes[1][2]))
            # The backward's sixth operand is the f32 log-sum-exp.
            specs = tuple(ArraySpec(s, torch.float32 if i == 5 else dtype) for i, s in enumerate(shapes))
            # Float32 matmuls at torch's default (full) precision; bf16/f16 operands at the
            # default one, as jax compiles them (Mosaic rejects bf16 dots asked for highest
            # precision: "Bad lhs type", seen on the chip).
            precision = "highest" if dtype == torch.float32 else "medium"
            traced = trace(fn, jax.jit(fn), f"scaled_dot_product_attention_{direction}", specs, precision)
            _traces[key] = traced
    return traced


def _geometry(q, k, causal: bool, scale: float | None, blocks: tuple[int, int]) -> dict:
    hq, e = q.shape[1], q.shape[3]
    hk = k.shape[1]
    block_q, block_k = blocks
    return dict(scale=scale if scale is not None else 1.0 / math.sqrt(e), causal=causal, block_q=block_q,
                block_k=block_k, group=hq // hk)


def _rows(x):
    """(B, H, ...) -> (B*H, ...)."""
    return x.reshape((-1,) + x.shape[2:])


def _forward(q, k, v, *, causal: bool, scale: float | None, interpret: bool, blocks: tuple[int, int]):
    """q (B, Hq, L, E), k and v (B, Hk, S, E) -> (out (B, Hq, L, E), lse (B, Hq, L) f32)."""
    from .flash_attention import pallas_forward

    out, lse = pallas_forward(_rows(q), _rows(k), _rows(v), interpret=interpret,
                              **_geometry(q, k, causal, scale, blocks))
    return out.reshape(q.shape), lse.reshape(q.shape[:3])


def _backward(q, k, v, out, grad_out, lse, *, causal: bool, scale: float | None, interpret: bool,
              blocks: tuple[int, int]):
    """-> (dq, dk, dv) in the inputs' dtypes, from the forward's out and lse (B, Hq, L) f32."""
    from ._flash_backward import pallas_backward

    dq, dk, dv = pallas_backward(_rows(q), _rows(k), _rows(v), _rows(out), _rows(grad_out), _rows(lse),
                                 interpret=interpret, **_geometry(q, k, causal, scale, blocks))
    return dq.reshape(q.shape), dk.reshape(k.shape).astype(k.dtype), dv.reshape(v.shape).astype(v.dtype)


kernel_slots.offer(kernel_slots.FUSED_ATTENTION_FORWARD, lower_forward)
kernel_slots.offer(kernel_slots.FUSED_ATTENTION_BACKWARD, lower_backward)
