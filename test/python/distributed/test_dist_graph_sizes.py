"""A bounded compiled graph in a `tpu_dist` job (single process): its exchanged run-time
sizes are read from the device only when a handshake may compare them
(`DistributedGraphProgram._sizes`), they are part of what the handshake compares
(`_process_group._with_sizes`), and its collective stages run on the default group's
`tpu_dist` backend (`world_group`)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from torch_tpu.backend._dist_graph import DistributedGraphProgram, world_group
from torch_tpu.distributed import _process_group
from torch_tpu.runtime import DeviceBuffer
from torch_tpu.runtime.distributed import fingerprint_of


class _SizeOnDevice(DeviceBuffer):
    """A DeviceBuffer holding one size; counts the reads (each one waits for the device)."""

    __slots__ = ("value", "reads")

    def __init__(self, value: int) -> None:  # no device array: only `to_numpy` is called
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


class _Labelled:
    """A program as the handshake sees it (`HandshakeSubject`); slots, so nothing can be
    attached to it from outside."""

    __slots__ = ("description", "fingerprint")

    def __init__(self, description: str, fingerprint: str) -> None:
        self.description, self.fingerprint = description, fingerprint


def test_the_handshake_compares_a_bounded_program_at_its_sizes():
    program = _Labelled("stage 1 of f over ranks [0, 1]", "0123456789abcdef")
    sized = _process_group._with_sizes(program, "s0=3")
    assert sized.description == "stage 1 of f over ranks [0, 1] at sizes s0=3"
    assert sized.fingerprint == fingerprint_of(program.fingerprint, sized.description)
    assert _process_group._with_sizes(program, "s0=3") is sized  # made once per sizes
    assert _process_group._with_sizes(program, "s0=4").fingerprint != sized.fingerprint
    assert (program.description, program.fingerprint) == ("stage 1 of f over ranks [0, 1]", "0123456789abcdef")


def test_collective_stages_need_the_tpu_dist_backend(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        with pytest.raises(RuntimeError, match=r"backend for tpu is none: initialize the job with "
                                               r"dist\.init_process_group\('tpu_dist'\)"):
            world_group()
    finally:
        dist.destroy_process_group()
    assert torch.distributed.is_initialized() is False
