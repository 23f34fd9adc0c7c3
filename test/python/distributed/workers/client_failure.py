"""A 2-process job whose rank argv[1] cannot start; how (argv[2]):
* "create" (default): the multi-process CPU client's creation raises on that rank only;
* "tensor_first": that rank makes a tpu tensor before init_process_group (so its runtime
  client exists already and cannot become part of the job);
* "interrupt": that rank gets Ctrl-C (SIGINT) while its client creation waits for the peer's.
Each rank prints what init_process_group raised and how long it took."""

import datetime
import os
import signal
import sys
import threading
import time

import torch
import torch.distributed as dist

from torch_tpu.runtime import _jaxlib

failing = int(sys.argv[1])
how = sys.argv[2] if len(sys.argv) > 2 else "create"
rank = int(os.environ["RANK"])
if rank == failing and how == "create":
    def _broken(*args):
        print(f"rank {rank}: its client fails at {time.time():.3f}", flush=True)
        raise RuntimeError("gloo cannot listen on this host (forced by the test)")

    _jaxlib.make_distributed_cpu_client = _broken
elif rank == failing and how == "tensor_first":
    torch.ones(1, device="tpu").cpu()
    print(f"rank {rank}: its client fails at {time.time():.3f}", flush=True)
elif how == "interrupt":
    real = _jaxlib.make_distributed_cpu_client

    def _slow_or_interrupted(*args):
        if rank == failing:
            def interrupt():
                time.sleep(1.0)
                print(f"rank {rank}: its client fails at {time.time():.3f}", flush=True)
                os.kill(os.getpid(), signal.SIGINT)

            threading.Thread(target=interrupt, daemon=True).start()
            return real(*args)
        # This rank's creation begins only 3 s in, so the interrupt comes while the failing
        # rank waits for it; it waits in C++ (as the creation's own exchange does), which
        # the job's failure ends -- a Python sleep would outlive the failing rank's exit.
        try:
            args[0].blocking_key_value_get("torch_tpu/start/outcome", 3000)
        except Exception:  # noqa: BLE001 - the 3 s are up, or the job was left
            pass
        return real(*args)

    _jaxlib.make_distributed_cpu_client = _slow_or_interrupted

started = time.monotonic()
try:
    dist.init_process_group("tpu_dist", timeout=datetime.timedelta(seconds=20))
except BaseException as err:  # noqa: BLE001 - KeyboardInterrupt too
    print(f"rank {rank}: raised at {time.time():.3f}, {time.monotonic() - started:.2f} s into init_process_group",
          flush=True)
    print(f"rank {rank}: {type(err).__name__}: {err}", flush=True)
    sys.exit(1)
print(f"rank {rank}: started", flush=True)
dist.destroy_process_group()
