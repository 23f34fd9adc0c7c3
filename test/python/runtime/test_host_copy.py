"""Device -> host by PjRT's host copy: the path TPU and GPU buffers take (they cannot be
exported by DLPack). XLA:CPU runs the same jaxlib entry points, so every dtype's trip through
them is checked here without a TPU; test/tpu/ checks them on the chip."""

from __future__ import annotations

import pytest
import torch

from torch_tpu.runtime import get_client
from torch_tpu.runtime import dtypes as rt_dtypes
from torch_tpu.runtime.buffer import host_tensor
from torch_tpu.runtime.executable import _host_outputs

DTYPES = [
    torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.uint16, torch.uint32,
    torch.uint64, torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.complex64,
    torch.complex128, torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz,
    torch.float8_e8m0fnu,
]


def _sample(dtype: torch.dtype) -> torch.Tensor:
    if dtype is torch.bool:
        return torch.tensor([[True, False, True], [False, False, True]])
    if dtype.is_complex:
        return torch.complex(torch.arange(6.0), -torch.arange(6.0)).reshape(2, 3).to(dtype)
    if dtype is torch.float8_e8m0fnu:  # powers of two only
        return torch.tensor([[0.25, 1.0, 2.0], [4.0, 8.0, 0.5]]).to(dtype)
    return torch.arange(6).reshape(2, 3).to(dtype)


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    # Bitwise: a copy must give back exactly what went in (float8 / bool have no torch.equal
    # on every build, their bytes do).
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(
        a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_host_copy_round_trips_every_dtype(dtype):
    src = _sample(dtype)
    buffer = get_client().to_device(src, 0, copy=True)
    assert _same(host_tensor(buffer._array, buffer._row), src)
    assert _same(buffer.copy_to_host(), src)


def test_copy_to_host_is_memory_of_its_own():
    src = torch.arange(8, dtype=torch.float32)
    buffer = get_client().to_device(src, 0, copy=True)
    first = buffer.copy_to_host()
    first += 100  # the caller owns it: the buffer and later reads are unaffected
    assert torch.equal(buffer.copy_to_host(), src)
    assert torch.equal(buffer.to_torch(), src)


def test_program_outputs_by_host_copy_match_dlpack():
    client = get_client()
    rows = [rt_dtypes.from_torch(torch.float32), rt_dtypes.from_torch(torch.bfloat16), rt_dtypes.from_torch(torch.bool)]
    values = [torch.randn(3, 4), torch.randn(5).to(torch.bfloat16), torch.tensor([True, False])]
    arrays = [client.to_device(v, 0, copy=True)._array for v in values]
    by_copy = _host_outputs(False, rows)(arrays)
    by_dlpack = _host_outputs(True, rows)(arrays)
    for got, via, want in zip(by_copy, by_dlpack, values):
        assert _same(got, want) and _same(via, want)


def test_start_host_copy_then_read():
    src = torch.randn(16)
    buffer = get_client().to_device(src, 0, copy=True)
    assert buffer.start_host_copy() is buffer
    assert torch.equal(buffer.to_torch(), src)
