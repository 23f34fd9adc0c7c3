"""A process group destroyed and made again under the same name: init_process_group after
destroy_process_group (PyTorch restarts its group names at 0, so the world group and the
first new_group get their old names back). The new groups' first collectives differ from
the old ones' (8 elements instead of 4), and rank 1 comes late, so rank 0 would meet rank
1's record of the old group's collective #1 if the handshake keys were the same."""

import datetime
import os
import time

import torch
import torch.distributed as dist

rank = int(os.environ["RANK"])
timeout = datetime.timedelta(seconds=10)

dist.init_process_group("tpu_dist", timeout=timeout)
pair = dist.new_group([0, 1])
x = torch.ones(4, device="tpu")
dist.all_reduce(x)
dist.all_reduce(x, group=pair)
print(f"rank {rank}: first {x.cpu().tolist()}", flush=True)
dist.destroy_process_group()

dist.init_process_group("tpu_dist", timeout=timeout)
pair = dist.new_group([0, 1])
if rank == 1:
    time.sleep(2)
y = torch.full((8,), float(rank + 1), device="tpu")
dist.all_reduce(y)
dist.all_reduce(y, group=pair)
print(f"rank {rank}: again {y.cpu().tolist()}", flush=True)
dist.destroy_process_group()
