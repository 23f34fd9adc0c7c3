"""torch.save / torch.load of tpu tensors without map_location (they load back onto
tpu, views sharing one storage), and `torch.UntypedStorage(n, device="tpu")`, which
PyTorch builds through a C++ allocator a Python backend lacks (issue 13: it crashed)."""

import io
import subprocess
import sys

import pytest
import torch

import torch_tpu.device  # noqa: F401 - registers the device where autoload is off
from torch_tpu.device._buffers import entry_of


def _roundtrip(obj):
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    buffer.seek(0)
    return torch.load(buffer)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.bool])
def test_load_without_map_location_returns_tpu_tensors(monkeypatch, dtype):
    host = (torch.arange(12) % 5).to(dtype).view(3, 4)
    x = host.to("tpu")
    loaded = _roundtrip({"x": x, "column": x[:, 1], "t": x.t()})
    for key, expected in {"x": host, "column": host[:, 1], "t": host.t()}.items():
        assert loaded[key].device == torch.device("tpu:0"), key
        assert loaded[key].dtype is dtype
        assert loaded[key].stride() == expected.stride()
        torch.testing.assert_close(loaded[key].cpu(), expected)
    # The views share one storage, as saved, and it holds elements of the saved dtype:
    # ops on the loaded tensors run on the device (no CPU fallback under TORCH_TPU_STRICT).
    assert loaded["column"].untyped_storage().data_ptr() == loaded["x"].untyped_storage().data_ptr()
    assert entry_of(loaded["x"]).dtype is dtype
    monkeypatch.setenv("TORCH_TPU_STRICT", "1")
    if dtype.is_floating_point:
        loaded["x"].mul_(2)
        torch.testing.assert_close(loaded["column"].cpu(), host[:, 1] * 2)


def test_model_state_dict_roundtrip_on_tpu(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3)).to("tpu")
    path = tmp_path / "model.pt"
    torch.save(model.state_dict(), path)
    state = torch.load(path)
    assert all(v.device.type == "tpu" for v in state.values())
    fresh = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3)).to("tpu")
    fresh.load_state_dict(state)
    x = torch.randn(5, 4, device="tpu")
    torch.testing.assert_close(fresh.eval()(x).cpu(), model.eval()(x).cpu())


def test_untyped_storage_on_tpu():
    storage = torch.UntypedStorage(16, device="tpu")
    assert storage.device == torch.device("tpu:0") and storage.nbytes() == 16
    source = torch.arange(4, dtype=torch.float32)
    storage.copy_(source.untyped_storage())
    t = torch.empty(0, device="tpu").set_(storage, 0, (4,), (1,))
    torch.testing.assert_close(t.cpu(), source)
    from_bytes = torch.UntypedStorage([1, 2, 3], device="tpu:0")
    assert from_bytes.nbytes() == 3
    assert torch.UntypedStorage(8).device.type == "cpu"  # other devices keep PyTorch's constructor


def test_untyped_storage_does_not_crash_the_process():
    code = ("import torch, torch_tpu.device; s = torch.UntypedStorage(8, device='tpu'); "
            "print(s.device, s.nbytes())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["tpu:0", "8"]
