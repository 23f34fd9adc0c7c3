"""Whether PjRT's launch releases the GIL (issue 28: the premise of Strict mode's launch
thread, `runtime/launch_queue.py`): a Python thread counts while the main thread launches
a large matmul program (`execute_sharded` + `consume_with_handlers`, what the launch thread
calls), and while it launches and waits for the result. A launch that held the GIL would
leave the counter near zero; the figure is the counter's rate against its rate alone.

    .venv/bin/python bench/launch_gil.py [--size 1024] [--seconds 2]

Nothing is asserted.
"""

from __future__ import annotations

import argparse
import threading
import time

import numpy as np


def _count(stop: list[bool], result: list[int]) -> None:
    n = 0
    while not stop[0]:
        n += 1
    result.append(n)


def _counter_rate(work, seconds: float) -> tuple[float, int]:
    """(counter increments per second while `work` runs in a loop, calls of `work`)."""
    stop, result = [False], []
    thread = threading.Thread(target=_count, args=(stop, result))
    thread.start()
    start, calls = time.perf_counter(), 0
    while time.perf_counter() - start < seconds:
        work()
        calls += 1
    elapsed = time.perf_counter() - start
    stop[0] = True
    thread.join()
    return result[0] / elapsed, calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=1024, help="the matmuls are size x size float32")
    parser.add_argument("--seconds", type=float, default=2.0)
    args = parser.parse_args()
    from torch_tpu.runtime import get_client

    client = get_client()
    n = args.size
    t = f"tensor<{n}x{n}xf32>"
    exe = client.compile(f"""
func.func @main(%a: {t}, %b: {t}) -> {t} {{
  %0 = stablehlo.dot_general %a, %b, contracting_dims = [1] x [0] : ({t}, {t}) -> {t}
  %1 = stablehlo.dot_general %0, %b, contracting_dims = [1] x [0] : ({t}, {t}) -> {t}
  return %1 : {t}
}}""")
    array = client.to_device(np.random.rand(n, n).astype(np.float32))._array
    raw, handlers = exe._raw, exe._handlers

    def launch():
        return raw.execute_sharded([array, array]).consume_with_handlers(handlers)

    def launch_and_wait():
        launch()[0].block_until_ready()

    launch_and_wait()
    alone, _ = _counter_rate(lambda: time.sleep(0.01), args.seconds)
    print(f"platform {client.platform}; a Python counter alone: {alone / 1e6:.1f} M/s")
    for label, work in (("launch", launch), ("launch + wait", launch_and_wait)):
        rate, calls = _counter_rate(work, args.seconds)
        print(f"{label:14s} {args.seconds * 1e3 / calls:7.1f} ms per call; counter {rate / 1e6:.1f} M/s "
              f"({rate / alone:.0%} of its rate alone)")


if __name__ == "__main__":
    main()
