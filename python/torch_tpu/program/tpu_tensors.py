"""How the execution layer reaches eager tpu tensors without importing the device.

A compiled graph may take and return tpu tensors (`torch.compile` on tpu tensors): its
invoker then passes their device buffers and wraps its results as tpu tensors. The
device (`torch_tpu.device`) owns what a tpu tensor is, so it installs the adapter below
when it registers (`device/_registration.py`); until then no tpu tensor can exist and
`NO_DEVICE` answers.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

import torch


class TpuTensors(Protocol):
    """What the invoker asks of the device about tpu tensors."""

    def device_of(self, args: Sequence[Any]) -> int | None:
        """The tpu device index of the tpu tensors among `args`; None when there are none
        (raises for tensors on two devices)."""
        ...

    def argument(self, tensor: torch.Tensor, shared: bool) -> Any:
        """The DeviceBuffer of `tensor`'s value with its shape; `shared`: not donated."""
        ...

    def result(self, buffer: Any, index: int) -> torch.Tensor:
        """A new tpu tensor on device `index` holding a program result `buffer`."""
        ...

    def rng_key(self, index: int) -> torch.Tensor:
        """The next key of device `index`'s generator (a program's RNG argument)."""
        ...

    def graph_caller(self, args: Sequence[tuple[tuple[int, ...], torch.dtype, Any]],
                     results: Sequence[tuple[tuple[int, ...], torch.dtype]], device: Any, index: int,
                     launch: Callable[[list], list], host: frozenset[int], writes: dict[int, int],
                     donated: tuple[int, ...] = (), fusable: tuple | None = None, rng: bool = False
                     ) -> Callable[[Sequence[Any]], list | None]:
        """`call(tensors)`: a program's call on tpu tensors in one step -- each tensor's
        buffer (`argument(t, shared=True)` with the program's argument checks, for the
        parameter specs `args`), `launch(buffers)`, `result` for each result (`results`:
        shapes and dtypes; CPU tensors at `host`) -- or None where a tensor needs the
        per-argument path. A result in `writes` (result -> input position) may be written
        into that input already and stand as the input itself. `donated`: the positions
        the program consumes; each gets the input's own buffer only where the call writes
        that input itself and nothing else holds the buffer, else a copy. `fusable`:
        (executable, module, fingerprint, starts a training step) of the program, for a
        device that records calls instead of running them (FUSED mode, or a compiled
        training step deferred in Strict mode) and stitches the module into its program.
        `rng`: the program takes the device generator's next key as its last argument
        (`rng_key`)."""
        ...


class _NoDevice:
    """Before the device registers: no argument is a tpu tensor."""

    def device_of(self, args: Sequence[Any]) -> int | None:
        return None

    def argument(self, tensor: torch.Tensor, shared: bool) -> Any:
        raise RuntimeError("torch_tpu: a tpu tensor reached a compiled program before the tpu device registered "
                           "(import torch_tpu.device)")

    def result(self, buffer: Any, index: int) -> torch.Tensor:
        return self.argument(buffer, False)

    def rng_key(self, index: int) -> torch.Tensor:
        return self.argument(torch.empty(0), False)

    def graph_caller(self, args, results, device, index, launch, host, writes, donated=(), fusable=None, rng=False):
        return lambda tensors: self.argument(tensors, True)


NO_DEVICE: TpuTensors = _NoDevice()
_installed: list[TpuTensors] = [NO_DEVICE]


def install(adapter: TpuTensors) -> None:
    """Called by the device when it registers."""
    _installed[0] = adapter


def tpu_tensors() -> TpuTensors:
    return _installed[0]
