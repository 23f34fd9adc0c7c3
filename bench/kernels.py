"""A Pallas kernel through `torch_tpu.jax_op` vs the same math in plain PyTorch, both
under torch_tpu (issue 16): `torch_tpu.kernels.flash_attention` (Pallas, interpreted
on XLA:CPU) against `softmax(q @ k^T * scale) @ v` written in PyTorch, each compiled
with `torch.compile(backend="tpu")`, forward and forward+backward, and eagerly on tpu
tensors. Reported as ratios (kernel / PyTorch); nothing is asserted.

    .venv/bin/python bench/kernels.py [--seq 256] [--rounds 5] [--calls 10]

On XLA:CPU the Pallas kernel runs through Pallas's interpreter (loops of dynamic
slices), so a ratio above 1 here says nothing about a TPU, where Mosaic compiles it;
the figure tracks the cost of the jax_op path itself (merge, call, no graph break).
"""

from __future__ import annotations

import argparse
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("TORCH_TPU_CACHE_L2", "0")

from _common import fmt_ratio, fmt_s, interleaved_timings  # noqa: E402


def _plain_attention(q, k, v, causal: bool):
    import torch

    scores = q @ k.transpose(-2, -1) * (1.0 / math.sqrt(q.shape[-1]))
    if causal:
        seq_q, seq_k = scores.shape[-2:]
        mask = torch.ones(seq_q, seq_k, dtype=torch.bool, device=q.device).tril()
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, -1) @ v


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--block", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=10)
    args = parser.parse_args()

    import torch

    import torch_tpu.device  # noqa: F401
    from torch_tpu.kernels import flash_attention

    torch.manual_seed(0)
    shape = (args.batch, args.heads, args.seq, args.dim)
    q, k, v = (torch.randn(shape) for _ in range(3))
    block = min(args.block, args.seq)

    def pallas(q, k, v):
        return flash_attention(q, k, v, causal=True, block_q=block, block_k=block)

    def plain(q, k, v):
        return _plain_attention(q, k, v, causal=True)

    def train_step(fn):
        def step(q, k, v):
            q, k, v = (t.requires_grad_() for t in (q.detach(), k.detach(), v.detach()))
            out = fn(q, k, v)
            return torch.autograd.grad(out.sum(), (q, k, v))
        return step

    compiled = {name: torch.compile(fn, backend="tpu") for name, fn in (("pallas", pallas), ("plain", plain))}
    tq, tk, tv = (t.to("tpu") for t in (q, k, v))
    contenders = {
        "compiled fwd, pallas": (lambda: compiled["pallas"](q, k, v), lambda r: r),
        "compiled fwd, plain": (lambda: compiled["plain"](q, k, v), lambda r: r),
        "compiled fwd+bwd, pallas": (lambda: train_step(compiled["pallas"])(q, k, v), lambda r: r),
        "compiled fwd+bwd, plain": (lambda: train_step(compiled["plain"])(q, k, v), lambda r: r),
        "eager tpu fwd, pallas": (lambda: pallas(tq, tk, tv), lambda r: r.cpu()),
        "eager tpu fwd, plain": (lambda: plain(tq, tk, tv), lambda r: r.cpu()),
    }
    reference = plain(q, k, v)
    error = (compiled["pallas"](q, k, v) - reference).abs().max().item()
    timings = interleaved_timings(contenders, {name: args.calls for name in contenders}, args.rounds)
    print(f"flash attention (causal), q/k/v {shape}, blocks {block}; max |pallas - plain| = {error:.2e}")
    print(f"{'case':<28}{'pallas':>12}{'plain':>12}{'pallas/plain':>14}")
    for case in ("compiled fwd", "compiled fwd+bwd", "eager tpu fwd"):
        a, b = timings[f"{case}, pallas"].median, timings[f"{case}, plain"].median
        print(f"{case:<28}{fmt_s(a):>12}{fmt_s(b):>12}{fmt_ratio(a, b):>14}")


if __name__ == "__main__":
    main()
