"""PyTorch's device-generic host APIs with the tpu device as the current accelerator:
`tensor.pin_memory()` / `is_pinned()` and `DataLoader(pin_memory=True)` (they raised
NotImplementedError for every process that imported torch with torch_tpu installed, a
CPU-only script too: device/_pinned.py), `torch.accelerator.synchronize()` (it raised
"Backend doesn't support synchronizing all streams on device") and `torch.accelerator`'s
memory functions (an INTERNAL ASSERT: device/_accelerator_api.py); `torch.tpu`'s timing
events and memory summary."""

import os
import subprocess
import sys
import textwrap

import pytest
import torch

import torch_tpu.device  # noqa: F401 - registers the device where autoload is off

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


@pytest.mark.parametrize("make", [
    lambda: torch.arange(12.0).reshape(3, 4),
    lambda: torch.arange(12.0).reshape(3, 4)[:, ::2],  # a view with gaps: its strides kept
    lambda: torch.arange(6, dtype=torch.int32).reshape(2, 3).t(),
    lambda: torch.tensor(3.5),
], ids=["dense", "strided-view", "transposed-int", "0-dim"])
def test_pin_memory_copies_into_a_pinned_storage(make):
    x = make()
    pinned = x.pin_memory()
    assert pinned.device.type == "cpu" and pinned.is_pinned() and not x.is_pinned()
    assert pinned.stride() == x.stride() and pinned.dtype == x.dtype
    assert pinned.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()
    assert torch.equal(pinned, x)
    assert pinned.pin_memory() is pinned  # pinned already: PyTorch returns it as it is
    assert pinned.as_strided((1,), (1,)).is_pinned()  # a view of pinned memory is pinned
    assert torch.equal(pinned.to("tpu", non_blocking=True).cpu(), x)


def test_pin_memory_keeps_autograd():
    x = torch.ones(3, requires_grad=True)
    pinned = x.pin_memory()
    pinned.sum().backward()
    assert pinned.is_pinned() and torch.equal(x.grad, torch.ones(3))


@pytest.mark.parametrize("workers", [0, 2])
def test_data_loader_pins_batches(workers):
    data = torch.utils.data.TensorDataset(torch.arange(16.0).reshape(8, 2), torch.arange(8))
    loader = torch.utils.data.DataLoader(data, batch_size=4, pin_memory=True, num_workers=workers)
    total = 0.0
    for x, y in loader:
        assert x.is_pinned() and y.is_pinned()
        total += x.to("tpu", non_blocking=True).sum().item()
    assert total == sum(range(16))
    nested = torch.utils.data.DataLoader([{"a": torch.ones(2), "b": [torch.zeros(1)]}] * 2, batch_size=2,
                                         pin_memory=True)
    batch = next(iter(nested))
    assert batch["a"].is_pinned() and batch["b"][0].is_pinned()


def test_pinning_works_without_importing_torch_tpu():
    """The autoloaded device makes tpu the current accelerator of every process: a CPU-only
    script's `DataLoader(pin_memory=True)` goes through these kernels too."""
    code = """
        import torch
        data = torch.utils.data.TensorDataset(torch.ones(4, 2))
        batch = next(iter(torch.utils.data.DataLoader(data, batch_size=2, pin_memory=True)))[0]
        print(torch.accelerator.current_accelerator().type, batch.is_pinned(), torch.ones(2).pin_memory().is_pinned())
    """
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300,
                         cwd=REPO)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["tpu", "True", "True"]


@pytest.mark.parametrize("device", [None, 0, "tpu", torch.device("tpu:0")], ids=str)
def test_accelerator_synchronize_waits_for_the_device(device):
    host = (torch.ones(1000, device="tpu") * 3).to("cpu", non_blocking=True)
    torch.accelerator.synchronize(device)
    assert host.sum().item() == 3000.0


def test_accelerator_synchronize_keeps_pytorchs_function_for_other_devices():
    from torch_tpu.device import _accelerator_api

    assert torch.accelerator.synchronize._torch_tpu_dispatching
    assert torch.accelerator.synchronize.__doc__ == _accelerator_api._originals["synchronize"].__doc__
    with pytest.raises((RuntimeError, ValueError)):
        torch.accelerator.synchronize("cpu")  # PyTorch's own check: not the accelerator's type


