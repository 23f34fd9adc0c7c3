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


def check_sync_batch_norm():
    """DDP with nn.SyncBatchNorm on tpu tensors (its statistics kernels are CUDA-only in
    PyTorch; the device decomposes them) for 3 steps: every rank's parameters and running
    statistics equal single-process training with BatchNorm on the full batch, computed on
    CPU here, with unequal batches per rank (the counts weigh each rank's statistics)."""
    r, n = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    reference = torch.nn.Sequential(torch.nn.Conv1d(3, 4, 3), torch.nn.BatchNorm1d(4), torch.nn.ReLU(),
                                    torch.nn.Flatten(), torch.nn.Linear(4 * 6, 2))
    model = DDP(torch.nn.SyncBatchNorm.convert_sync_batchnorm(copy.deepcopy(reference)).to("tpu"))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    sizes = [2 + k for k in range(n)]  # rank k holds 2 + k samples
    start = sum(sizes[:r])
    gen = torch.Generator().manual_seed(1)
    for _ in range(3):
        x = torch.randn(sum(sizes), 3, 8, generator=gen)
        y = torch.randn(sum(sizes), 2, generator=gen)
        ref_opt.zero_grad()
        torch.nn.functional.mse_loss(reference(x), y, reduction="sum").backward()
        ref_opt.step()
        opt.zero_grad()
        mine = slice(start, start + sizes[r])
        # summed over the batch: DDP averages the ranks' gradients, so scale by n
        loss = torch.nn.functional.mse_loss(model(x[mine].to("tpu")), y[mine].to("tpu"), reduction="sum") * n
        loss.backward()
        opt.step()
    got_state = {k: v.cpu() for k, v in model.module.state_dict().items()}
    for name, want in reference.state_dict().items():
        if not torch.allclose(got_state[name].to(want.dtype), want, rtol=1e-4, atol=1e-5):
            raise AssertionError(f"{name}: max diff {(got_state[name].to(want.dtype) - want).abs().max()}")
    print(f"rank {r}: SyncBatchNorm OK", flush=True)
