"""Optimizer variants that reach ops without a lowering, which run through the CPU fallback
(`_fallback.run_on_cpu`): the `fused=True` optimizers (`_fused_adamw_`, `_fused_adam_`,
`_fused_sgd_`, `_fused_adagrad_`: PyTorch allows them on a PrivateUse1 device) and
`torch.amp.GradScaler` (`_amp_foreach_non_finite_check_and_unscale_`, `_amp_update_scale_`).
These ops write lists of tensors in place and return nothing: the fallback must write every
element back and return None (it raised IndexError before). Each case trains a CPU copy and a
tpu copy of one model and compares the parameters."""

import copy

import pytest
import torch

import torch_tpu.device  # noqa: F401 - registers the device where autoload is off

OPTIMIZERS = {
    "adamw-fused": lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.1, fused=True),
    "adam-fused-amsgrad": lambda p: torch.optim.Adam(p, lr=1e-2, amsgrad=True, fused=True),
    "sgd-fused-momentum": lambda p: torch.optim.SGD(p, lr=1e-2, momentum=0.9, fused=True),
    "adagrad-fused": lambda p: torch.optim.Adagrad(p, lr=1e-2, fused=True),
}


def _train(model, make_optimizer, device, steps=3):
    opt = make_optimizer(model.parameters())
    gen = torch.Generator().manual_seed(1)
    for _ in range(steps):
        x = torch.randn(5, 4, generator=gen).to(device)
        opt.zero_grad()
        model(x).square().sum().backward()
        opt.step()
    return opt


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_fused_optimizer_steps_like_cpu(name):
    torch.manual_seed(0)
    cpu = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.Tanh(), torch.nn.Linear(6, 3))
    tpu = copy.deepcopy(cpu).to("tpu")
    _train(cpu, OPTIMIZERS[name], "cpu")
    opt = _train(tpu, OPTIMIZERS[name], "tpu")
    for (pname, want), got in zip(cpu.named_parameters(), tpu.parameters()):
        assert got.device.type == "tpu"
        torch.testing.assert_close(got.detach().cpu(), want.detach(), rtol=1e-5, atol=1e-6, msg=pname)
    for state in opt.state.values():  # the optimizer's state stays on the device
        assert all(v.device.type == "tpu" for v in state.values() if isinstance(v, torch.Tensor))


def test_grad_scaler_unscales_steps_and_skips_like_cpu():
    """GradScaler: scaled steps equal CPU's; a step whose gradients hold an inf is skipped
    and the scale halves, as on CPU."""
    torch.manual_seed(0)
    cpu = torch.nn.Linear(4, 3)
    tpu = copy.deepcopy(cpu).to("tpu")
    scales = {}
    for model, device in ((cpu, "cpu"), (tpu, "tpu")):
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        scaler = torch.amp.GradScaler(device, init_scale=1024.0)
        gen = torch.Generator().manual_seed(1)
        for step in range(4):
            x = torch.randn(5, 4, generator=gen)
            if step == 2:
                x[0, 0] = float("inf")
            opt.zero_grad()
            scaler.scale(model(x.to(device)).square().sum()).backward()
            scaler.step(opt)
            scaler.update()
        scales[device] = scaler.get_scale()
    assert scales["tpu"] == scales["cpu"] == 512.0
    for (pname, want), got in zip(cpu.named_parameters(), tpu.parameters()):
        assert torch.isfinite(got.detach().cpu()).all()
        torch.testing.assert_close(got.detach().cpu(), want.detach(), rtol=1e-5, atol=1e-6, msg=pname)
