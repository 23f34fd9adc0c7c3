"""Shared helpers of the benchmarks in bench/: timing (median of per-call samples,
interleaved rounds) and small formatting utilities. Nothing here asserts."""

from __future__ import annotations

import logging
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable

__all__ = ["tiny_gpt_training_step", "time_first_call", "interleaved_timings", "Timing", "calls_for_budget", "fmt_s", "fmt_ratio", "LogCounter",
           "wait_for_idle_threads"]


def time_first_call(fn: Callable[[], object], sync: Callable[[object], object] = lambda r: r) -> tuple[float, object]:
    """Seconds taken by one call of `fn` (including `sync` of its result), and the result."""
    t0 = time.perf_counter()
    result = sync(fn())
    return time.perf_counter() - t0, result


def calls_for_budget(per_call_s: float, budget_s: float, lo: int, hi: int) -> int:
    """How many timed calls fit into `budget_s`, clamped to [lo, hi]."""
    if per_call_s <= 0:
        return hi
    return max(lo, min(hi, int(budget_s / per_call_s)))


@dataclass
class Timing:
    """Per-call samples of one contender: wall seconds (perf_counter) and process CPU
    seconds (process_time: all threads of this process, so it includes XLA's and
    PyTorch's worker threads; it is much less disturbed by other processes than wall
    time on a loaded machine)."""

    wall: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)
    # CPU seconds of the calling thread alone (thread_time): the dispatch work that sits
    # on the critical path before and after the program runs.
    thread: list[float] = field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(self.wall)

    @property
    def best(self) -> float:
        return min(self.wall)

    @property
    def cpu_median(self) -> float:
        return statistics.median(self.cpu)

    @property
    def thread_median(self) -> float:
        return statistics.median(self.thread)


# Shared with the quickstart's own comparison (python/torch_tpu/program/timing.py).
from torch_tpu.program.timing import wait_for_idle_threads  # noqa: E402


def interleaved_timings(
    contenders: dict[str, tuple[Callable[[], object], Callable[[object], object]]],
    calls: dict[str, int],
    rounds: int,
    warmup: int = 2,
    settle: Callable[[], object] | None = None,
) -> dict[str, Timing]:
    """Per-call timings of each contender. Each contender is (fn, sync); `sync` blocks on
    the result (e.g. `.block_until_ready()`). The `calls[name]` timed calls of every
    contender are spread over `rounds` interleaved rounds (round r runs a short block of
    calls of each contender in turn), so that machine noise (other processes, clock
    changes) hits all contenders alike; every call is timed on its own. `settle`, if
    given, runs (untimed) before each block, e.g. `wait_for_idle_threads`."""
    samples: dict[str, Timing] = {name: Timing() for name in contenders}
    for name, (fn, sync) in contenders.items():
        for _ in range(warmup):
            sync(fn())
    for r in range(rounds):
        for name, (fn, sync) in contenders.items():
            total = calls[name]
            n = total // rounds + (1 if r < total % rounds else 0)
            t = samples[name]
            if settle is not None and n:
                settle()
            for _ in range(n):
                c0 = time.process_time()
                h0 = time.thread_time()
                t0 = time.perf_counter()
                sync(fn())
                t1 = time.perf_counter()
                t.thread.append(time.thread_time() - h0)
                t.cpu.append(time.process_time() - c0)
                t.wall.append(t1 - t0)
    return {name: t for name, t in samples.items() if t.wall}


def fmt_s(seconds: float | None) -> str:
    """Human-readable duration: µs / ms / s."""
    if seconds is None:
        return "-"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.0f} µs"
    if seconds < 1.0:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds:.2f} s"


def fmt_ratio(num: float | None, den: float | None) -> str:
    if num is None or den is None or den <= 0:
        return "-"
    return f"{num / den:.2f}x"


class LogCounter(logging.Handler):
    """Counts the records of a logger whose message contains `needle` (and keeps them)."""

    def __init__(self, needle: str) -> None:
        super().__init__(level=logging.DEBUG)
        self.needle = needle
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a malformed record must not break a benchmark
            return
        if self.needle in message:
            self.messages.append(message)

    @property
    def count(self) -> int:
        return len(self.messages)

    def clear(self) -> None:
        self.messages.clear()


def tiny_gpt_training_step(device: str, compiled: bool = False, optimizer: str = "Adam") -> Callable[[], object]:
    """One training step of the quickstart's tiny GPT on `device` (`torch.compile(backend=
    "tpu")` of the model when `compiled`), with `torch.optim.<optimizer>`; the step returns
    its loss tensor (not synchronised)."""
    import torch
    import torch.nn.functional as F

    from torch_tpu.examples.quickstart import TinyGPT

    torch.manual_seed(0)
    model = TinyGPT().to(device)
    opt = getattr(torch.optim, optimizer)(model.parameters(), lr=1e-3)
    ids = torch.randint(0, 512, (4, 64)).to(device)
    target = torch.randint(0, 512, (4, 64)).to(device)
    forward = torch.compile(model, backend="tpu") if compiled else model

    def step():
        opt.zero_grad(set_to_none=True)
        logits = forward(ids)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))
        loss.backward()
        opt.step()
        return loss

    return step


def host_clock() -> tuple[Callable[[], float], str]:
    """(clock, its name) for timing host work on the calling thread: `time.thread_time`
    where it ticks finely, else `time.perf_counter` (wall). A TPU VM's sandboxed host
    (gVisor) advances the thread CPU clock in 0.5 ms steps, which turns a 300 us call into
    0 or 500 us; its wall clock is fine."""
    start = time.thread_time()
    step = 0.0
    for _ in range(1_000_000):
        now = time.thread_time()
        if now != start:
            step = now - start
            break
    if 0 < step <= 20e-6:
        return time.thread_time, "calling thread's CPU"
    return time.perf_counter, f"wall (the thread CPU clock ticks every {step * 1e6:.0f} us here)"
