"""Helpers of the SPMD tests: a fake torch.distributed world of N ranks (no devices: it
only names groups, as it does when PyTorch traces a distributed program) and tracing."""

from __future__ import annotations

import contextlib
import gc

import torch.distributed as dist
from torch.fx.experimental.proxy_tensor import make_fx
from torch.testing._internal.distributed.fake_pg import FakeStore
from torch_tpu.compiler.importer.fx_importer import import_graph
from torch_tpu.spmd import process_groups_of


@contextlib.contextmanager
def fake_world(world_size: int):
    """torch.distributed initialised as rank 0 of `world_size` ranks on the fake backend."""
    if dist.is_initialized():
        dist.destroy_process_group()
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world_size)
    try:
        yield
    finally:
        dist.destroy_process_group()
        gc.collect()  # meshes of this world must not be found by the next one


def trace(fn, *examples):
    """The StableHLO + torchtpu module of `fn` traced at rank 0 (make_fx)."""
    gm = make_fx(fn)(*examples)
    return import_graph(gm, process_groups=process_groups_of(gm)).module
