"""FUSED eager mode (issue 14), as ratios measured side by side in one process:

* (a) an elementwise chain: `y = x`, then 50 x (`y = y + 1; y = y * 2; y = y - 1`) -- 150
  ops -- on a 1024x1024 float32 tensor (`--size`), then `.cpu()`: tpu FUSED vs tpu Strict
  (goal >= 5x, on XLA:CPU and on the chip) vs CPU eager, in wall time and in process CPU
  time (all threads; a loaded machine distorts it less);
* (b) a tiny-GPT training step (`torch_tpu.examples.quickstart.TinyGPT`, AdamW, loss read
  with `.item()` each step): tpu FUSED vs tpu Strict vs `torch.compile(backend="tpu")`
  (goal: FUSED >= 0.8x compiled's throughput) vs CPU eager; compiles per step after
  warm-up (goal 0);
* (c) first-iteration time of the GPT step in a fresh process with a cold compile cache:
  FUSED with the background compile (ops run one by one while the fused program
  compiles) vs FUSED running the program from the first step on
  (`TORCH_TPU_FUSED_FIRST_RUN=1`: it waits for the compile) vs Strict;
* (d) host memory (RSS) growth over `--memory-steps` FUSED training steps after warm-up
  (goal < 50 MB). Measured (`--skip chain,gpt,first`, 2-core machine shared with other
  runs): +40.8 MB over 1,000 steps from 789 MB, 2 fused programs cached (the step's traces
  compile once); +52.6 MB before the fused program donated the buffers it writes (each
  step's new parameter and optimizer-state values were new allocations). Python objects
  grow by ~1 MB over 40 steps (tracemalloc, mostly the step program's executable compiled
  in that window): the rest is native (XLA:CPU buffers, allocator).
* (e) a training loop that reads its loss every 50 steps only (the tiny GPT, AdamW):
  seconds per step in FUSED vs Strict over `--loop-blocks` blocks of 50 steps after one
  warm-up block, and how many of FUSED's flushes ran a fused program (issue 30: 0 of 114
  before the optimizer's step() ended a trace).

    .venv/bin/python bench/fused.py [--rounds 5] [--steps 3] [--memory-steps 1000] [--size 1024] [--loop-blocks 2]
                                    [--skip chain,gpt,first,memory,loop]

Contenders are interleaved in short blocks per round; each figure is the median over
rounds of the round's median. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import interleaved_timings, tiny_gpt_training_step  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _round_medians(contenders: dict, rounds: int, calls: int, cpu: bool = False) -> dict[str, float]:
    """Median over rounds of each round's median wall time (`cpu`: also process CPU
    time, returned under "<name> cpu")."""
    timings = interleaved_timings(contenders, {name: calls * rounds for name in contenders}, rounds, warmup=2)
    out = {}
    for name, t in timings.items():
        for label, samples in ((name, t.wall), (f"{name} cpu", t.cpu)):
            if label == name or cpu:
                per_round = [statistics.median(samples[r * calls:(r + 1) * calls]) for r in range(rounds)]
                out[label] = statistics.median(per_round)
    return out


def _in_mode(mode, fn):
    from torch_tpu.device import set_eager_mode

    def run():
        with set_eager_mode(mode):
            return fn()

    return run


# -- (a) the elementwise chain ----------------------------------------------------------
def chain_ops(x):
    """The chain's 150 elementwise ops (bench/fused_record.py times their recording)."""
    y = x
    for _ in range(50):
        y = y + 1
        y = y * 2
        y = y - 1
    return y


def _chain(x):
    return chain_ops(x).cpu()


def bench_chain(rounds: int, calls: int, size: int = 1024) -> dict[str, float]:
    import torch

    from torch_tpu.device import EagerMode, _fused

    host = torch.randn(size, size)
    device = host.to("tpu")
    fused = _in_mode(EagerMode.FUSED, lambda: _chain(device))
    fused()  # the trace's first run (op by op) starts its program's compile
    _fused.wait_for_compiles()
    contenders = {
        "tpu fused": (fused, lambda r: r),
        "tpu strict": (_in_mode(EagerMode.STRICT, lambda: _chain(device)), lambda r: r),
        "cpu eager": (lambda: _chain(host), lambda r: r),
    }
    return _round_medians(contenders, rounds, calls, cpu=True)


