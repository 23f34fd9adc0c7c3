"""FSDP2 `fully_shard` of a tiny GPT on tpu tensors for 5 steps equals single-process
training on the full batch, computed on CPU in the same process (run by job.py)."""

import copy

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard

from torch_tpu.examples.quickstart import TinyGPT


def check_fsdp():
    r, n = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    reference = TinyGPT(vocab=64, d=32, heads=2, layers=2, seq=8)
    model = copy.deepcopy(reference).to("tpu")
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("tpu", (n,))
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(2)
    for _ in range(5):
        ids = torch.randint(0, 64, (2 * n, 8), generator=gen)
        target = torch.randint(0, 64, (2 * n, 8), generator=gen)
        ref_opt.zero_grad()
        torch.nn.functional.cross_entropy(reference(ids).flatten(0, 1), target.flatten()).backward()
        ref_opt.step()
        opt.zero_grad()
        mine = slice(2 * r, 2 * r + 2)
        logits = model(ids[mine].to("tpu"))
        torch.nn.functional.cross_entropy(logits.flatten(0, 1), target[mine].flatten().to("tpu")).backward()
        opt.step()
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        full = p.full_tensor().detach().cpu()
        if not torch.allclose(full, q.detach(), rtol=1e-4, atol=1e-5):
            raise AssertionError(f"FSDP {name}: max diff {(full - q).abs().max()}")
    print(f"rank {r}: FSDP OK", flush=True)
