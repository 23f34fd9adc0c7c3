"""Strided windows of a storage on the eager tpu device: every operand is read out of its
flat storage buffer, and every in-place result written back into it, by the builders of
compiler/lowering/storage_layout.py (the `as_strided` lowerings use the same ones:
test/python/lowering/test_storage_layout.py). Each case runs on the device
(TORCH_TPU_STRICT=1 forbids the CPU fallback) and is compared with CPU eager, exactly."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from storage_windows import DISJOINT, WINDOWS, WRITABLE

import torch_tpu.device  # noqa: F401 - registers the device where autoload is off


@pytest.fixture(autouse=True)
def strict(monkeypatch):
    monkeypatch.setenv("TORCH_TPU_STRICT", "1")


def _pair(dtype=torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    base = (torch.arange(24) - 7).reshape(4, 6).to(dtype)
    return base.clone(), base.clone().to("tpu")


def _source(size, dtype=torch.float32) -> torch.Tensor:
    return (torch.arange(1, 1 + int(np.prod(size, dtype=np.int64))) * 10).reshape(size).to(dtype)


def _same(tpu: torch.Tensor, cpu: torch.Tensor) -> None:
    assert tpu.device.type == "tpu"
    torch.testing.assert_close(tpu.cpu(), cpu, rtol=0, atol=0)


@pytest.mark.parametrize("window", sorted(WINDOWS))
def test_an_op_reads_a_window_of_its_storage(window):
    size, stride, offset = WINDOWS[window]
    cpu, tpu = _pair()
    read = lambda x: x.as_strided(size, stride, offset) * 2  # noqa: E731
    _same(read(tpu), read(cpu))
    # A window of a transposed view addresses the same storage.
    _same(read(tpu.t()), read(cpu.t()))


@pytest.mark.parametrize("window", DISJOINT)
def test_an_in_place_op_writes_a_window_of_its_storage(window):
    size, stride, offset = WINDOWS[window]
    cpu, tpu = _pair()
    for x in (cpu, tpu):
        x.as_strided(size, stride, offset).mul_(-3).add_(1)
    _same(tpu, cpu)


@pytest.mark.parametrize("window", DISJOINT)
def test_copy_into_a_window_converts_and_broadcasts(window):
    size, stride, offset = WINDOWS[window]
    cpu, tpu = _pair()
    row = _source(size[-1:], torch.int64) if size else torch.tensor(5)
    cpu.as_strided(size, stride, offset).copy_(row)
    tpu.as_strided(size, stride, offset).copy_(row.to("tpu"))
    _same(tpu, cpu)


@pytest.mark.parametrize("window", WRITABLE)
def test_as_strided_scatter_runs_on_the_device(window):
    size, stride, offset = WINDOWS[window]
    cpu, tpu = _pair()
    src = _source(size)
    expected = torch.as_strided_scatter(cpu, src, size, stride, offset)
    _same(torch.as_strided_scatter(tpu, src.to("tpu"), size, stride, offset), expected)
    expected = torch.as_strided_scatter(cpu.t(), src, size, stride, offset)
    _same(torch.as_strided_scatter(tpu.t(), src.to("tpu"), size, stride, offset), expected)


@pytest.mark.parametrize("window", ["odd_strides", "transposed_dense_at_an_offset", "zero_d"])
@pytest.mark.parametrize("view_dtype", [torch.int16, torch.uint8, torch.bool], ids=str)
def test_windows_of_a_dtype_view(window, view_dtype):
    """A window of a narrower dtype view of a float32 storage: read through the
    reinterpretation, and written back as bytes."""
    size, stride, offset = WINDOWS[window]
    dtype = torch.uint8 if view_dtype is torch.bool else torch.float32
    cpu, tpu = _pair(dtype)
    if view_dtype is torch.bool:
        cpu, tpu = cpu % 2, tpu % 2  # bytes a bool may hold
    read = lambda x: x.view(view_dtype).as_strided(size, stride, offset).clone()  # noqa: E731
    _same(read(tpu), read(cpu))
    for x in (cpu, tpu):
        window_of = x.view(view_dtype).as_strided(size, stride, offset)
        window_of.logical_not_() if view_dtype is torch.bool else window_of.add_(3)
    _same(tpu, cpu)
