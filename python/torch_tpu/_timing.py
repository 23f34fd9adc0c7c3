"""Compile-phase timings: one small timer that feeds torch.profiler (record_function)
and keeps per-phase totals for logs and benchmarks."""

from __future__ import annotations

import contextlib
import logging
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