# -- (b) the tiny-GPT step ----------------------------------------------------------------
def _gpt_step(device: str, compiled: bool = False):
    step = tiny_gpt_training_step(device, compiled, optimizer="AdamW")
    # The step's value on the host: all its work done (FUSED: the flush).
    return lambda: step().item()


def bench_gpt(rounds: int, steps: int) -> tuple[dict[str, float], float, dict]:
    """(median step seconds per contender, compiles per FUSED step after warm-up,
    FUSED statistics of the timed steps)."""
    from torch_tpu.device import EagerMode, _fused
    from torch_tpu.runtime import get_client

    fused = _in_mode(EagerMode.FUSED, _gpt_step("tpu"))
    contenders = {
        "tpu fused": (fused, lambda r: r),
        "tpu strict": (_in_mode(EagerMode.STRICT, _gpt_step("tpu")), lambda r: r),
        "cpu eager": (_gpt_step("cpu"), lambda r: r),
    }
    try:
        contenders["torch.compile(tpu)"] = (_gpt_step("cpu", compiled=True), lambda r: r)
    except Exception as err:  # noqa: BLE001 - a benchmark reports, it does not stop
        print(f"  torch.compile contender skipped: {type(err).__name__}: {err}")
    for _ in range(3):  # FUSED warm-up: plans, then the step's program (compiling in the background)
        fused()
    _fused.wait_for_compiles()
    fused()
    stats = get_client().cache.stats
    compiles, before = stats.compiles, dict(_fused.STATS)
    for _ in range(steps):
        fused()
    per_step = (stats.compiles - compiles) / steps
    after = {k: v - before[k] for k, v in _fused.STATS.items()}
    return _round_medians(contenders, rounds, steps), per_step, after


# -- (c) first iteration ------------------------------------------------------------------------
_FIRST = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, {bench!r})
    import torch, torch_tpu.device
    from torch_tpu.device import EagerMode, set_eager_mode
    from fused import _gpt_step
    step = _gpt_step("tpu")
    with set_eager_mode(EagerMode.{mode}):
        t0 = time.perf_counter(); step(); first = time.perf_counter() - t0
        t0 = time.perf_counter(); step(); second = time.perf_counter() - t0
    print(first, second)
