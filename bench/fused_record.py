"""FUSED mode's per-op recording cost in a steady, repeated trace (issue 30 item 7).

The 150-op elementwise chain of `bench/fused.py` (50 x `y + 1; y * 2; y - 1`) on a
`--size` square float32 tpu tensor, recorded in FUSED mode after its fused program
compiled: the time from the first op to the last one recorded (nothing runs: recording
only), divided by the op count; then the flush on its own (host time to enqueue the fused
program, not waiting for it).
Medians over `--repeats` chains, in wall time and in the recording thread's CPU time
(`time.thread_time`: what a loaded machine distorts least). `--profile N`: cProfile of N
recordings and flushes, top functions.

    .venv/bin/python bench/fused_record.py [--size 1024] [--repeats 200] [--profile 50]
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import time


from fused import chain_ops as _record_chain  # the chain of bench/fused.py, without its .cpu()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--profile", type=int, default=0, help="cProfile this many recordings")
    a = parser.parse_args()

    import torch

    import torch_tpu.device  # noqa: F401
    from torch_tpu.device import EagerMode, _fused, set_eager_mode

    x = torch.randn(a.size, a.size).to("tpu")
    with set_eager_mode(EagerMode.FUSED):
        for _ in range(3):  # the first run starts the compile; wait for it, then warm up
            _record_chain(x).cpu()
            _fused.wait_for_compiles()
        before = dict(_fused.STATS)
        record, flush = [], []
        for _ in range(a.repeats):
            c0, t0 = time.thread_time(), time.perf_counter()
            y = _record_chain(x)
            c1, t1 = time.thread_time(), time.perf_counter()
            _fused.flush_all()  # enqueues the fused program; the host does not wait for it
            c2, t2 = time.thread_time(), time.perf_counter()
            torch.tpu.synchronize()
            record.append((t1 - t0, c1 - c0))
            flush.append((t2 - t1, c2 - c1))
            del y
        fused = _fused.STATS["fused_runs"] - before["fused_runs"]
        for name, samples, per in (("record", record, 150), ("flush", flush, 1)):
            wall = statistics.median(s[0] for s in samples)
            cpu = statistics.median(s[1] for s in samples)
            print(f"{name}: {wall / per * 1e6:7.1f} us wall {cpu / per * 1e6:7.1f} us thread CPU"
                  + (" per op" if per > 1 else " per flush (host, not waiting for the program)"))
        print(f"{fused} of {a.repeats} flushes ran the fused program")
        if a.profile:
            profile = cProfile.Profile()
            profile.enable()
            for _ in range(a.profile):
                _record_chain(x)
                torch.tpu.synchronize()
            profile.disable()
            pstats.Stats(profile).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()
