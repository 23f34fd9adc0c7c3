"""Ranks that pair different collectives, or wait on one their peers never run
(issue 30). argv[1], the scenario; every rank prints what it raised (or its result):

* extra: rank 0 runs one all_reduce more than rank 1, from its own line; the next
  all_reduce (same shape) would pair with it: both ranks must raise naming both lines.
* ops: on one line, rank 0 runs all_reduce and rank 1 reduce (the same program): both
  must raise naming both calls.
* stuck <rank>: <rank> runs one all_reduce more through a helper (the same line as its
  others: no handshake tells it apart); the other rank finishes and leaves. <rank> must
  raise a Python error naming the collective, the group, its line and where the peer
  left -- never jaxlib's abort (rank 0 serves the coordination service).
"""

import datetime
import os
import sys
import time

import torch
import torch.distributed as dist

scenario = sys.argv[1]
dist.init_process_group("tpu_dist", timeout=datetime.timedelta(seconds=8))
rank = dist.get_rank()


def sync(t):
    dist.all_reduce(t)  # the helper's line


def run():
    t = torch.ones(4, device="tpu")
    dist.all_reduce(t)
    if scenario == "extra":
        if rank == 0:
            dist.all_reduce(t)  # extra line
        dist.all_reduce(t)  # common line
    elif scenario == "ops":
        dist.all_reduce(t) if rank == 0 else dist.reduce(t, dst=0)  # ops line
    elif scenario == "stuck":
        if rank == int(sys.argv[2]):
            sync(t)
        sync(t)
    return t.cpu().tolist()


started = time.monotonic()
try:
    result = run()
except Exception as err:  # noqa: BLE001 - what the test checks
    print(f"rank {rank}: raised after {time.monotonic() - started:.1f} s: {type(err).__name__}: {err}", flush=True)
    sys.exit(1)
print(f"rank {rank}: finished with {result}", flush=True)
