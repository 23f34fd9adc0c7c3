"""The eager tpu device on the chip: training in Strict, Debug (TPU_LAUNCH_BLOCKING) and FUSED
(TORCH_TPU_DEFER_AND_FUSE) modes, views and in-place ops, torch.autocast("tpu")."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from torch_tpu.device import EagerMode, set_eager_mode


def _losses(device: str, steps: int = 6) -> list[float]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.Tanh(), nn.Linear(64, 4)).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x, y = torch.randn(16, 32).to(device), torch.randn(16, 4).to(device)
    out = []
    for _ in range(steps):
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        out.append(loss.item())
    return out


@pytest.mark.parametrize("mode", [EagerMode.STRICT, EagerMode.DEBUG, EagerMode.FUSED], ids=lambda m: m.value)
def test_training_in_each_mode_matches_cpu(chip, mode):
    reference = _losses("cpu")
    with set_eager_mode(mode):
        got = _losses("tpu")
    assert got[-1] < got[0]
    torch.testing.assert_close(torch.tensor(got), torch.tensor(reference), atol=1e-4, rtol=1e-4)


def test_debug_mode_raises_at_the_failing_line(chip):
    with set_eager_mode(EagerMode.DEBUG):
        a = torch.ones(3, device="tpu")
        with pytest.raises(RuntimeError):
            a @ torch.ones(4, device="tpu")  # a shape error, raised by the op itself


@pytest.mark.parametrize("mode", [EagerMode.STRICT, EagerMode.FUSED], ids=lambda m: m.value)
def test_views_and_in_place_ops(chip, mode):
    base = torch.arange(24.0).reshape(4, 6)
    with set_eager_mode(mode):
        t = base.to("tpu")
        t[1:3, ::2] += 10
        t.t()[0].mul_(-1)
        col = t[:, 4]
        col.clamp_(max=15)
        t.view(-1)[5] = 99
        diag = t.diagonal()
        diag.zero_()
        got = t.cpu()
    want = base.clone()
    want[1:3, ::2] += 10
    want.t()[0].mul_(-1)
    want[:, 4].clamp_(max=15)
    want.view(-1)[5] = 99
    want.diagonal().zero_()
    assert torch.equal(got, want)


def test_autocast_runs_matmuls_in_bfloat16(chip):
    torch.manual_seed(0)
    lin = nn.Linear(64, 32).to("tpu")
    x = torch.randn(8, 64).to("tpu")
    with torch.autocast("tpu", dtype=torch.bfloat16):
        y = lin(x)
        s = torch.softmax(y.float(), -1)
    assert y.dtype == torch.bfloat16 and s.dtype == torch.float32
    ref = nn.functional.linear(x.cpu().bfloat16(), lin.weight.cpu().bfloat16(), lin.bias.cpu().bfloat16())
    torch.testing.assert_close(y.cpu().float(), ref.float(), atol=3e-2, rtol=3e-2)
