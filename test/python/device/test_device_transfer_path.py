"""The common host <-> device copies (issue 28): `.to("tpu")` of a row-major host tensor
and `.cpu()` of a tensor that is its storage's buffer (`_storage.passes_as_is`) take the
short path -- one transfer of the memory as it is, straight to the new tensor -- and keep
every semantics of the general path (strides, writable memory of its own, a value fixed
at the call, FUSED values flushed). Everything else (views, dtype or layout changes,
lazy conj/neg bits, non_blocking reads) still takes the general path.

Transfers are counted by the runtime (`torch.tpu.transfer_stats()`), the path by the
Python frames the copy runs."""

from __future__ import annotations

import sys

import pytest
import torch

import torch_tpu.device  # noqa: F401 - registers the device where autoload is off
from torch_tpu.device import EagerMode, _storage, set_eager_mode
from torch_tpu.runtime import get_client

# The general path's helpers: reading a view through its storage, or uploading through
# the storage-order permutation. The short path runs none of them.
_GENERAL_UPLOAD = {"upload", "from_buffer", "wrap", "tensor_on", "dense_order", "stored_shape"}
_GENERAL_READ = {"to_host", "storage_to_host", "is_whole_storage", "_host_like", "bytes_as"}


def _torch_tpu_frames(fn) -> tuple[object, list[str]]:
    """(fn's result, the names of the torch_tpu functions it ran, in call order)."""
    seen: list[str] = []

    def profile(frame, event, arg):
        if event == "call" and frame.f_globals.get("__name__", "").startswith("torch_tpu"):
            seen.append(frame.f_code.co_name)

    sys.setprofile(profile)
    try:
        out = fn()
    finally:
        sys.setprofile(None)
    return out, seen


def _delta(fn):
    torch.tpu.synchronize()
    before = torch.tpu.transfer_stats()
    out = fn()
    return out, torch.tpu.transfer_stats() - before


_DENSE_HOSTS = {
    "1-D 1 MB": lambda: torch.randn(1 << 18),
    "2-D": lambda: torch.randn(16, 33),
    "0-d": lambda: torch.tensor(2.5),
    "bfloat16": lambda: torch.randn(8, 4).to(torch.bfloat16),
    "int64": lambda: torch.arange(12).view(3, 4),
    "bool": lambda: torch.rand(5, 3) > 0.5,
    # Row-major with free strides on its size-1 dimensions: kept, as PyTorch's copy keeps them.
    "size-1 strides": lambda: torch.randn(3, 5).as_strided((3, 1, 5), (5, 7, 1)),
    "offset into a larger storage": lambda: torch.randn(40)[8:],
}


@pytest.mark.parametrize("make", _DENSE_HOSTS.values(), ids=_DENSE_HOSTS.keys())
def test_upload_of_a_row_major_tensor_is_one_transfer_of_its_memory(make):
    host = make()
    (device, frames) = _torch_tpu_frames(lambda: host.to("tpu"))
    assert not _GENERAL_UPLOAD & set(frames), frames
    assert frames.count("batched_device_put") == 1, frames
    assert device.shape == host.shape and device.stride() == host.stride() and device.dtype == host.dtype
    # The storage's buffer has the tensor's shape: it passes to programs as it is.
    assert _storage.entry_of(device).shape == tuple(host.shape)
    assert _storage.passes_as_is(device)
    expected = host.clone()
    _, moved = _delta(lambda: host.to("tpu"))
    assert (moved.uploads, moved.upload_bytes, moved.programs_executed) == (1, host.numel() * host.element_size(), 0)
    # Copied during the call: writing the host tensor afterwards does not reach the device.
    host.fill_(0) if host.dtype != torch.bool else host.logical_not_()
    torch.testing.assert_close(device.cpu(), expected)


@pytest.mark.parametrize("make", _DENSE_HOSTS.values(), ids=_DENSE_HOSTS.keys())
def test_read_of_a_tensor_that_is_its_buffer_is_its_host_copy(make):
    host = make()
    device = host.to("tpu")
    (back, frames) = _torch_tpu_frames(lambda: device.cpu())
    assert not _GENERAL_READ & set(frames), frames
    assert back.shape == host.shape and back.stride() == host.stride() and back.dtype == host.dtype
    torch.testing.assert_close(back, host)
    _, moved = _delta(lambda: device.cpu())
    assert moved.programs_executed == 0 and moved.uploads == 0
    if get_client().platform == "cpu":
        assert moved.dlpack_exports == 1  # XLA:CPU hands the buffer over without a transfer ...
    else:
        assert moved.downloads == 1 and moved.download_bytes == host.numel() * host.element_size()
    # ... and .cpu() returns memory of its own: writing it leaves the device value alone.
    back.zero_() if back.dtype != torch.bool else back.logical_not_()
    torch.testing.assert_close(device.cpu(), host)


