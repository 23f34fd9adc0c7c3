"""The eager tpu device (issue 13), as ratios measured side by side in one process:

* per-op time of a cached small op (`x + y`, 1k floats): tpu Strict vs CPU eager vs JAX
  op-by-op (`jnp` ops on jax arrays, not jitted) -- goal <= 30 us and <= JAX op-by-op.
  Two figures each: back to back (a tight loop of the op) and spaced (`--gap-us` of host
  work between ops, as in a real model, where the runtime's worker threads have gone to
  sleep between ops and must be woken);
* a tiny-GPT training step (`torch_tpu.examples.quickstart.TinyGPT`, Adam): tpu Strict
  vs CPU eager vs `torch.compile(backend="tpu")` on CPU tensors;
* the host thread's CPU time per op (`host cpu`), which a loaded machine distorts far
  less than the wall-clock figures;
* host memory (RSS) over `--memory-steps` training steps on tpu after warm-up -- goal
  < 50 MB growth (single-op modules must not pile up in the MLIR context).

    .venv/bin/python bench/eager.py [--rounds 7] [--calls 300] [--steps 10] [--memory-steps 200]
    .venv/bin/python bench/eager.py --skip op,gpt --memory-steps 1000   # the issue's memory figure

Contenders are interleaved in short blocks per round; each figure is the median over
rounds of the round's median. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import tiny_gpt_training_step  # noqa: E402


def _round_medians(contenders: dict, rounds: int, calls: int) -> dict[str, float]:
    per_round: dict[str, list[float]] = {k: [] for k in contenders}
    for fn in contenders.values():
        for _ in range(5):
            fn()
    for _ in range(rounds):
        for name, fn in contenders.items():
            samples = []
            for _ in range(calls):
                t0 = time.perf_counter()
                fn()
                samples.append(time.perf_counter() - t0)
            per_round[name].append(statistics.median(samples))
    return {k: statistics.median(v) for k, v in per_round.items()}


def _host_cpu_per_call(contenders: dict, rounds: int, calls: int) -> dict[str, float]:
    """CPU time of the calling thread per call, back to back (fewest over rounds): the
    host's own work per op, which a loaded machine inflates far less than wall time
    (runtime worker threads and other processes are not counted)."""
    best: dict[str, float] = {}
    for _ in range(rounds):
        for name, fn in contenders.items():
            start = time.thread_time()
            for _ in range(calls):
                fn()
            per_call = (time.thread_time() - start) / calls
            best[name] = min(best.get(name, per_call), per_call)
    return best


def _spin(seconds: float) -> None:
    """Host work between two ops (busy, like Python model code; sleeping would differ)."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def bench_small_op(rounds: int, calls: int, gap_s: float) -> dict[str, float]:
    import numpy as np
    import torch

    import torch_tpu.device  # noqa: F401 - registers the tpu device

    x_cpu, y_cpu = torch.randn(1000), torch.randn(1000)
    x_tpu, y_tpu = x_cpu.to("tpu"), y_cpu.to("tpu")
    contenders = {
        "tpu": lambda: x_tpu + y_tpu,
        "cpu": lambda: x_cpu + y_cpu,
    }
    try:
        import jax.numpy as jnp

        x_jax, y_jax = jnp.asarray(x_cpu.numpy()), jnp.asarray(y_cpu.numpy())
        contenders["jax"] = lambda: x_jax + y_jax
    except ImportError:
        pass
    results = {f"{k} back-to-back": v for k, v in _round_medians(contenders, rounds, calls).items()}
    results.update({f"{k} host cpu": v for k, v in _host_cpu_per_call(contenders, rounds, calls).items()})
    if gap_s > 0:
        def spaced(fn):
            def run():
                _spin(gap_s)
                t0 = time.perf_counter()
                fn()
                return time.perf_counter() - t0
            return run

        per_round: dict[str, list[float]] = {k: [] for k in contenders}
        for _ in range(rounds):
            for name, fn in contenders.items():
                timed = spaced(fn)
                per_round[name].append(statistics.median(timed() for _ in range(max(calls // 3, 20))))
        results.update({f"{k} spaced": statistics.median(v) for k, v in per_round.items()})
    del np
    return results


def _gpt_step(device: str, compiled: bool = False):
    return tiny_gpt_training_step(device, compiled, optimizer="Adam")


def bench_gpt(rounds: int, steps: int) -> dict[str, float]:
    import torch

    import torch_tpu.device  # noqa: F401

    def synced(step):
        return lambda: step().detach().cpu()  # the step's value on the host: all its work done

    contenders = {
        "tpu strict": synced(_gpt_step("tpu")),
        "cpu eager": synced(_gpt_step("cpu")),
    }
    try:
        contenders["torch.compile(tpu)"] = synced(_gpt_step("cpu", compiled=True))
    except Exception as err:  # noqa: BLE001 - a benchmark reports, it does not stop
        print(f"  torch.compile contender skipped: {type(err).__name__}: {err}")
    del torch
    return _round_medians(contenders, rounds, steps)


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def bench_memory(steps: int, warmup: int = 20) -> tuple[float, float, int]:
    """(RSS growth in MB over `steps` tpu training steps after warm-up, RSS at the start in
    MB, number of op plans at the end)."""
    import torch_tpu.device  # noqa: F401
    from torch_tpu.device import _ops

    step = _gpt_step("tpu")
    for _ in range(warmup):
        step().item()
    gc.collect()
    start = _rss_bytes()
    for i in range(steps):
        loss = step()
        if i % 50 == 0:
            loss.item()  # the host keeps up: a bounded queue, as in a real loop logging the loss
    loss.item()
    gc.collect()
    return (_rss_bytes() - start) / 2**20, start / 2**20, len(_ops._PLANS)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=300, help="timed small-op calls per contender per round")
    parser.add_argument("--gap-us", type=float, default=50.0, help="host work between spaced small ops")
    parser.add_argument("--steps", type=int, default=5, help="timed GPT steps per contender per round")
    parser.add_argument("--memory-steps", type=int, default=200,
                        help="tpu training steps of the memory figure (issue 13's figure: 1000)")
    parser.add_argument("--skip", default="", help="comma list of parts to skip: op,gpt,memory")
    args = parser.parse_args(argv)
    skip = set(filter(None, args.skip.split(",")))

    if "op" not in skip:
        print(f"cached x + y, 1k floats (median of {args.rounds} round medians):")
        ops = bench_small_op(args.rounds, args.calls, args.gap_us * 1e-6)
        for mode in ("back-to-back", "spaced", "host cpu"):
            tpu = ops.get(f"tpu {mode}")
            if tpu is None:
                continue
            line = f"  {mode:13s} tpu {tpu * 1e6:7.1f} us   cpu {ops[f'cpu {mode}'] * 1e6:6.1f} us"
            line += f"   tpu/cpu {tpu / ops[f'cpu {mode}']:6.1f}x"
            if f"jax {mode}" in ops:
                line += f"   jax {ops[f'jax {mode}'] * 1e6:6.1f} us   tpu/jax {tpu / ops[f'jax {mode}']:5.2f}x"
            print(line)
    if "gpt" not in skip:
        print(f"tiny-GPT training step (TinyGPT d=128, 2 layers, batch 4x64, Adam; {args.rounds} rounds):")
        gpt = bench_gpt(args.rounds, args.steps)
        cpu = gpt["cpu eager"]
        for name, seconds in gpt.items():
            print(f"  {name:20s} {seconds * 1e3:8.2f} ms   vs cpu eager {seconds / cpu:5.2f}x")
    if "memory" not in skip:
        growth, start, plans = bench_memory(args.memory_steps)
        print(f"host memory over {args.memory_steps} tpu training steps after warm-up: "
              f"{growth:+.1f} MB (RSS {start:.0f} MB at start; {plans} op plans)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
