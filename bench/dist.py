"""tpu_dist vs gloo (issue 15), 2 processes on this machine, in the same job:

* all_reduce bus bandwidth, 1 KB to 64 MB: `tpu_dist` on tpu tensors vs the `gloo`
  backend on CPU tensors (goal >= 1.0x from 1 MB up). Bus bandwidth = bytes x 2(n-1)/n
  / time (NCCL's convention), median over `--iters` timed calls after warm-up. The
  `program` column is the same XLA collective program run alone on a device buffer
  (no torch_tpu Python around it): what jaxlib's XLA:CPU gloo collectives cost for the
  bytes. `faults` are minor page faults per call (fresh memory the call touched); `CPU
  ms/call` the process's CPU time per call, all its threads (median; rank 0);
* a DDP training step (MLP, SGD) on tpu tensors over tpu_dist vs on CPU over gloo.

    .venv/bin/python bench/dist.py [--iters 20] [--min-kb 1] [--max-mb 64] [--steps 10]

Re-launches itself under torchrun (`--nproc_per_node=2`); one process group serves both
(`init_process_group("tpu_dist")`). Rank 0 prints the table. Nothing is
asserted. On XLA:CPU both backends move the bytes over loopback TCP with gloo's ring
all-reduce; torch's gloo reduces in place, XLA's program into a new output buffer (see
docs/explanation/distributed.md, "Performance"): `program/gloo` is that difference,
`ratio` adds tpu_dist's Python path.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time


def _timed(fn, iters: int) -> float:
    for _ in range(3):
        fn()
    samples = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def _timed_alternated(fns, iters: int) -> list[tuple[float, float, float]]:
    """(median seconds, minor page faults per call, median CPU seconds per call of the
    whole process -- every thread: what a call costs the machine whatever its load) of
    each of `fns`, alternated call by call (the machine's load hits all of them)."""
    import resource

    for _ in range(3):
        for fn in fns:
            fn()
    samples: list[list[float]] = [[] for _ in fns]
    cpu: list[list[float]] = [[] for _ in fns]
    faults = [0] * len(fns)
    for _ in range(iters):
        for k, fn in enumerate(fns):
            before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            c0 = time.process_time()
            t0 = time.perf_counter()
            fn()
            samples[k].append(time.perf_counter() - t0)
            cpu[k].append(time.process_time() - c0)
            faults[k] += resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    return [(statistics.median(s), f / iters, statistics.median(c)) for s, f, c in zip(samples, faults, cpu)]


def _program_alone(tensor):
    """The all_reduce program tpu_dist runs for `tensor`, run alone on a device buffer
    that stays the same (its output dropped): the XLA program's own time."""
    import torch.distributed as dist

    from torch_tpu.distributed import _process_group

    group = dist.distributed_c10d._get_default_group()
    program, _ = group._program("all_reduce", tensor.numel(), tensor.dtype, group.group_ranks, reduce_op="sum")
    buffer = _process_group._flat_buffer(tensor)
    return lambda: program.run([buffer], group._handshake_name)[0].synchronize()


def _bandwidth(args) -> list[tuple]:
    import torch
    import torch.distributed as dist

    n = dist.get_world_size()
    rows = []
    size = args.min_kb * 1024
    while size <= args.max_mb * 1024 * 1024:
        numel = size // 4
        cpu = torch.ones(numel)
        tpu = torch.ones(numel).to("tpu")
        dist.all_reduce(tpu)  # the program exists (and its handshake is done) before it runs alone
        (t_tpu, f_tpu, c_tpu), (t_prog, _, c_prog), (t_gloo, f_gloo, c_gloo) = _timed_alternated(
            [lambda: dist.all_reduce(tpu), _program_alone(torch.ones(numel).to("tpu")), lambda: dist.all_reduce(cpu)],
            args.iters,
        )
        factor = 2 * (n - 1) / n
        rows.append((size, *(size * factor / t / 1e9 for t in (t_tpu, t_prog, t_gloo)), f_tpu, f_gloo,
                     c_tpu, c_prog, c_gloo))
        size *= 4
    return rows


def _ddp(args) -> tuple[float, float]:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    times = {}
    for device in ("tpu", "cpu"):
        torch.manual_seed(0)
        model = torch.nn.Sequential(
            torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024), torch.nn.ReLU(),
            torch.nn.Linear(1024, 256),
        ).to(device)
        model = DDP(model)
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        x, y = torch.randn(64, 256).to(device), torch.randn(64, 256).to(device)

        def step():
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
            float(next(model.parameters()).detach().sum())  # wait for the step

        times[device] = _timed(step, args.steps)
        dist.barrier()
    return times["tpu"], times["cpu"]


def worker(args) -> None:
    import resource

    import torch.distributed as dist

    dist.init_process_group("tpu_dist")
    rows = _bandwidth(args)
    ddp = _ddp(args) if args.steps > 0 else None
    if dist.get_rank() == 0:
        print(f"all_reduce bus bandwidth, {dist.get_world_size()} processes (GB/s, median of {args.iters}, alternated)")
        print(f"{'size':>8}  {'tpu_dist':>9}  {'program':>9}  {'gloo':>9}  {'ratio':>6}  {'program/gloo':>12}"
              f"  {'faults tpu_dist':>15}  {'faults gloo':>11}  {'CPU ms/call: tpu_dist':>21}  {'program':>7}  {'gloo':>6}")
        for size, bw_tpu, bw_prog, bw_gloo, f_tpu, f_gloo, c_tpu, c_prog, c_gloo in rows:
            label = f"{size // 1024} KB" if size < 1 << 20 else f"{size >> 20} MB"
            print(f"{label:>8}  {bw_tpu:9.3f}  {bw_prog:9.3f}  {bw_gloo:9.3f}  {bw_tpu / bw_gloo:5.2f}x  "
                  f"{bw_prog / bw_gloo:11.2f}x  {f_tpu:15.0f}  {f_gloo:11.0f}  {c_tpu * 1e3:21.3f}  "
                  f"{c_prog * 1e3:7.3f}  {c_gloo * 1e3:6.3f}")
        if ddp is not None:
            ddp_tpu, ddp_gloo = ddp
            print(f"DDP step (MLP 256-1024-1024-256, batch 64): tpu_dist {ddp_tpu * 1e3:.1f} ms, "
                  f"gloo on CPU {ddp_gloo * 1e3:.1f} ms ({ddp_gloo / ddp_tpu:.2f}x)")
        from torch_tpu.core import host_heap

        print(f"host heap reuse (TORCH_TPU_DIST_REUSE_HOST_MEMORY): {sorted(host_heap.applied()) or 'off'}; "
              f"rank 0 peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss >> 10} MB; "
              f"load {os.getloadavg()[0]:.1f}")
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--min-kb", type=int, default=1, help="smallest all_reduce (sizes grow 4x)")
    parser.add_argument("--max-mb", type=int, default=64)
    parser.add_argument("--steps", type=int, default=10, help="DDP steps timed (0: no DDP step)")
    args = parser.parse_args()
    if "RANK" in os.environ:
        worker(args)
        return
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_port=29733",
           os.path.abspath(__file__), *sys.argv[1:]]
    sys.exit(subprocess.call(cmd))


if __name__ == "__main__":
    main()
