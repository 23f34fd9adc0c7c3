"""Tensor parallelism (ColwiseParallel / RowwiseParallel, DTensor over a "tpu" DeviceMesh)
of an MLP on tpu tensors: 5 SGD steps equal single-process training on CPU (run by job.py)."""

import copy

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module


def check_tp():
    r, n = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    reference = torch.nn.Sequential(torch.nn.Linear(8, 4 * n), torch.nn.ReLU(), torch.nn.Linear(4 * n, 8))
    model = copy.deepcopy(reference).to("tpu")
    mesh = init_device_mesh("tpu", (n,))
    parallelize_module(model, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(3)
    for _ in range(5):
        x, y = torch.randn(6, 8, generator=gen), torch.randn(6, 8, generator=gen)  # same batch on every rank
        ref_opt.zero_grad()
        torch.nn.functional.mse_loss(reference(x), y).backward()
        ref_opt.step()
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x.to("tpu")), y.to("tpu")).backward()
        opt.step()
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        full = p.full_tensor().detach().cpu()
        if not torch.allclose(full, q.detach(), rtol=1e-5, atol=1e-6):
            raise AssertionError(f"TP {name}: max diff {(full - q).abs().max()}")
    print(f"rank {r}: TP OK", flush=True)
