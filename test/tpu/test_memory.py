"""torch.tpu's memory figures come from PjRT's allocator on the chip, and running out of device
memory raises torch_tpu's DeviceOutOfMemoryError with the figures: no crash, no CPU fallback,
and the process goes on."""

from __future__ import annotations

import pytest
import torch

from torch_tpu.runtime.errors import DeviceOutOfMemoryError
from tpu_support import tpu_only


def test_memory_figures_follow_allocations(chip, platform):
    tpu_only(platform, "XLA:CPU keeps no device allocator figures")
    stats = torch.tpu.memory_stats()
    for key in ("bytes_in_use", "peak_bytes_in_use", "bytes_limit", "allocated_bytes.all.current"):
        assert key in stats, f"{key} missing from {sorted(stats)}"
    free, total = torch.tpu.mem_get_info()
    assert total == stats["bytes_limit"] and 0 < free <= total
    assert total > 8 * 2**30, f"{total} bytes of HBM"
    before = torch.tpu.memory_stats()["bytes_in_use"]
    big = torch.ones(256 * 2**20 // 4, device="tpu")  # 256 MB, written (an op's output)
    torch.tpu.synchronize()
    grown = torch.tpu.memory_stats()["bytes_in_use"] - before
    assert grown >= 256 * 2**20, f"bytes_in_use grew by {grown}"
    assert torch.tpu.memory_allocated() >= 256 * 2**20
    assert "TPU" in torch.tpu.get_device_name()
    del big


@pytest.mark.parametrize("how", ["op", "upload"])
def test_allocation_beyond_hbm_raises_out_of_memory(chip, platform, how):
    tpu_only(platform, "the host would allocate the bytes instead")
    total = torch.tpu.mem_get_info()[1]
    n = (total + 2 * 2**30) // 4  # more floats than the chip holds
    with pytest.raises(DeviceOutOfMemoryError) as caught:
        if how == "op":
            torch.zeros(n, device="tpu")
        else:
            torch.empty(n, dtype=torch.float32).to("tpu")
    message = str(caught.value)
    assert "ran out of memory" in message and "GiB in use of" in message, message
    assert (torch.ones(4, device="tpu") * 2).cpu().tolist() == [2.0] * 4  # the process goes on
