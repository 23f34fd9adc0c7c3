"""The host cost of launching one small program, and whether anything could hide it (issue
28). Everything here is jaxlib and Python: no torch_tpu code runs, so the figures are the
floor every PjRT frontend in Python meets on the machine it runs on.

* `execute`: `execute_sharded` of a jitted `a + b` on 1k floats, back to back -- the host
  time of one launch (on the TPU v5e machine this is most of a `jax.jit` call and of an
  eager op: ~105-115 us there, ~8-12 us on XLA:CPU here);
* `execute after N us of Python`: the same launch with a fixed amount of pure Python
  between launches, as an eager op or a compiled call has (its own bookkeeping, Dynamo's
  frame): a launch after Python work costs more than one back to back (caches, the
  runtime's threads going idle);
* `on a launch thread`: that Python on the calling thread, each launch handed to one
  worker thread through a queue (what an asynchronous launch queue would do), vs both
  inline. The launch gains only where jaxlib releases the GIL for it and the worker gets
  the GIL back in time;
* `tracebacks on / off`: jaxlib's process-wide switch that records a Python traceback
  for every array it creates, on and off for `jax.jit` calls.

    .venv/bin/python bench/launch_overlap.py [--calls 1000] [--rounds 5]

The figure is the best (min) of `--rounds` rounds of `--calls` calls each (medians are
printed beside); nothing is asserted.
"""

from __future__ import annotations

import argparse
import queue
import statistics
import threading
import time
from typing import Callable


def _rounds(fn: Callable[[], object], sync: Callable[[], object], calls: int, rounds: int) -> tuple[float, float]:
    """(best, median) microseconds per call over `rounds` rounds of `calls` calls."""
    per_call = []
    for _ in range(rounds):
        sync()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        sync()
        per_call.append((time.perf_counter() - t0) / calls * 1e6)
    return min(per_call), statistics.median(per_call)


def _python_work(steps: int) -> int:
    """Pure Python: `steps` function calls (no C extension, no allocation beyond ints)."""
    def step(v: int) -> int:
        return v + 1

    v = 0
    for _ in range(steps):
        v = step(v)
    return v


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--work", default="1500,3000", help="Python steps between launches (comma-separated)")
    args = ap.parse_args()

    import jax
    import jax.numpy as jnp
    from jaxlib import _jax

    x = jnp.ones((1024,), jnp.float32)
    y = jnp.ones((1024,), jnp.float32)
    add = jax.jit(lambda a, b: a + b)
    executable = add.lower(x, y).compile()._executable.xla_executable
    executable.execute_sharded([x, y])

    def sync() -> None:
        add(x, y).block_until_ready()

    def launch() -> None:
        executable.execute_sharded([x, y])

    calls, rounds = args.calls, args.rounds
    print(f"jax {jax.__version__} on {jax.devices()[0].platform}; microseconds per call, best of {rounds} rounds "
          f"[median]")

    def show(label: str, figures: tuple[float, float]) -> None:
        print(f"  {label:58s} {figures[0]:8.1f}  [{figures[1]:.1f}]")

    show("jax.jit(a + b), back to back", _rounds(lambda: add(x, y), sync, calls, rounds))
    show("execute_sharded alone, back to back", _rounds(launch, sync, calls, rounds))
    for steps in (int(s) for s in args.work.split(",")):
        work = _rounds(lambda: _python_work(steps), lambda: None, calls, rounds)
        show(f"Python work alone ({steps} steps)", work)
        show("  + execute inline", _rounds(lambda: (_python_work(steps), launch()), sync, calls, rounds))
        show("  + execute on a launch thread", _on_launch_thread(executable, [x, y], steps, sync, calls, rounds))
    for enabled in (True, False, True, False):
        _jax.set_tracebacks_enabled(enabled)
        show(f"jax.jit(a + b), jaxlib tracebacks {'on' if enabled else 'off'}",
             _rounds(lambda: add(x, y), sync, calls, rounds))
    _jax.set_tracebacks_enabled(True)


def _on_launch_thread(executable, arguments, steps: int, sync, calls: int, rounds: int) -> tuple[float, float]:
    """The calling thread runs the Python work and queues each launch; one worker thread
    launches them in order (a launch queue's shape). Per call, until the worker is done."""
    per_call = []
    for _ in range(rounds):
        work: queue.SimpleQueue = queue.SimpleQueue()

        def worker() -> None:
            while (item := work.get()) is not None:
                executable.execute_sharded(item)

        thread = threading.Thread(target=worker, daemon=True)
        thread.start()
        sync()
        t0 = time.perf_counter()
        for _ in range(calls):
            _python_work(steps)
            work.put(arguments)
        work.put(None)
        thread.join()
        sync()
        per_call.append((time.perf_counter() - t0) / calls * 1e6)
    return min(per_call), statistics.median(per_call)


if __name__ == "__main__":
    main()
