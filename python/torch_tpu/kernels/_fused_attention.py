"""The forward of scaled dot-product attention as the Pallas flash kernel of
`flash_attention.py`, offered to the compiler's attention lowerings
(`core.kernel_slots.FUSED_ATTENTION_FORWARD`, compiler/lowering/attention.py).

XLA has no flash fusion: the StableHLO lowering writes the (seq_q x seq_k) f32 scores to
device memory and reads them back twice. On a TPU v5e at a Llama prefill's sizes (batch 2,
16 query / 4 key-value heads, 2048 tokens, head dim 96, causal, bf16) that is 2.27 ms a
layer; the kernel, which keeps each query block's scores in VMEM, takes 0.54 ms (query
blocks of 256, key blocks of 512). At 512 tokens both take ~0.16 ms, so `auto` uses the
kernel from 1024 tokens on (docs/explanation/performance.md). Numerics are the lowering's:
bf16 operands accumulating in f32, f32 softmax, P rounded to bf16 before P V, the same
log-sum-exp, so the StableHLO backward reads this forward's results unchanged.

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

__all__ = ["lower_forward"]

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
    if 4 * seq_k * e * dtype.itemsize > _KV_VMEM_BYTES or _blocks(seq_q, seq_k) is None:
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
    choice = config.get("TORCH_TPU_ATTENTION_KERNEL")
    if choice == "xla" or attn_mask is not None:
        return None
    from torch_tpu.compiler import ir as hlo

    shapes = [tuple(hlo.shape_of(t)) for t in (query, key, value)]
    dtype = ctx.arg_meta(0).dtype
    platform = runtime_platform()
    if not _applies(choice, platform, dtype, *shapes):
        return None
    if not _jax_available():
        if choice == "pallas":
            raise ctx.fail("TORCH_TPU_ATTENTION_KERNEL=pallas needs jax (pip install jax), or set it to auto")
        return None
    from torch_tpu.compiler.importer.foreign_module import ForeignModuleError, call_foreign_module

    traced = _trace(platform, dtype, shapes, bool(is_causal), scale)
    try:
        out, lse = call_foreign_module(traced.stablehlo, [query, key, value], f"attention.{traced.digest}",
                                       where="the Pallas attention kernel")
    except ForeignModuleError as err:
        raise ctx.fail(f"the Pallas attention kernel: {err.reason} (TORCH_TPU_ATTENTION_KERNEL=xla avoids it)") from None
    return out, lse


def _trace(platform: str, dtype: torch.dtype, shapes: list[tuple], causal: bool, scale: float | None) -> Traced:
    key = (platform, dtype, tuple(shapes), causal, scale)
    with _lock:
        traced = _traces.get(key)
        if traced is None:
            import jax

            fn = functools.partial(_attention, causal=causal, scale=scale, interpret=platform != "tpu")
            specs = tuple(ArraySpec(s, dtype) for s in shapes)
            traced = trace(fn, jax.jit(fn), "scaled_dot_product_attention", specs)
            _traces[key] = traced
    return traced


def _attention(q, k, v, *, causal: bool, scale: float | None, interpret: bool):
    """q (B, Hq, L, E), k and v (B, Hk, S, E) -> (out (B, Hq, L, E), lse (B, Hq, L) f32)."""
    from .flash_attention import pallas_forward

    b, hq, seq_q, e = q.shape
    hk, seq_k = k.shape[1], k.shape[2]
    block_q, block_k = _blocks(seq_q, seq_k)
    out, lse = pallas_forward(q.reshape(b * hq, seq_q, e), k.reshape(b * hk, seq_k, e), v.reshape(b * hk, seq_k, e),
                              scale=scale if scale is not None else 1.0 / math.sqrt(e), causal=causal, block_q=block_q, block_k=block_k,
                              interpret=interpret, group=hq // hk)
    return out.reshape(q.shape), lse.reshape(b, hq, seq_q)


kernel_slots.offer(kernel_slots.FUSED_ATTENTION_FORWARD, lower_forward)
