"""A torchrun job for test_host_heap.py: 64 MB all_reduces on tpu tensors, each call's
minor page faults counted. Prints "rank R: applied=[...] faults=F pages=P OK", F the
median over the calls after a warm-up.

XLA:CPU gives every call's all-reduce a new output buffer; with glibc's defaults each is
a fresh mmap (every page faulted in), with torch_tpu.core.host_heap's settings a
freed earlier output once the heap has grown to hold the buffers in flight."""

import resource

import torch
import torch.distributed as dist

from torch_tpu.core import host_heap

NUMEL = 16 << 20  # 64 MB of float32
# The first calls of a size grow the heap: its free space is in pieces at first (measured
# in a fresh process: 186 MB free, yet calls 0-4 each extended it by 64 MB; none after).
WARMUP = 6
CALLS = 8


def main():
    dist.init_process_group("tpu_dist")
    rank, n = dist.get_rank(), dist.get_world_size()
    x = torch.full((NUMEL,), float(rank + 1)).to("tpu")
    for _ in range(WARMUP):  # the first compiles the program and does the handshake
        dist.all_reduce(x)
        torch.tpu.synchronize()
    faults = []
    for _ in range(CALLS):
        # Each call starts with the earlier outputs freed: on a loaded machine (a CI run) an
        # output still being released when the next call allocates is a fresh 64 MB, which
        # says nothing of whether freed memory is reused.
        torch.tpu.synchronize()
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        dist.all_reduce(x)
        torch.tpu.synchronize()
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    # every rank started at rank + 1; each all_reduce multiplies the sum by n
    want = float(sum(range(1, n + 1)) * n ** (WARMUP - 1 + CALLS))
    got = x.cpu()
    assert torch.all(got == want), (got[:4], want)
    print(f"rank {rank}: applied={sorted(host_heap.applied())} faults={sorted(faults)[CALLS // 2]} "
          f"pages={NUMEL * 4 // resource.getpagesize()} OK", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
