"""A 2-process job whose rank argv[1] cannot create its PjRT client (the test makes the
multi-process CPU client's creation raise on that rank only); each rank prints what
init_process_group raised and how long it took."""

import datetime
import os
import sys
import time

import torch  # noqa: F401 - registers tpu_dist
import torch.distributed as dist

from torch_tpu.runtime import _jaxlib

failing = int(sys.argv[1])
rank = int(os.environ["RANK"])
if rank == failing:
    def _broken(*args):
        print(f"rank {rank}: its client fails at {time.time():.3f}", flush=True)
        raise RuntimeError("gloo cannot listen on this host (forced by the test)")

    _jaxlib.make_distributed_cpu_client = _broken

started = time.monotonic()
try:
    dist.init_process_group("tpu_dist", timeout=datetime.timedelta(seconds=20))
except Exception as err:  # noqa: BLE001
    print(f"rank {rank}: raised at {time.time():.3f}, {time.monotonic() - started:.2f} s into init_process_group",
          flush=True)
    print(f"rank {rank}: {type(err).__name__}: {err}", flush=True)
    sys.exit(1)
print(f"rank {rank}: started", flush=True)
dist.destroy_process_group()
