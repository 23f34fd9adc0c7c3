"""Eager per-op and small-transfer overhead (issue 28), ours vs JAX in one process on the
same PjRT client, as bench/tpu.py's cases 4 and 5 time them, with the calling thread's
CPU time beside the wall time (on a loaded machine the thread time is the steadier
figure of our own Python and bookkeeping cost):

* `x + y` on 1k floats, back to back (blocks of `--ops` ops ended by one sync);
* host -> device 1 MB: `t.to("tpu")` vs `jax.device_put` (each call waited for);
* device -> host 1 MB: `t.cpu()` vs `np.asarray` -- on XLA:CPU NumPy aliases the
  buffer while `.cpu()` must return memory of its own, so `np.array` (one copy) is
  timed too: the fair floor there. On a TPU both are one transfer.
* the same reads back to back, each of a value just computed (`.cpu()` of `src * one`,
  `np.asarray` of JAX's `a * s`), beside jaxlib's own read of the tpu tensor's buffer
  (`host_value` of a fresh handle, what `.cpu()` calls) and of JAX's result: on the
  chip's host (sixteenth session) this loop took 2.2 ms a `.cpu()` against 1.3 ms a JAX
  read, with jaxlib's read itself 1.9 vs 1.07 ms, where case 5's waited-for reads were
  0.76 vs 0.72 ms; these rows tell whose side the difference is on.

    .venv/bin/python bench/eager_overhead.py [--rounds 15] [--ops 200] [--calls 30]

Contenders alternate within each round; the figure is the median over rounds of each
round's median. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def _per_call(fn, sync, calls: int, clock) -> float:
    t0 = clock()
    out = None
    for _ in range(calls):
        out = fn()
    sync(out)
    return (clock() - t0) / calls


def _each(fn, prepare, calls: int, clock) -> float:
    samples = []
    for _ in range(calls):
        arg = prepare()
        t0 = clock()
        fn(arg)
        samples.append(clock() - t0)
    return statistics.median(samples)


def measure(contenders: dict, rounds: int, timer) -> dict[str, tuple[float, float]]:
    """{name: (wall µs, thread µs)}: median over rounds; `timer(contender, clock)` times
    one block of a contender and returns seconds per call."""
    wall: dict[str, list[float]] = {k: [] for k in contenders}
    thread: dict[str, list[float]] = {k: [] for k in contenders}
    for c in contenders.values():
        timer(c, time.perf_counter)
    for _ in range(rounds):
        for name, c in contenders.items():
            wall[name].append(timer(c, time.perf_counter))
            thread[name].append(timer(c, time.thread_time))
    return {k: (statistics.median(wall[k]) * 1e6, statistics.median(thread[k]) * 1e6) for k in contenders}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--ops", type=int, default=200, help="eager ops per timed block")
    parser.add_argument("--calls", type=int, default=30, help="transfers per timed block (median of them)")
    args = parser.parse_args(argv)

    from tpu import share_jax_client

    platform = share_jax_client()
    import jax
    import numpy as np
    import torch

    torch.manual_seed(0)
    x_cpu, y_cpu = torch.randn(1000), torch.randn(1000)
    x, y = x_cpu.to("tpu"), y_cpu.to("tpu")
    xj, yj = jax.device_put(x_cpu.numpy()), jax.device_put(y_cpu.numpy())

    def sync_torch(_=None):
        torch.tpu.synchronize()

    add = {"jnp x + y": (lambda: xj + yj, jax.block_until_ready), "eager tpu x + y": (lambda: x + y, sync_torch)}
    rows = measure(add, args.rounds, lambda c, clock: _per_call(c[0], c[1], args.ops, clock))

    host = torch.randn(1 << 18)
    host_np = host.numpy()
    src, src_j = host.to("tpu"), jax.device_put(host_np)
    one, one_j = torch.ones((), device="tpu"), jax.device_put(np.float32(1.0))
    scale = jax.jit(lambda a, s: a * s)

    def fresh_torch():
        t = src * one
        torch.tpu.synchronize()
        return t

    def fresh_jax():
        return scale(src_j, one_j).block_until_ready()

    transfers = {
        "h2d 1 MB jax.device_put": (lambda _: jax.device_put(host_np).block_until_ready(), lambda: None),
        "h2d 1 MB t.to('tpu')": (lambda _: sync_torch(host.to("tpu")), lambda: None),
        "d2h 1 MB np.asarray": (np.asarray, fresh_jax),
        "d2h 1 MB np.array (a copy)": (np.array, fresh_jax),
        "d2h 1 MB t.cpu()": (lambda t: t.cpu(), fresh_torch),
    }
    rows.update(measure(transfers, args.rounds, lambda c, clock: _each(c[0], c[1], args.calls, clock)))

    from torch_tpu.device._buffers import entry_of
    from torch_tpu.device._storage import buffer_of
    from torch_tpu.runtime import _jaxlib

    def jaxlib_read_of_ours():
        # (the tensor kept alive through the read, as `.cpu()` does: a temporary's storage
        # would die between the clone and the read)
        t = src * one
        out = _jaxlib.host_value(_jaxlib.array_clone(buffer_of(entry_of(t))._array), fresh=True)
        del t
        return out

    def jaxlib_read_of_dying_temporary():
        return _jaxlib.host_value(_jaxlib.array_clone(buffer_of(entry_of(src * one))._array), fresh=True)

    back_to_back = {
        "d2h 1 MB np.asarray(a * s), loop": lambda: np.asarray(scale(src_j, one_j)),
        "d2h 1 MB (src * one).cpu(), loop": lambda: (src * one).cpu(),
        "d2h 1 MB jaxlib read of ours, loop": jaxlib_read_of_ours,
        "d2h 1 MB same, temporary dies first": jaxlib_read_of_dying_temporary,
        "d2h 1 MB jaxlib read of JAX's, loop": lambda: _jaxlib.host_value(scale(src_j, one_j)),
    }
    rows.update(measure(back_to_back, args.rounds, lambda fn, clock: _per_call(fn, lambda _r: None, args.calls, clock)))

    print(f"platform {platform}; jax {jax.__version__}, torch {torch.__version__}; median over {args.rounds} rounds")
    print(f"{'contender':34} {'wall µs':>9} {'thread µs':>10}")
    for name, (w, t) in rows.items():
        print(f"{name:34} {w:9.1f} {t:10.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
