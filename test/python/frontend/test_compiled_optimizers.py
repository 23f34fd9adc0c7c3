"""Compiled optimizer steps (issue #28): torch.optim's foreach implementations emit
`aten._foreach_*` ops, which compile (compiler/lowering/foreach.py) instead of falling
back to eager. Under TORCH_TPU_STRICT=1 a fallback is an error; the step graphs the
backend receives must hold the foreach ops (Optimizer.step breaks the graph on purpose
around the update, to run it without grad, so fullgraph=True cannot be asked); after 3
steps the losses, the parameters and the optimizer state match eager's."""

from __future__ import annotations

import pytest
import torch

from torch_tpu.backend import tpu_backend


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))


OPTIMIZERS = {
    "adamw_foreach": lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.1, foreach=True),
    "adam_foreach_amsgrad": lambda p: torch.optim.Adam(p, lr=1e-2, amsgrad=True, foreach=True),
    "sgd_momentum": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, foreach=True),
    "sgd_nesterov": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-2, foreach=True),
}


pytestmark = pytest.mark.usefixtures("strict_compile")  # test/python/conftest.py


def _train(make_opt, compiled: bool, seen: set, clip: bool = False, steps: int = 3):
    """`steps` training steps; with `compiled`, the forward and loss through backend="tpu"
    and the optimizer step (and gradient clipping) compiled through it too. `seen`
    collects the torch functions of the step graphs the backend received."""
    model = _model()
    opt = make_opt(model.parameters())

    def update():
        if clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5, foreach=True)
        opt.step()

    def spying_backend(gm, example_inputs):
        seen.update(getattr(n.target, "__name__", str(n.target)) for n in gm.graph.nodes if n.op == "call_function")
        return tpu_backend(gm, example_inputs)

    forward = torch.compile(model, backend="tpu") if compiled else model
    step = torch.compile(update, backend=spying_backend) if compiled else update
    generator = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(steps):
        x, y = torch.randn(32, 8, generator=generator), torch.randn(32, 4, generator=generator)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(forward(x), y)
        loss.backward()
        step()
        losses.append(loss.detach())
    return model, opt, losses


def _assert_same_training(name: str, clip: bool = False) -> set:
    make_opt = OPTIMIZERS[name]
    eager_model, eager_opt, eager_losses = _train(make_opt, False, set(), clip)
    seen: set = set()
    model, opt, losses = _train(make_opt, True, seen, clip)
    torch.testing.assert_close(torch.stack(losses), torch.stack(eager_losses), rtol=1e-5, atol=1e-6)
    for p, expected in zip(model.parameters(), eager_model.parameters()):
        torch.testing.assert_close(p, expected, rtol=1e-5, atol=1e-6)
    for p, expected in zip(model.parameters(), eager_model.parameters()):
        state, expected_state = opt.state[p], eager_opt.state[expected]
        assert state.keys() == expected_state.keys()
        for key in state:
            torch.testing.assert_close(state[key], expected_state[key], rtol=1e-5, atol=1e-6)
    return seen


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_compiled_step_matches_eager(name):
    seen = _assert_same_training(name)
    foreach = {f for f in seen if f.startswith("_foreach_")}
    assert foreach, f"the compiled step held no foreach op: {sorted(seen)}"


def test_compiled_clip_grad_norm_and_adamw():
    """clip_grad_norm_(foreach=True): `_foreach_norm` and a `_foreach_mul_` by a tensor."""
    seen = _assert_same_training("adamw_foreach", clip=True)
    assert {"_foreach_norm", "_foreach_mul_"} <= seen, sorted(seen)


@pytest.mark.parametrize("name", ["adamw_foreach", "adam_foreach_amsgrad"])
def test_compiled_step_on_tpu_parameters_keeps_its_state_on_the_device(name):
    """As on CUDA, Dynamo makes the compiled step capturable for tpu parameters
    (backend/_dynamo_optimizer.py): the step counts live on the device and a steady step
    moves no byte between host and device; the parameters match eager's."""
    import torch_tpu.device  # noqa: F401 - registers the device where autoload is off

    reference = _model()
    model = _model().to("tpu")
    opt, ref_opt = OPTIMIZERS[name](model.parameters()), OPTIMIZERS[name](reference.parameters())
    step = torch.compile(opt.step, backend="tpu")
    generator = torch.Generator().manual_seed(1)
    for i in range(3):
        x = torch.randn(5, 8, generator=generator)
        for m, xs in ((model, x.to("tpu")), (reference, x)):
            m.zero_grad()
            m(xs).square().sum().backward()
        torch.tpu.synchronize()
        before = torch.tpu.transfer_stats()
        step()
        torch.tpu.synchronize()
        moved = torch.tpu.transfer_stats() - before
        ref_opt.step()
        if i:
            assert moved.uploads == 0 and moved.downloads == 0, moved
    assert all(s["step"].device.type == "tpu" for s in opt.state.values())
    for p, r in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p.cpu(), r, rtol=1e-5, atol=1e-6)


def test_a_compiled_training_step_updates_parameters_and_state_in_their_own_buffers(copies):
    """The compiled AdamW step donates the parameters and states it writes: once the
    forward and backward programs have read the parameters (their argument converters
    remember the buffers weakly), a steady step makes no device copy of any of them -- on
    the chip each copy was a launch (134 ms a step instead of 60 ms when the converters
    held the arrays) -- and the training matches eager."""
    import torch_tpu.device  # noqa: F401 - registers the device where autoload is off

    reference = _model()
    model = _model().to("tpu")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, foreach=True)
    ref_opt = torch.optim.AdamW(reference.parameters(), lr=1e-2, foreach=True)

    def train(m, o, x):
        o.zero_grad(set_to_none=True)
        loss = m(x).square().sum()
        loss.backward()
        o.step()
        return loss.detach()

    step = torch.compile(train, backend="tpu")
    generator = torch.Generator().manual_seed(1)
    for i in range(5):
        if i == 3:
            copies.clear()
        x = torch.randn(5, 8, generator=generator)
        loss = step(model, opt, x.to("tpu"))
        torch.testing.assert_close(loss.cpu(), train(reference, ref_opt, x), rtol=1e-4, atol=1e-5)
    assert copies == []
    for p, r in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p.cpu(), r, rtol=1e-4, atol=1e-5)