@pytest.mark.parametrize("read", [
    lambda t: t[1:].cpu(),                                   # offset view
    lambda t: t.t().cpu(),                                   # transposed
    lambda t: t.view(-1).cpu(),                              # another shape of the storage
    lambda t: t.to("cpu", torch.float64),                    # dtype change
    lambda t: t.to("cpu", memory_format=torch.contiguous_format),
    lambda t: t.neg().cpu(),
    lambda t: torch._neg_view(t).cpu(),                      # lazy negation bit
], ids=["offset", "transposed", "reshaped", "dtype", "memory_format", "neg", "neg_view"])
def test_other_reads_keep_the_general_paths_answers(read):
    host = torch.randn(4, 6)
    got = read(host.to("tpu"))
    expected = read(host)
    assert got.device.type == "cpu" and got.stride() == expected.stride()
    torch.testing.assert_close(got, expected)


def test_lazy_conjugation_is_applied_on_the_way_in_and_out():
    host = torch.randn(3, 4, dtype=torch.complex64)
    torch.testing.assert_close(host.conj().to("tpu").cpu().resolve_conj(), host.conj().resolve_conj())
    torch.testing.assert_close(host.to("tpu").conj().cpu().resolve_conj(), host.conj().resolve_conj())


def test_non_blocking_copies_keep_their_order():
    host = torch.randn(64)
    device = host.to("tpu", non_blocking=True)
    out = device.to("cpu", non_blocking=True)
    torch.tpu.synchronize()
    torch.testing.assert_close(out, host)
    # A blocking read of the value the non_blocking copy is still writing waits for it.
    later = (device * 2).to("cpu", non_blocking=True)
    torch.testing.assert_close(later.to("tpu").cpu(), host * 2)


def test_a_fused_value_is_computed_when_read():
    host = torch.randn(32)
    with set_eager_mode(EagerMode.FUSED):
        device = host.to("tpu")
        result = (device + 1) * 2  # recorded, pending
        torch.testing.assert_close(result.cpu(), (host + 1) * 2)


def test_a_deleted_buffer_is_named_on_read():
    from torch_tpu.runtime import BufferDeletedError

    device = torch.randn(8).to("tpu")
    _storage.entry_of(device).buffer.delete()
    with pytest.raises(BufferDeletedError, match="deleted"):
        device.cpu()


def test_an_upload_as_the_first_tpu_tensor_registers_the_op_kernels():
    """The op kernels are registered on the first tpu tensor: one made by `.to("tpu")`'s
    short path counts too, so the next `x + y` runs add.Tensor's own plan (not PyTorch's
    composite route through add.out)."""
    import subprocess

    code = (
        "import torch, torch_tpu.device\n"
        "from torch_tpu.device import _ops\n"
        "x = torch.randn(4).to('tpu')\n"
        "ran = []\n"
        "run = _ops.run\n"
        "_ops.run = lambda op, *a, **k: (ran.append(str(op)), run(op, *a, **k))[1]\n"
        "y = x + x\n"
        "print(ran)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    assert out.stdout.strip().splitlines()[-1] == "['aten.add.Tensor']", out.stdout + out.stderr


@pytest.mark.parametrize("shape", [(4, 16, 10), (3, 1, 5)])
def test_a_host_copy_in_device_layout_order_is_read_in_the_tensors_order(shape, monkeypatch):
    """On a TPU, the host copy of a compiled program's result may come in the memory order
    of its device layout (a NumPy array with permuted strides): `.cpu()` must give the
    tensor's values, not reinterpret that memory with the tensor's row-major strides
    (the chip's first run of this path read a [4, 16, 10] result scrambled)."""
    value = torch.randn(shape)
    t = value.to("tpu")
    original = _storage._buffer_to_host

    def in_device_order(entry):
        host = original(entry)
        return host.permute(*reversed(range(host.dim()))).contiguous().permute(*reversed(range(host.dim())))

    monkeypatch.setattr(_storage, "_buffer_to_host", in_device_order)
    assert not in_device_order(_storage.entry_of(t)).is_contiguous() or shape[1] == 1
    got = t.cpu()
    torch.testing.assert_close(got, value, rtol=0, atol=0)
    assert got.stride() == t.stride()
