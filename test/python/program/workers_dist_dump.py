"""A one-process tpu_dist job (run by test_program_dumps.py under torchrun with
TORCH_TPU_DUMP_DIR set): an eager collective (a `collective` program) and a compiled
graph with a collective on tpu tensors (a `dist_graph` program)."""

import datetime

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

import torch_tpu  # noqa: F401 - registers the tpu device and the tpu_dist backend

dist.init_process_group("tpu_dist", timeout=datetime.timedelta(seconds=60))
x = torch.arange(4.0, device="tpu")
dist.all_reduce(x)
assert x.cpu().tolist() == [0.0, 1.0, 2.0, 3.0]


def step(v):
    return funcol.all_reduce(v * 2 + 1, "sum", dist.group.WORLD).sin()


out = torch.compile(step, backend="tpu")(x)
torch.testing.assert_close(out.cpu(), (x.cpu() * 2 + 1).sin())
dist.destroy_process_group()
print("dist dump job OK", flush=True)
