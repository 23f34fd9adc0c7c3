"""Optimizer variants whose ops PyTorch has for CPU and CUDA only: the `fused=True`
optimizers (`_fused_adamw_`, `_fused_adam_`, `_fused_sgd_`, `_fused_adagrad_`: PyTorch allows
them on a PrivateUse1 device; compiler/lowering/fused_optimizers.py) and `torch.amp.GradScaler`
(compiler/lowering/grad_scaling.py), decomposed so that no parameter, state or gradient goes
through the host: the tests of the fused ops run under TORCH_TPU_STRICT=1 (a CPU fallback
fails them). Each case trains a CPU copy (PyTorch's fused CPU kernels) and a tpu copy of one
model and compares the parameters and the optimizer's state. The CPU fallback's handling of
ops that write tensor lists and return nothing (it raised IndexError) is tested through an
op that still takes it."""

import copy
import logging

import pytest
import torch

import torch_tpu.device  # noqa: F401 - registers the device where autoload is off

OPTIMIZERS = {
    "adamw-fused": lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.1, fused=True),
    "adamw-fused-amsgrad-maximize": lambda p: torch.optim.AdamW(p, lr=1e-2, amsgrad=True, maximize=True, fused=True),
    "adamw-fused-tensor-lr": lambda p: torch.optim.AdamW(p, lr=torch.tensor(1e-2), weight_decay=0.1, fused=True),
    "adam-fused": lambda p: torch.optim.Adam(p, lr=1e-2, fused=True),
    "adam-fused-amsgrad-weight-decay": lambda p: torch.optim.Adam(p, lr=1e-2, amsgrad=True, weight_decay=0.05,
                                                                 betas=(0.8, 0.9), eps=1e-6, fused=True),
    "sgd-fused": lambda p: torch.optim.SGD(p, lr=1e-2, fused=True),
    "sgd-fused-momentum": lambda p: torch.optim.SGD(p, lr=1e-2, momentum=0.9, fused=True),
    "sgd-fused-nesterov-weight-decay": lambda p: torch.optim.SGD(p, lr=1e-2, momentum=0.9, nesterov=True,
                                                                 weight_decay=0.01, maximize=True, fused=True),
    "sgd-fused-dampening": lambda p: torch.optim.SGD(p, lr=1e-2, momentum=0.5, dampening=0.3, fused=True),
    "adagrad-fused": lambda p: torch.optim.Adagrad(p, lr=1e-2, fused=True),
    "adagrad-fused-decay": lambda p: torch.optim.Adagrad(p, lr=1e-2, lr_decay=0.1, weight_decay=0.05,
                                                         initial_accumulator_value=0.2, maximize=True, fused=True),
}


def _train(model, make_optimizer, device, steps=3, scaler=None, poisoned_step=None):
    opt = make_optimizer(model.parameters())
    dtype = next(model.parameters()).dtype
    gen = torch.Generator().manual_seed(1)
    for step in range(steps):
        x = torch.randn(5, 4, generator=gen).to(dtype)
        if step == poisoned_step:
            x[0, 0] = float("inf")
        opt.zero_grad()
        loss = model(x.to(device)).square().sum()
        if scaler is None:
            loss.backward()
            opt.step()
        else:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
    return opt


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.Tanh(), torch.nn.Linear(6, 3))


def _assert_same_training(cpu, tpu, cpu_opt, tpu_opt, tol=None):
    tol = tol or {"rtol": 1e-5, "atol": 1e-6}
    for (pname, want), got in zip(cpu.named_parameters(), tpu.parameters()):
        assert got.device.type == "tpu"
        torch.testing.assert_close(got.detach().cpu().float(), want.detach().float(), **tol, msg=pname)
    for want_state, got_state in zip(cpu_opt.state.values(), tpu_opt.state.values()):
        for key, value in got_state.items():  # the optimizer's state stays on the device
            if isinstance(value, torch.Tensor):
                assert value.device.type == "tpu", key
                torch.testing.assert_close(value.cpu().float(), want_state[key].float(), **tol, msg=key)


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_fused_optimizer_steps_like_cpu(name, monkeypatch):
    monkeypatch.setenv("TORCH_TPU_STRICT", "1")
    cpu = _model()
    tpu = copy.deepcopy(cpu).to("tpu")
    cpu_opt = _train(cpu, OPTIMIZERS[name], "cpu")
    tpu_opt = _train(tpu, OPTIMIZERS[name], "tpu")
    _assert_same_training(cpu, tpu, cpu_opt, tpu_opt)


