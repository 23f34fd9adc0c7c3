"""The tpu device's random generator: one state per device, shared by eager random ops
and compiled graphs on tpu tensors.

The state is a (seed, offset) pair held on the host, like CUDA's Philox generator.
Every program that draws random numbers (an eager `randn`/`uniform_`/`bernoulli_`/
dropout, or a compiled graph with random ops) takes one 128-bit key, counter-based:
`key = mix(seed, offset)`, then the offset advances by one. The program's
`rng_bit_generator` expands the key on the device, so no random value is made on the
host, and two programs never share a key. The stream is the device's own: it differs
from CPU's for the same seed (docs/explanation/eager-device.md).

`torch.tpu.manual_seed`/`seed`/`initial_seed`/`get_rng_state`/`set_rng_state`
(module.py) read and write this state.
"""

from __future__ import annotations

import threading

import numpy as np
import torch

_MASK = (1 << 64) - 1
# CUDA's default seed (`default_rng_seed_val`): an unseeded process is still repeatable.
DEFAULT_SEED = 67280421310721


def _mix(x: int) -> int:
    """SplitMix64's finalizer: a bijection of 64-bit words that spreads every input bit."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


class DeviceGenerator:
    """The (seed, offset) state of one tpu device."""

    def __init__(self, seed: int = DEFAULT_SEED) -> None:
        self._lock = threading.Lock()
        self.manual_seed(seed)

    def manual_seed(self, seed: int) -> None:
        with self._lock:
            self.seed = int(seed) & _MASK
            self.offset = 0

    def next_key(self) -> np.ndarray:
        """The key of the next program (two uint64 words); advances the offset."""
        with self._lock:
            seed, offset = self.seed, self.offset
            self.offset = (offset + 1) & _MASK
        base = _mix(seed ^ _mix(offset))
        return np.array([_mix(base ^ 1), _mix(base ^ 2)], dtype=np.uint64)

    def get_state(self) -> torch.Tensor:
        """16 bytes, seed then offset (little-endian uint64), as a uint8 CPU tensor (the
        shape CUDA's `get_rng_state` returns)."""
        with self._lock:
            words = np.array([self.seed, self.offset], dtype="<u8")
        return torch.from_numpy(words.view(np.uint8).copy())

    def set_state(self, state: torch.Tensor) -> None:
        if not isinstance(state, torch.Tensor) or state.dtype != torch.uint8 or state.numel() != 16:
            raise RuntimeError(
                "torch.tpu.set_rng_state: expected the 16-byte uint8 tensor torch.tpu.get_rng_state() "
                f"returns, got {state.dtype if isinstance(state, torch.Tensor) else type(state).__name__}"
                f"{' of ' + str(state.numel()) + ' elements' if isinstance(state, torch.Tensor) else ''}"
            )
        seed, offset = (int(w) for w in state.detach().cpu().contiguous().numpy().view("<u8"))
        with self._lock:
            self.seed, self.offset = seed, offset


_generators: dict[int, DeviceGenerator] = {}
_lock = threading.Lock()


def generator(index: int) -> DeviceGenerator:
    found = _generators.get(index)
    if found is None:
        with _lock:
            found = _generators.setdefault(index, DeviceGenerator())
    return found


def key_tensor(index: int) -> torch.Tensor:
    """The next key of device `index` as a `uint64[2]` CPU tensor (a program argument)."""
    return torch.from_numpy(generator(index).next_key())


def key_buffer(index: int):
    """The next key of device `index` as a DeviceBuffer on that device."""
    from ._storage import client

    return client().to_device(generator(index).next_key(), index, copy=True)
