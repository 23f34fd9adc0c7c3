"""Quickstart: compile a small GPT-style language model with `torch.compile(...,
backend="tpu")`, run it, and compare it with PyTorch eager.

    python -m torch_tpu.examples.quickstart

No TPU here? XLA:CPU stands in (TORCH_TPU_PLATFORM=cpu), through the same runtime.
The weights are random (built from a config): nothing is downloaded.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        shape = (b, t, self.heads, d // self.heads)
        q, k, v = (z.view(shape).transpose(1, 2) for z in (q, k, v))
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attn.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    def __init__(self, vocab: int = 512, d: int = 128, heads: int = 4, layers: int = 2, seq: int = 64) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(seq, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(ids.shape[1], device=ids.device)
        x = self.tok(ids) + self.pos(positions)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


def _compare(contenders: dict, rounds: int = 7, calls: int = 5) -> dict[str, tuple[float, float, float, float]]:
    """{name: (median seconds per call, fastest and slowest round median, process CPU
    seconds per call)} of zero-argument callables, measured so that the ratio means
    something on a shared machine: the contenders alternate in short rounds (noise from
    other processes hits both alike), each figure is the median over rounds of each
    round's median call, and every round starts once this process's other threads are
    idle -- PyTorch eager's OpenMP workers spin for tens of milliseconds after its ops,
    and on a small machine took the cores the compiled program's threads needed (one
    20-call block of each, back to back, read anything from 0.95x to 25x)."""
    from torch_tpu.program.timing import wait_for_idle_threads

    for fn in contenders.values():
        fn()
    rounds_of: dict[str, list[float]] = {name: [] for name in contenders}
    cpu_of: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(rounds):
        for name, fn in contenders.items():
            wait_for_idle_threads()
            samples = []
            cpu = time.process_time()
            for _ in range(calls):
                start = time.perf_counter()
                fn()
                samples.append(time.perf_counter() - start)
            cpu_of[name].append((time.process_time() - cpu) / calls)
            rounds_of[name].append(statistics.median(samples))
    return {name: (statistics.median(r), min(r), max(r), statistics.median(cpu_of[name]))
            for name, r in rounds_of.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--show-stablehlo", type=int, default=25, help="lines of StableHLO to print")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")

    torch.manual_seed(0)
    model = TinyGPT(seq=args.seq).eval()
    ids = torch.randint(0, 512, (args.batch, args.seq))

    from torch_tpu.runtime import get_client

    client = get_client()
    print(f"torch_tpu: platform {client.platform} ({len(client.devices)} device(s))")

    compiled = torch.compile(model, backend="tpu")
    start = time.perf_counter()
    with torch.no_grad():
        out = compiled(ids)
    first_call = time.perf_counter() - start
    with torch.no_grad():
        expected = model(ids)
    max_err = (out - expected).abs().max().item()
    print(f"logits {tuple(out.shape)}; first row: {out[0, 0, :5].tolist()}")
    print(f"max |tpu - eager| = {max_err:.2e}")

    with torch.no_grad():
        timings = _compare({"torch_tpu": lambda: compiled(ids), "eager": lambda: model(ids)})
    print(f"first call (trace + compile): {first_call:.2f} s")
    (t_tpu, tpu_lo, tpu_hi, cpu_tpu), (t_eager, eager_lo, eager_hi, cpu_eager) = timings.values()
    print(f"steady state (median of 7 alternating rounds): torch_tpu {t_tpu * 1e3:.2f} ms/call "
          f"(rounds {tpu_lo * 1e3:.2f}-{tpu_hi * 1e3:.2f}), eager {t_eager * 1e3:.2f} ms/call "
          f"(rounds {eager_lo * 1e3:.2f}-{eager_hi * 1e3:.2f}): {t_eager / t_tpu:.2f}x eager; "
          f"process CPU per call {cpu_tpu * 1e3:.2f} vs {cpu_eager * 1e3:.2f} ms "
          f"(eager on {torch.get_num_threads()} threads)")
    if max(tpu_hi / tpu_lo, eager_hi / eager_lo) > 1.5:
        print("note: rounds varied more than 1.5x -- the machine was busy; rerun on a quiet one for a ratio to quote")

    import torch_tpu

    exported = torch_tpu.export(model, (ids,))
    lines = exported.text.splitlines()
    print(f"StableHLO of the model ({len(lines)} lines; first {args.show_stablehlo}):")
    print("\n".join(lines[: args.show_stablehlo]))
    if max_err > 1e-3:
        print("error: torch_tpu and eager disagree")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
