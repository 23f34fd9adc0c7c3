"""Optimizer variants that reach ops without a lowering, which run through the CPU fallback
(`_fallback.run_on_cpu`): the `fused=True` optimizers (`_fused_adamw_`, `_fused_adam_`,
`_fused_sgd_`, `_fused_adagrad_`: PyTorch allows them on a PrivateUse1 device) and
`torch.amp.GradScaler`, whose two ops the device decomposes (compiler/lowering/grad_scaling.py)
so that no gradient goes through the host. The fused ops write lists of tensors in place and
return nothing: the fallback must write every element back and return None (it raised
IndexError before). Each case trains a CPU copy and a tpu copy of one model and compares the
parameters."""

import copy
import logging

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


def test_grad_scaler_unscales_steps_and_skips_like_cpu(caplog):
    """GradScaler: scaled steps equal CPU's; a step whose gradients hold an inf is skipped
    and the scale halves, as on CPU; its ops run on the device."""
    caplog.set_level(logging.INFO, logger="torch_tpu")
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
    assert not [r for r in caplog.records if "_amp_" in r.getMessage()], [r.getMessage() for r in caplog.records]
    for (pname, want), got in zip(cpu.named_parameters(), tpu.parameters()):
        assert torch.isfinite(got.detach().cpu()).all()
        torch.testing.assert_close(got.detach().cpu(), want.detach(), rtol=1e-5, atol=1e-6, msg=pname)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_unscale_matches_pytorchs_kernel(dtype):
    """Unscaling on the device against PyTorch's CPU kernel: the values (reduced precision
    multiplied in float32), and `found_inf` set by a non-finite value and kept across calls."""
    gen = torch.Generator().manual_seed(5)
    grads = [(torch.randn(7, generator=gen) * 300).to(dtype) for _ in range(3)]
    inv_scale = torch.tensor(1 / 1024.0)
    for poisoned in (None, 1):
        cpu = [g.clone() for g in grads]
        if poisoned is not None:
            cpu[poisoned][2] = float("nan")
        tpu = [g.to("tpu") for g in cpu]
        found_cpu, found_tpu = torch.zeros(1), torch.zeros(1).to("tpu")
        torch._amp_foreach_non_finite_check_and_unscale_(cpu, found_cpu, inv_scale)
        torch._amp_foreach_non_finite_check_and_unscale_(tpu, found_tpu, inv_scale.to("tpu"))
        assert found_tpu.item() == found_cpu.item() == (0.0 if poisoned is None else 1.0)
        for got, want in zip(tpu, cpu):
            torch.testing.assert_close(got.cpu(), want, rtol=0, atol=0, equal_nan=True)
    clean = [g.to("tpu") for g in grads]
    found = torch.ones(1).to("tpu")  # an earlier call found one: it stays set
    torch._amp_foreach_non_finite_check_and_unscale_(clean, found, inv_scale.to("tpu"))
    assert found.item() == 1.0


@pytest.mark.parametrize("found,tracker,scale", [(0.0, 0, 8.0), (0.0, 2, 8.0), (1.0, 2, 8.0), (0.0, 2, 3e38)])
def test_update_scale_matches_pytorchs_kernel(found, tracker, scale):
    """Back-off on an inf, growth after `growth_interval` clean steps, no growth to inf."""
    args = (2.0, 0.5, 3)  # growth factor, backoff factor, growth interval
    s_cpu, t_cpu = torch.tensor([scale]), torch.tensor([tracker], dtype=torch.int32)
    s_tpu, t_tpu = s_cpu.clone().to("tpu"), t_cpu.clone().to("tpu")
    torch._amp_update_scale_(s_cpu, t_cpu, torch.tensor([found]), *args)
    out = torch._amp_update_scale_(s_tpu, t_tpu, torch.tensor([found]).to("tpu"), *args)
    assert out.device.type == "tpu"
    assert torch.equal(s_tpu.cpu(), s_cpu) and torch.equal(t_tpu.cpu(), t_cpu), (s_tpu, s_cpu, t_tpu, t_cpu)
