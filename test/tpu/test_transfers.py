"""Host <-> device transfers on the chip: every dtype both ways, through eager copies,
`.item()`, printing, non_blocking copies and compiled calls on host tensors; a dtype the chip
lacks is an error naming it, never a crash."""

from __future__ import annotations

import pytest
import torch

from torch_tpu.runtime.errors import UnsupportedDtypeError

DTYPES = [
    torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.uint16, torch.uint32,
    torch.uint64, torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.complex64,
    torch.float8_e4m3fn, torch.float8_e5m2,
]


def _sample(dtype: torch.dtype, n: int = 1000) -> torch.Tensor:
    g = torch.Generator().manual_seed(n)
    if dtype is torch.bool:
        return torch.rand(n, generator=g) > 0.5
    if dtype.is_complex:
        return torch.complex(torch.randn(n, generator=g), torch.randn(n, generator=g)).to(dtype)
    if dtype.is_floating_point:
        return (torch.randn(n, generator=g) * 4).to(dtype)
    info = torch.iinfo(dtype)
    low, high = max(info.min, -(2**31)), min(info.max, 2**31 - 1)
    return torch.randint(low, high, (n,), generator=g, dtype=torch.int64).to(dtype)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_round_trip_is_bit_exact(chip, dtype):
    src = _sample(dtype)
    on = src.to("tpu")
    assert on.device.type == "tpu" and on.dtype == dtype
    assert torch.equal(_bits(on.cpu()), _bits(src))
    # A view's value, a scalar read, and a device-side op on the dtype.
    assert torch.equal(_bits(on[3:9].cpu()), _bits(src[3:9]))
    assert _bits(on[5:6].cpu()).tolist() == _bits(src[5:6]).tolist()
    if dtype not in (torch.float8_e4m3fn, torch.float8_e5m2):
        assert on[7].item() == src[7].item()
        flipped = torch.flip(on, [0]).cpu()
        reversed_bytes = _bits(src).reshape(src.numel(), -1).flip(0).reshape(-1)  # CPU lacks flip for some dtypes
        assert torch.equal(_bits(flipped), reversed_bytes)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_non_blocking_copies_land_at_synchronize(chip, dtype):
    src = _sample(dtype, 4096)
    on = src.to("tpu", non_blocking=True)
    back = on.to("cpu", non_blocking=True)
    torch.tpu.synchronize()
    assert torch.equal(_bits(back), _bits(src))
    into = torch.empty_like(src)
    into.copy_(on, non_blocking=True)
    torch.tpu.synchronize()
    assert torch.equal(_bits(into), _bits(src))


@pytest.mark.parametrize("megabytes", [4, 72], ids=["staged", "read in place"])
def test_host_value_changed_after_upload_does_not_reach_the_device(chip, megabytes):
    """Up to 64 MB an upload is staged during the call; above, the transfer reads the
    tensor itself and `.to()` returns once it is done: either way the host tensor is free."""
    n = megabytes << 18
    src = torch.arange(n, dtype=torch.int32)  # (exact: float32 is not, past 2**24)
    on = src.to("tpu")
    src.zero_()  # .to() returned: the transfer has read the tensor already
    assert on[-1].item() == n - 1
    assert on[n // 2].item() == n // 2


def test_large_transfer_and_printing(chip):
    src = torch.randn(64 << 20 >> 2)  # 64 MB
    on = src.to("tpu")
    assert torch.equal(on.cpu(), src)
    assert "device='tpu:0'" in repr(torch.ones(3, device="tpu") * 2)


def test_cpu_result_is_the_callers_own_memory(chip):
    on = torch.arange(8.0).to("tpu")
    first = on.cpu()
    first += 100
    assert on.cpu().tolist() == list(range(8))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int32, torch.bool], ids=str)
def test_compiled_call_on_host_tensors(chip, dtype):
    def f(a, b):
        return (a + b) if dtype is not torch.bool else (a ^ b), a.sum()

    a, b = _sample(dtype), _sample(dtype, 999 + 1)
    got = torch.compile(f, backend="tpu")(a, b)
    want = f(a, b)
    for g, w in zip(got, want):
        assert g.device.type == "cpu"
        # Integers and bools exactly; floats at assert_close's dtype tolerances (a sum's
        # order differs from CPU's).
        torch.testing.assert_close(g, w)


def test_complex128_is_an_error_not_a_crash(chip, platform):
    from tpu_support import tpu_only

    tpu_only(platform, "complex128 exists on XLA:CPU")
    with pytest.raises(UnsupportedDtypeError, match="tpu platform has no complex128"):
        torch.ones(3, dtype=torch.complex128).to("tpu")
    with pytest.raises(UnsupportedDtypeError, match="complex128"):
        torch.ones(3, device="tpu").to(torch.complex128)
    assert (torch.ones(2, device="tpu") + 1).cpu().tolist() == [2.0, 2.0]  # the process goes on