def test_fused_optimizer_in_a_compiled_step(monkeypatch):
    """The whole step (forward, backward, fused AdamW) under torch.compile: the fused op
    decomposes into the traced graph."""
    monkeypatch.setenv("TORCH_TPU_STRICT", "1")
    cpu = _model()
    tpu = copy.deepcopy(cpu).to("tpu")
    optimizers = []
    for model, device, backend in ((cpu, "cpu", "eager"), (tpu, "tpu", "tpu")):
        opt = OPTIMIZERS["adamw-fused"](model.parameters())

        @torch.compile(backend=backend)
        def step(x, model=model, opt=opt):
            opt.zero_grad()
            model(x).square().sum().backward()
            opt.step()

        gen = torch.Generator().manual_seed(1)
        for _ in range(3):
            step(torch.randn(5, 4, generator=gen).to(device))
        optimizers.append(opt)
    _assert_same_training(cpu, tpu, *optimizers)


_ADAM = dict(lr=1e-2, beta1=0.9, beta2=0.99, weight_decay=0.1, eps=1e-8, amsgrad=True, maximize=False)
FUSED_OPS = {  # op: (number of tensor lists, which are step counts, which are non-negative, options)
    "adam": (torch._fused_adam_, 6, {5}, {3, 4}, _ADAM),
    "adamw": (torch._fused_adamw_, 6, {5}, {3, 4}, _ADAM),
    "sgd": (torch._fused_sgd_, 3, set(), set(), dict(weight_decay=0.01, momentum=0.9, lr=0.1, dampening=0.1, nesterov=True,
                                               maximize=False, is_first_step=False)),
    "adagrad": (torch._fused_adagrad_, 4, {3}, {2}, dict(lr=0.1, lr_decay=0.01, weight_decay=0.01, eps=1e-10,
                                                     maximize=True)),
}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name", list(FUSED_OPS))
def test_fused_op_in_16_bit_floats_matches_pytorchs_kernel(name, dtype, monkeypatch):
    """One call of the op on the same 16-bit parameters, gradients and state (computed in
    float32, rounded once when stored): PyTorch's CPU kernel's values, to one rounding.
    (Training a 16-bit model instead compares the forwards' roundings, which a few steps
    amplify past any bound: PyTorch's own fused and foreach SGD differ by 0.09 there.)"""
    monkeypatch.setenv("TORCH_TPU_STRICT", "1")
    op, lists, step_lists, non_negative, options = FUSED_OPS[name]
    gen = torch.Generator().manual_seed(4)
    shapes = [(5, 3), (7,), ()]
    cpu = []
    for i in range(lists):
        if i in step_lists:
            cpu.append([torch.tensor(3.0) for _ in shapes])
        else:  # sums of squared gradients non-negative
            cpu.append([(torch.randn(s, generator=gen).abs() if i in non_negative else torch.randn(s, generator=gen))
                        .to(dtype) for s in shapes])
    tpu = [[t.to("tpu") for t in ts] for ts in cpu]
    op(*cpu, **options)
    op(*tpu, **options)
    for got_list, want_list in zip(tpu, cpu):
        for got, want in zip(got_list, want_list):
            assert got.dtype == want.dtype and got.shape == want.shape
            torch.testing.assert_close(got.cpu(), want, rtol=8e-3, atol=1e-5)


