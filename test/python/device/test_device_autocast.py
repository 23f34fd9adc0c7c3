"""`torch.autocast("tpu", dtype=torch.bfloat16)` (issue 13): matmul-like ops run in
bfloat16 and accuracy-sensitive ones in float32 (PyTorch's accelerator policy), and a
model's forward and backward agree with CPU autocast bf16 within bf16 tolerance."""

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import torch_tpu.device  # noqa: F401 - registers the device where autoload is off


def test_autocast_dtype_policy():
    assert torch.amp.is_autocast_available("tpu")
    x = torch.randn(4, 8, device="tpu")
    w = torch.randn(3, 8, device="tpu")
    with torch.autocast("tpu", dtype=torch.bfloat16):
        assert torch.is_autocast_enabled("tpu") and torch.get_autocast_dtype("tpu") is torch.bfloat16
        y = F.linear(x, w)
        assert y.dtype is torch.bfloat16
        assert (x @ w.t()).dtype is torch.bfloat16
        assert F.softmax(y, -1).dtype is torch.float32  # float32 list
        assert (y + 1).dtype is torch.bfloat16  # every other op keeps its inputs' dtype
        assert torch.cat([y, x[:, :3]]).dtype is torch.float32  # and promotes as usual
        with torch.autocast("tpu", enabled=False):
            assert F.linear(x, w).dtype is torch.float32
        assert F.linear(x.double(), w.double()).dtype is torch.float64  # float64 is not cast
    assert F.linear(x, w).dtype is torch.float32
    with torch.autocast("tpu", dtype=torch.float16):
        assert F.linear(x, w).dtype is torch.float16


def test_autocast_rejects_unsupported_dtype():
    with pytest.warns(UserWarning, match="tpu"):
        with torch.autocast("tpu", dtype=torch.float64):
            assert not torch.is_autocast_enabled("tpu")


def _net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 8 * 8, 10))


def _step(model, device):
    model = model.to(device)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(4, 3, 8, 8, generator=gen).to(device)
    y = torch.randint(0, 10, (4,), generator=gen).to(device)
    with torch.autocast(device, dtype=torch.bfloat16):
        logits = model(x)
        loss = F.cross_entropy(logits, y)
    loss.backward()
    return logits, loss, {n: p.grad for n, p in model.named_parameters()}


def test_autocast_forward_backward_equal_cpu_autocast():
    model = _net()
    cpu_logits, cpu_loss, cpu_grads = _step(copy.deepcopy(model), "cpu")
    logits, loss, grads = _step(copy.deepcopy(model), "tpu")
    assert logits.dtype is cpu_logits.dtype is torch.bfloat16
    torch.testing.assert_close(logits.cpu(), cpu_logits, rtol=1.6e-2, atol=1e-2)
    torch.testing.assert_close(loss.cpu().float(), cpu_loss.float(), rtol=1.6e-2, atol=1e-2)
    for name, grad in cpu_grads.items():
        assert grads[name].dtype is torch.float32  # parameters keep their dtype
        # bf16 tolerance scaled to the gradient: the bf16 convolution's weight gradient
        # sums 256 bf16 products, so it differs from CPU's by up to ~8% of its largest entry.
        scale = float(grad.abs().max())
        torch.testing.assert_close(grads[name].cpu(), grad, rtol=2e-2, atol=0.1 * scale, msg=name)
