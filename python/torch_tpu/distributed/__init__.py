"""`tpu_dist`: torch.distributed on tpu tensors.

    torchrun --nproc_per_node=2 train.py
    # train.py
    import torch
import torch.distributed as dist
    dist.init_process_group("tpu_dist")        # registered on `import torch` (autoload)
    x = torch.ones(4, device="tpu")            # this process's own device
    dist.all_reduce(x)

Each process's device is its own `tpu:0`; rank 0 serves PjRT's coordination service at
MASTER_ADDR:MASTER_PORT+1. See docs/explanation/distributed.md.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from torch_tpu.core import host_heap

from ._launch import COORDINATOR_PORT_OFFSET, LaunchError
from ._process_group import ProcessGroupTPU, TPUWork, create_backend

# Before any thread starts (this module loads at the end of `import torch`): on XLA:CPU,
# the collectives' output buffers then come from the one heap that can reuse them.
# Not in a CUDA/ROCm build of PyTorch: its torchrun jobs are another backend's.
host_heap.share_main_arena(accelerator_build=bool(torch.version.cuda or getattr(torch.version, "hip", None)))

BACKEND = "tpu_dist"


def register() -> None:
    """Registers the `tpu_dist` backend for tpu tensors (idempotent)."""
    if BACKEND.upper() in dist.Backend._plugins:
        return
    dist.Backend.register_backend(BACKEND, create_backend, extended_api=True, devices=["tpu"])
    # c10d calls the process group's methods: their frames are no user code for Dynamo.
    from torch_tpu.device._dynamo_skip import keep_dynamo_out
    keep_dynamo_out()


if dist.is_available():
    register()

__all__ = ["BACKEND", "COORDINATOR_PORT_OFFSET", "LaunchError", "ProcessGroupTPU", "TPUWork", "register"]
