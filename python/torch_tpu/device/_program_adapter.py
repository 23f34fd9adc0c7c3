"""The device's side of `torch_tpu.program.tpu_tensors`: tpu tensors in and out of
compiled programs (`_graph_io.py`) and the device generator's keys (`_random.py`),
installed when the device registers, so the execution layer never imports the device."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from . import _graph_io, _random


class DeviceTpuTensors:
    """`program.tpu_tensors.TpuTensors` for this device."""

    def device_of(self, args: Sequence[Any]) -> int | None:
        return _graph_io.device_of(args)

    def argument(self, tensor: torch.Tensor, shared: bool) -> Any:
        return _graph_io.argument(tensor, shared=shared)

    def result(self, buffer: Any, index: int) -> torch.Tensor:
        return _graph_io.result(buffer, index)

    def rng_key(self, index: int) -> torch.Tensor:
        return _random.key_tensor(index)

    def graph_caller(self, args, results, device, index, launch, host, writes, donated=(), fusable=None, rng=False):
        return _graph_io.graph_caller(args, results, device, index, launch, host, writes, donated, fusable, rng)


def install() -> None:
    from torch_tpu.program.tpu_tensors import install as install_adapter

    install_adapter(DeviceTpuTensors())
