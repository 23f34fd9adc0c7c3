"""Compile-phase timings: one small timer that feeds torch.profiler (record_function)
and keeps per-phase totals for logs and benchmarks."""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections import defaultdict

import torch

log = logging.getLogger("torch_tpu")

# phase name -> [total seconds, count]; read by bench/models.py and slow-compile logs.
TOTALS: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])


@contextlib.contextmanager
def phase(name: str, timings: dict[str, float] | None = None):
    start = time.perf_counter()
    with torch.profiler.record_function(f"torch_tpu::{name}"):
        try:
            yield
        finally:
            elapsed = time.perf_counter() - start
            TOTALS[name][0] += elapsed
            TOTALS[name][1] += 1
            if timings is not None:
                timings[name] = timings.get(name, 0.0) + elapsed


def record(name: str, seconds: float, timings: dict[str, float] | None = None) -> None:
    """A phase timed elsewhere (a compile on a background thread): counted as `phase` counts."""
    TOTALS[name][0] += seconds
    TOTALS[name][1] += 1
    if timings is not None:
        timings[name] = timings.get(name, 0.0) + seconds


def reset() -> None:
    TOTALS.clear()


def snapshot() -> dict[str, float]:
    return {name: total for name, (total, _) in TOTALS.items()}


def _running_threads(own: int) -> int:
    """How many threads of this process other than `own` are running or runnable (state R
    in /proc/self/task/<tid>/stat); -1 where /proc cannot be read."""
    running = 0
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return -1
    for tid in tids:
        if int(tid) == own:
            continue
        try:
            with open(f"/proc/self/task/{tid}/stat") as fh:
                stat = fh.read()
        except OSError:  # the thread ended meanwhile
            continue
        if stat[stat.rindex(")") + 2] == "R":
            running += 1
    return running


def wait_for_idle_threads(timeout_s: float = 0.25, poll_s: float = 0.0005) -> float:
    """Waits (at most `timeout_s`) until no other thread of this process runs; returns the
    seconds waited. Worker threads keep spinning after their work is done: libgomp's
    OpenMP workers, which eager PyTorch ops use, spin after every parallel region
    (OMP_WAIT_POLICY unset; 40-55 ms of wall time after one 1024x1024 matmul on the 2-core
    CI machine), and XLA's Eigen pool briefly. Called between the
    blocks of interleaved contenders, this keeps one contender's spinning workers from
    taking a core from the next contender and from being charged to its process CPU
    time: measured on the MLP of bench/models.py, eager's workers added ~3-8 ms of process
    CPU to each call of the contender after it. Not timed itself."""
    own = threading.get_native_id()
    start = time.perf_counter()
    while _running_threads(own) > 0 and time.perf_counter() - start < timeout_s:
        time.sleep(poll_s)
    return time.perf_counter() - start