def test_record_stream_is_accepted(monkeypatch):
    """`tensor.record_stream(stream)` with a `torch.Stream` of the device (device-generic
    code's `torch.accelerator.current_stream()`): nothing to record on one in-order queue
    (it reached the CPU fallback, which has no kernel, and raised)."""
    monkeypatch.setenv("TORCH_TPU_STRICT", "1")
    x = torch.arange(3.0).to("tpu")
    x.record_stream(torch.accelerator.current_stream())
    x.record_stream(torch.Stream("tpu"))
    assert torch.equal(x.cpu(), torch.arange(3.0))


def test_accelerator_memory_figures_are_the_devices():
    """`torch.accelerator`'s memory functions failed an INTERNAL ASSERT on the tpu device
    ("Allocator for tpu is not a DeviceAllocator"): they give torch.tpu's figures."""
    keep = torch.ones(1024, device="tpu")
    before = torch.tpu.memory_allocated()
    assert torch.accelerator.memory_allocated() == before
    more = torch.ones(4096, device="tpu")  # one more 16 KiB storage
    assert torch.accelerator.memory_allocated() == before + 4096 * 4 == torch.tpu.memory_allocated()
    for device in (0, "tpu", torch.device("tpu:0")):
        assert torch.accelerator.memory_allocated(device) == before + 4096 * 4
    assert torch.accelerator.max_memory_allocated() >= before + 4096 * 4
    stats = torch.accelerator.memory_stats()
    assert list(stats) == sorted(stats)  # PyTorch's order
    assert stats["allocated_bytes.all.current"] == before + 4096 * 4
    assert stats["reserved_bytes.all.current"] == torch.accelerator.memory_reserved() == torch.tpu.memory_reserved()
    assert torch.accelerator.max_memory_reserved() >= torch.accelerator.memory_reserved() > 0
    del more
    torch.accelerator.empty_cache()
    torch.accelerator.reset_peak_memory_stats()
    assert torch.accelerator.max_memory_allocated() == torch.accelerator.memory_allocated() == before
    torch.accelerator.reset_accumulated_memory_stats()
    if not torch.tpu.memory_stats().get("bytes_limit"):  # XLA:CPU: no device figures, a clear error
        with pytest.raises(RuntimeError, match="mem_get_info: the cpu platform reports no device memory"):
            torch.accelerator.get_memory_info()
    else:
        free, total = torch.accelerator.get_memory_info()
        assert 0 < free <= total
    assert keep.sum().item() == 1024


def test_accelerator_memory_functions_keep_pytorchs_for_other_devices():
    from torch_tpu.device import _accelerator_api

    for name in ("memory_stats", "memory_allocated", "empty_cache", "get_memory_info"):
        function = getattr(torch.accelerator, name)
        assert function._torch_tpu_dispatching and function.__doc__ == _accelerator_api._originals[name].__doc__
        assert getattr(torch.accelerator.memory, name) is function  # their callers in that module see it too
    with pytest.raises((RuntimeError, ValueError)):
        torch.accelerator.memory_allocated("cpu")  # PyTorch's own check: not the accelerator's type


def test_memory_summary_names_the_figures():
    x = torch.ones(256, device="tpu")
    full, short = torch.tpu.memory_summary(), torch.tpu.memory_summary(abbreviated=True)
    assert full.startswith("torch_tpu memory summary, tpu:0") and short.startswith("torch_tpu memory summary, tpu:0")
    for label in ("storages live", "allocated by tpu storages, current", "reserved by the device allocator, peak"):
        assert label in full and label in short
    assert len(short) <= len(full)
    assert x.sum().item() == 256


def test_timing_events_measure_the_work_between_their_records():
    start, end = torch.tpu.Event(enable_timing=True), torch.tpu.Event(enable_timing=True)
    x = torch.randn(256, 256, device="tpu")
    start.record()
    for _ in range(20):
        x = x @ x * 1e-3
    end.record()
    end.synchronize()
    assert end.elapsed_time(start) < 0 < start.elapsed_time(end)
    assert torch.isfinite(x).all().item()
    with pytest.raises(RuntimeError, match="enable_timing=True"):
        torch.tpu.Event().elapsed_time(end)
    with pytest.raises(RuntimeError, match="must be recorded"):
        start.elapsed_time(torch.tpu.Event(enable_timing=True))
