"""Training on the eager tpu device equals CPU eager (issue 13: 20 steps, rtol 1e-4),
in Strict and in Debug mode."""

import copy

import pytest
import torch

import torch_tpu.device  # noqa: F401 - registers the device where autoload is off
from torch_tpu.device import EagerMode, set_eager_mode


def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))


def _train(model, device, make_opt, steps=20):
    model = model.to(device)
    opt = make_opt(model.parameters())
    gen = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(steps):
        x = torch.randn(32, 8, generator=gen).to(device)
        y = torch.randn(32, 4, generator=gen).to(device)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
    return losses, model


OPTIMIZERS = {
    "sgd": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9),
    "adam": lambda p: torch.optim.Adam(p, lr=1e-2),
    "adamw_foreach": lambda p: torch.optim.AdamW(p, lr=1e-2, foreach=True),
    "adamw_forloop": lambda p: torch.optim.AdamW(p, lr=1e-2, foreach=False),
}


@pytest.mark.parametrize("mode", [EagerMode.STRICT, EagerMode.DEBUG, EagerMode.FUSED])
@pytest.mark.parametrize("opt", sorted(OPTIMIZERS))
def test_mlp_losses_equal_cpu(mode, opt):
    model = _mlp()
    expected, _ = _train(copy.deepcopy(model), "cpu", OPTIMIZERS[opt])
    with set_eager_mode(mode):
        got, trained = _train(copy.deepcopy(model), "tpu", OPTIMIZERS[opt])
    torch.testing.assert_close(torch.tensor(got), torch.tensor(expected), rtol=1e-4, atol=1e-6)
    assert all(p.device.type == "tpu" for p in trained.parameters())


def test_no_grad_and_state_dict_roundtrip(tmp_path):
    model = _mlp().to("tpu")
    with torch.no_grad():
        out = model(torch.ones(2, 8, device="tpu"))
    assert not out.requires_grad
    path = tmp_path / "m.pt"
    torch.save(model.state_dict(), path)
    loaded = torch.load(path, map_location="cpu")
    for name, value in model.state_dict().items():
        assert loaded[name].device.type == "cpu"
        torch.testing.assert_close(loaded[name], value.cpu())
    fresh = _mlp()
    with torch.no_grad():
        for p in fresh.parameters():
            p.zero_()
    fresh.load_state_dict(loaded)
    fresh = fresh.to("tpu")
    torch.testing.assert_close(fresh(torch.ones(2, 8, device="tpu")).cpu(), out.cpu())
