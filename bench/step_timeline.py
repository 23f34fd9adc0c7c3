"""Where the first step of a block goes: host timestamps of bench/tpu.py case 7's compiled
training step (issue 28).

A training loop that reads its loss every few steps syncs the device, so the next step's host
work (Dynamo, AOTAutograd, recording the graphs, the flush, PjRT's launch) runs while the
device is idle: that stretch is what the step's wall time adds to its device time. This runs
blocks of `--steps` steps after a sync, marks the time of each compiled graph's call and
return, of the deferred trace's flush and of each PjRT execute call (with its argument
count), and prints the median of each mark over the blocks, relative to the block's start,
with the garbage collections of the last block.

    python bench/step_timeline.py [--small] [--layers N] [--blocks 8] [--steps 3] [--json PATH]

On the chip the device starts when the step's big execute call returns; the sync's return
minus the steps' device time says the same (docs/explanation/performance.md, eleventh
session). With TORCH_TPU_EARLY_STEP_LAUNCH (the default, thirteenth session) that call is made
inside the step's first graph call; set it to 0 to see the launch at the step's end. `--small`
runs the small config on XLA:CPU in seconds (the marks still mean what they say; the execute
call there also runs part of the program).
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import statistics
import sys
import time
from typing import Any, Callable

from tpu import _torch_train_step, base_llama, llama_config  # bench/tpu.py's model and step


class Marks:
    """(name, perf_counter) events, appended by the wrappers `install` puts in place."""

    def __init__(self) -> None:
        self.events: list[tuple[str, float]] = []
        self.collections: list[tuple[str, int, float]] = []

    def mark(self, name: str) -> None:
        self.events.append((name, time.perf_counter()))

    def on_gc(self, phase: str, info: dict) -> None:
        self.collections.append((phase, info["generation"], time.perf_counter()))

    def clear(self) -> None:
        self.events.clear()
        self.collections.clear()


def _timed(marks: Marks, name: str, fn: Callable) -> Callable:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        marks.mark(name)
        try:
            return fn(*args, **kwargs)
        finally:
            marks.mark(name + "_done")

    return wrapper


def install(marks: Marks) -> None:
    """Marks each compiled graph's call, each flush of a deferred trace, and each PjRT
    execute (named `execN`, N its argument count). Before any program is compiled: the
    runner is made per executable."""
    from torch_tpu.backend import _invoker
    from torch_tpu.device import _fused
    from torch_tpu.runtime import _jaxlib

    _invoker.PrecisionKeyed.__call__ = _timed(marks, "graph", _invoker.PrecisionKeyed.__call__)
    _fused.Trace._flush = _timed(marks, "flush", _fused.Trace._flush)
    make_runner = _jaxlib.make_runner

    def timed_runner(executable: Any, handlers: Any) -> Callable:
        run = make_runner(executable, handlers)

        def timed(arrays: list) -> Any:
            marks.mark(f"exec{len(arrays)}")
            try:
                return run(arrays)
            finally:
                marks.mark("exec_done")

        return timed

    _jaxlib.make_runner = timed_runner
    gc.callbacks.append(marks.on_gc)


def run(small: bool, layers: int | None, blocks: int, steps: int) -> dict:
    import torch

    from torch_tpu.device import _fused

    marks = Marks()
    install(marks)
    cfg = llama_config(small, layers)
    batch, seq = (2, 16) if small else (4, 512)
    model = copy.deepcopy(base_llama(cfg)).to("tpu").train()
    ids = torch.randint(0, cfg.vocab, (batch, seq)).to("tpu")
    targets = torch.randint(0, cfg.vocab, (batch, seq)).to("tpu")
    step, _ = _torch_train_step(model, cfg, compile_step=True)
    for _ in range(4):  # the first sighting runs graph by graph; the second compiles the step
        step(ids, targets).item()
    _fused.wait_for_compiles()
    for _ in range(steps):
        step(ids, targets).item()

    per_block: list[list[tuple[str, float]]] = []
    last_collections: list = []
    for _ in range(blocks):
        torch.tpu.synchronize()
        marks.clear()
        start = time.perf_counter()
        for i in range(steps):
            marks.mark(f"step{i}")
            step(ids, targets)
            marks.mark(f"return{i}")
        marks.mark("sync")
        torch.tpu.synchronize()
        marks.mark("sync_done")
        per_block.append([(name, (t - start) * 1e3) for name, t in marks.events])
        last_collections = [(phase, gen, round((t - start) * 1e3, 2)) for phase, gen, t in marks.collections]

    # Blocks repeat the same sequence of marks: the k-th mark's median over the blocks.
    names = [name for name, _ in per_block[-1]]
    same = [b for b in per_block if [n for n, _ in b] == names]
    medians = [(name, statistics.median(b[k][1] for b in same)) for k, name in enumerate(names)]
    return {"config": {**cfg.__dict__, "batch": batch, "seq": seq, "steps_per_block": steps},
            "blocks": len(same), "marks_ms": medians, "last_block_collections": last_collections}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small", action="store_true", help="the small config (seconds on XLA:CPU)")
    ap.add_argument("--layers", type=int, default=None)
    ap.add_argument("--blocks", type=int, default=8)
    ap.add_argument("--steps", type=int, default=3, help="steps per block (a sync ends each block)")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    result = run(a.small, a.layers, a.blocks, a.steps)
    print(f"median of {result['blocks']} blocks of {a.steps} steps, ms from the block's start:")
    for name, ms in result["marks_ms"]:
        print(f"  {name:14s} {ms:9.2f}")
    print("garbage collections in the last block (phase, generation, ms):", result["last_block_collections"])
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
