"""DDP (no device_ids) on tpu tensors for 5 steps, eager or with the forward compiled by
torch.compile(backend="tpu"), equals single-process training on the full batch, computed
on CPU in the same process (run by job.py)."""

import copy

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def make_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))


def check_ddp(compiled=False):
    """compiled: the DDP model's forward under torch.compile(backend="tpu")."""
    r, n = dist.get_rank(), dist.get_world_size()
    reference = make_model()
    model = DDP(copy.deepcopy(reference).to("tpu"))
    run = torch.compile(model, backend="tpu") if compiled else model
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(1)
    for step in range(5):
        x = torch.randn(4 * n, 8, generator=gen)
        y = torch.randn(4 * n, 4, generator=gen)
        # single process, full batch
        ref_opt.zero_grad()
        torch.nn.functional.mse_loss(reference(x), y).backward()
        ref_opt.step()
        # this rank's quarter of the batch, gradients averaged by DDP
        opt.zero_grad()
        mine = slice(4 * r, 4 * r + 4)
        loss = torch.nn.functional.mse_loss(run(x[mine].to("tpu")), y[mine].to("tpu"))
        loss.backward()
        opt.step()
    for (name, p), q in zip(model.module.named_parameters(), reference.parameters()):
        got = p.detach().cpu()
        if not torch.allclose(got, q.detach(), rtol=1e-5, atol=1e-6):
            raise AssertionError(f"{name}: max diff {(got - q).abs().max()}")
    print(f"rank {r}: {'compiled ' if compiled else ''}DDP OK", flush=True)