@pytest.mark.parametrize("name", ["adamw-fused", "sgd-fused-momentum", "adagrad-fused"])
def test_fused_optimizer_with_grad_scaler_skips_the_inf_step(name, monkeypatch):
    """GradScaler hands the fused ops `grad_scale` and `found_inf`: the gradients are
    unscaled (and written back so), and the step with an inf is skipped by the op itself."""
    monkeypatch.setenv("TORCH_TPU_STRICT", "1")
    cpu = _model()
    tpu = copy.deepcopy(cpu).to("tpu")
    cpu_scaler, tpu_scaler = torch.amp.GradScaler("cpu", init_scale=1024.0), torch.amp.GradScaler("tpu", init_scale=1024.0)
    cpu_opt = _train(cpu, OPTIMIZERS[name], "cpu", steps=4, scaler=cpu_scaler, poisoned_step=2)
    tpu_opt = _train(tpu, OPTIMIZERS[name], "tpu", steps=4, scaler=tpu_scaler, poisoned_step=2)
    assert tpu_scaler.get_scale() == cpu_scaler.get_scale() == 512.0
    _assert_same_training(cpu, tpu, cpu_opt, tpu_opt)
    for want, got in zip(cpu.parameters(), tpu.parameters()):
        torch.testing.assert_close(got.grad.cpu(), want.grad, rtol=1e-5, atol=1e-6)


def test_fallback_writes_back_every_tensor_of_a_written_list():
    """An op that writes tensor lists and returns nothing, run by the CPU fallback:
    every element written back, None returned (it raised IndexError)."""
    from torch_tpu.device import _fallback

    gen = torch.Generator().manual_seed(2)
    params = [torch.randn(3, generator=gen), torch.randn(2, 2, generator=gen)]
    grads = [torch.randn_like(p) for p in params]
    bufs = [torch.zeros_like(p) for p in params]
    tpu = [[t.to("tpu") for t in ts] for ts in (params, grads, bufs)]
    options = dict(weight_decay=0.0, momentum=0.9, lr=0.1, dampening=0.0, nesterov=False, maximize=False,
                   is_first_step=True)
    returned = _fallback.run_on_cpu(torch.ops.aten._fused_sgd_.default, tuple(tpu), options, "test")
    torch._fused_sgd_(params, grads, bufs, **options)
    assert returned is None
    for got, want in zip(tpu[0] + tpu[2], params + bufs):
        assert got.device.type == "tpu"
        torch.testing.assert_close(got.cpu(), want)


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


def test_grad_scaler_ops_compiled(monkeypatch):
    """A compiled graph holds the functional `_amp_foreach_non_finite_check_and_unscale` and
    `_amp_update_scale` (they ran in PyTorch eager inside the graph)."""
    monkeypatch.setenv("TORCH_TPU_STRICT", "1")
    torch._dynamo.reset()

    @torch.compile(backend="tpu", fullgraph=True)
    def unscale_and_update(grads, found, inv_scale, scale, tracker):
        torch._amp_foreach_non_finite_check_and_unscale_(grads, found, inv_scale)
        torch._amp_update_scale_(scale, tracker, found, 2.0, 0.5, 2)

    gen = torch.Generator().manual_seed(6)
    for poisoned in (False, True):
        grads = [torch.randn(5, generator=gen) * 100, torch.randn(2, 3, generator=gen)]
        if poisoned:
            grads[1][0, 1] = float("inf")
        state = [torch.zeros(1), torch.tensor(1 / 64.0), torch.tensor([64.0]), torch.tensor([1], dtype=torch.int32)]
        cpu_grads, cpu_state = [g.clone() for g in grads], [t.clone() for t in state]
        torch._amp_foreach_non_finite_check_and_unscale_(cpu_grads, cpu_state[0], cpu_state[1])
        torch._amp_update_scale_(cpu_state[2], cpu_state[3], cpu_state[0], 2.0, 0.5, 2)
        tpu_grads, tpu_state = [g.to("tpu") for g in grads], [t.to("tpu") for t in state]
        unscale_and_update(tpu_grads, *tpu_state)
        for got, want in zip(tpu_grads + tpu_state, cpu_grads + cpu_state):
            torch.testing.assert_close(got.cpu(), want, rtol=0, atol=0)
