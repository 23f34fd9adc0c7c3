"""The cyclic garbage collector while FUSED mode is on.

An eager training step in FUSED mode makes ~5 objects the collector tracks per recorded op
(the tensor, its storage entry, the pending value, the operand list, ...), ~9,000 in a
16-layer step, most of them alive until the backward or the flush. With Python's default
young-generation threshold (700 allocations) a step runs ~13 young collections whose
survivors are promoted, and every ~30 steps a full collection walks the whole process
(~600k objects after importing torch: ~140 ms here, more on a TPU host). Measured on a
16-layer step (bench/tpu.py case 7 --small): 75 ms a step with the default threshold,
65 ms with the collector off, 64-65 ms with a threshold of 5,000-20,000 (a step's
temporaries die before a collection sees them).

So while FUSED mode is on, the young-generation threshold is raised to
TORCH_TPU_FUSED_GC_THRESHOLD, and put back when it is left. Only Python's default is
replaced: an application that set its own threshold keeps it, and one that sets its own
while FUSED mode is on keeps that too. Collections still run (cycles are still freed),
only less often."""

from __future__ import annotations

import gc
import sys

from torch_tpu.core import config

# CPython's own young-generation threshold: 700 up to 3.12, 2000 from 3.13 on.
PYTHON_DEFAULT_THRESHOLD0 = 2000 if sys.version_info >= (3, 13) else 700
# (the thresholds replaced on entering FUSED mode, the young one set instead), None while
# nothing is replaced.
_replaced: list[tuple[tuple[int, ...], int] | None] = [None]


def fused_mode_entered() -> None:
    if _replaced[0] is not None:
        return
    threshold = config.get("TORCH_TPU_FUSED_GC_THRESHOLD")
    current = gc.get_threshold()
    if threshold <= 0 or current[0] != PYTHON_DEFAULT_THRESHOLD0:
        return  # turned off, or the application's own setting
    _replaced[0] = (current, threshold)
    gc.set_threshold(threshold, *current[1:])


def fused_mode_left() -> None:
    replaced = _replaced[0]
    if replaced is None:
        return
    _replaced[0] = None
    saved, ours = replaced
    if gc.get_threshold()[0] == ours:
        gc.set_threshold(*saved)  # (not when the application changed it meanwhile)