""")


def bench_first(background: bool, mode: str) -> tuple[float, float]:
    with tempfile.TemporaryDirectory() as cache:
        # Without the background compile, the first step waits for its program and runs it.
        env = {**os.environ, "TORCH_TPU_CACHE_DIR": cache,
               "TORCH_TPU_FUSED_FIRST_RUN": "0" if background else "1"}
        out = subprocess.run([sys.executable, "-c", _FIRST.format(bench=os.path.dirname(__file__), mode=mode)],
                             capture_output=True, text=True, env=env, cwd=REPO, timeout=900)
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-2000:])
    first, second = (float(v) for v in out.stdout.split()[-2:])
    return first, second


# -- (d) host memory ----------------------------------------------------------------------------
def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def bench_memory(steps: int, warmup: int = 20) -> tuple[float, float, int]:
    """(RSS growth in MB over `steps` FUSED training steps after warm-up, RSS at the start
    in MB, fused programs cached at the end)."""
    from torch_tpu.device import EagerMode, _fused

    step = _in_mode(EagerMode.FUSED, _gpt_step("tpu"))
    for _ in range(warmup):
        step()
    gc.collect()
    start = _rss_bytes()
    for _ in range(steps):
        step()
    gc.collect()
    return (_rss_bytes() - start) / 2**20, start / 2**20, len(_fused._PROGRAMS)


# -- (e) a loop that reads its loss every 50 steps ---------------------------------------------
def bench_loop(blocks: int, every: int = 50) -> tuple[dict[str, float], dict]:
    """(seconds per step of each mode over `blocks` blocks of `every` steps after a
    warm-up block, FUSED's statistics over the timed blocks)."""
    import time

    from torch_tpu.device import EagerMode, _fused

    steps = {name: tiny_gpt_training_step("tpu", optimizer="AdamW") for name in ("fused", "strict")}
    modes = {"fused": EagerMode.FUSED, "strict": EagerMode.STRICT}

    def block(name: str) -> float:
        step = _in_mode(modes[name], lambda: [steps[name]() for _ in range(every - 1)] + [steps[name]().item()])
        t0 = time.perf_counter()
        step()
        return time.perf_counter() - t0

    for name in steps:
        block(name)  # warm-up: plans, and FUSED's first traces (their programs compile)
    before = dict(_fused.STATS)
    seconds: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(blocks):
        for name in steps:
            seconds[name].append(block(name) / every)
    stats = {k: v - before[k] for k, v in _fused.STATS.items()}
    return {name: statistics.median(v) for name, v in seconds.items()}, stats


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=2, help="timed chain runs per contender per round")
    parser.add_argument("--steps", type=int, default=3, help="timed GPT steps per contender per round")
    parser.add_argument("--memory-steps", type=int, default=1000)
    parser.add_argument("--size", type=int, default=1024, help="the chain's tensor is size x size float32")
    parser.add_argument("--loop-blocks", type=int, default=2, help="timed 50-step blocks per mode in (e)")
    parser.add_argument("--skip", default="", help="comma list of parts to skip: chain,gpt,first,memory,loop")
    args = parser.parse_args(argv)
    skip = set(filter(None, args.skip.split(",")))
    import torch_tpu.device  # noqa: F401 - registers the device

    if "chain" not in skip:
        from torch_tpu.runtime import get_client

        print(f"(a) 50 x (y+1; y*2; y-1) on {args.size}x{args.size} f32, then .cpu(), on {get_client().platform} "
              f"(median of {args.rounds} round medians):")
        chain = bench_chain(args.rounds, args.calls, args.size)
        for name in ("tpu fused", "tpu strict", "cpu eager"):
            print(f"  {name:12s} {chain[name] * 1e3:8.1f} ms wall   {chain[name + ' cpu'] * 1e3:8.1f} ms CPU")
        print(f"  FUSED/Strict: {chain['tpu strict'] / chain['tpu fused']:5.1f}x faster (wall), "
              f"{chain['tpu strict cpu'] / chain['tpu fused cpu']:5.1f}x (CPU time); "
              f"vs CPU eager {chain['cpu eager'] / chain['tpu fused']:5.1f}x faster (wall)")
    if "gpt" not in skip:
        print(f"(b) tiny-GPT training step (TinyGPT d=128, 2 layers, batch 4x64, AdamW; {args.rounds} rounds):")
        gpt, per_step, stats = bench_gpt(args.rounds, args.steps)
        for name, seconds in gpt.items():
            print(f"  {name:20s} {seconds * 1e3:8.2f} ms   vs cpu eager {seconds / gpt['cpu eager']:5.2f}x")
        if "torch.compile(tpu)" in gpt:
            print(f"  FUSED throughput vs torch.compile(tpu): {gpt['torch.compile(tpu)'] / gpt['tpu fused']:.2f}x")
        print(f"  FUSED after warm-up: {per_step:g} compiles per step; {stats}")
    if "first" not in skip:
        print("(c) first GPT step in a fresh process, cold compile cache (first step, second step):")
        for label, background, mode in (("fused, background compile", True, "FUSED"),
                                        ("fused, program from step 1", False, "FUSED"),
                                        ("strict", True, "STRICT")):
            first, second = bench_first(background, mode)
            print(f"  {label:28s} {first:7.2f} s   {second:7.2f} s")
    if "loop" not in skip:
        print(f"(e) tiny-GPT AdamW loop reading its loss every 50 steps ({args.loop_blocks} blocks per mode):")
        per_step, stats = bench_loop(args.loop_blocks)
        for name, seconds in per_step.items():
            print(f"  {name:8s} {seconds * 1e3:8.2f} ms per step")
        print(f"  FUSED/Strict: {per_step['strict'] / per_step['fused']:5.2f}x faster; fused runs "
              f"{stats['fused_runs']} of {stats['flushes']} flushes ({stats['interpreted_runs']} op by op)")
    if "memory" not in skip:
        growth, start, programs = bench_memory(args.memory_steps)
        print(f"(d) host memory over {args.memory_steps} FUSED training steps after warm-up: "
              f"{growth:+.1f} MB (RSS {start:.0f} MB at start; {programs} fused programs cached)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
