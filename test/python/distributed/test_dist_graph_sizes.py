"""`DistributedGraphProgram._sizes`: a bounded compiled graph's exchanged run-time sizes
are read from the device only when a handshake may compare them (single process)."""

from __future__ import annotations

import pytest

from torch_tpu.backend._dist_graph import DistributedGraphProgram


class _SizeOnDevice:
    """A DeviceBuffer holding one size; counts the reads (each one waits for the device)."""

    def __init__(self, value: int) -> None:
        self.value = value
        self.reads = 0

    def to_numpy(self) -> int:
        self.reads += 1
        return self.value


def _program() -> DistributedGraphProgram:
    # the program's trailing arguments are its sizes: s1 last, s0 before it
    return DistributedGraphProgram(None, [], (), "", True, exchanged_sizes=((2, "s0"), (1, "s1")))


@pytest.mark.parametrize("stage", ["first_call", "every_call"])
def test_the_exchanged_sizes_are_read_when_a_handshake_may_run(monkeypatch, stage):
    monkeypatch.setenv("TORCH_TPU_SPMD_HANDSHAKE_STAGE", stage)
    s0, s1 = _SizeOnDevice(3), _SizeOnDevice(7)
    assert _program()._sizes(["x", s0, s1]) == "s0=3, s1=7"
    assert (s0.reads, s1.reads) == (1, 1)


def test_the_exchanged_sizes_are_not_read_without_a_handshake(monkeypatch):
    monkeypatch.setenv("TORCH_TPU_SPMD_HANDSHAKE_STAGE", "off")
    s0, s1 = _SizeOnDevice(3), _SizeOnDevice(7)
    assert _program()._sizes(["x", s0, s1]) == ""
    assert (s0.reads, s1.reads) == (0, 0)
