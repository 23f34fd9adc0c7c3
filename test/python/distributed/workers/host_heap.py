"""A torchrun job for test_host_heap.py: 64 MB all_reduces on tpu tensors, each call's
minor page faults counted. Prints "rank R: applied=[...] faults=F pages=P OK".

XLA:CPU gives every call's all-reduce a new output buffer; with glibc's defaults each is
a fresh mmap (every page faulted in), with torch_tpu.core.host_heap's settings the
previous call's freed output."""

import resource

import torch
import torch.distributed as dist

from torch_tpu.core import host_heap

NUMEL = 16 << 20  # 64 MB of float32
CALLS = 6


def main():
    dist.init_process_group("tpu_dist")
    rank, n = dist.get_rank(), dist.get_world_size()
    x = torch.full((NUMEL,), float(rank + 1)).to("tpu")
    dist.all_reduce(x)  # compiles the program and does the handshake: not counted
    faults = []
    for _ in range(CALLS):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        dist.all_reduce(x)
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    # every rank started at rank + 1; each all_reduce multiplies the sum by n
    want = float(sum(range(1, n + 1)) * n ** CALLS)
    got = x.cpu()
    assert torch.all(got == want), (got[:4], want)
    print(f"rank {rank}: applied={sorted(host_heap.applied())} faults={min(faults)} "
          f"pages={NUMEL * 4 // resource.getpagesize()} OK", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
