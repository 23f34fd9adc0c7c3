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


# Moving a model whose optimizer already exists (issue 30 item 2): `Module.to` keeps the
# Parameter objects between cpu and tpu as between cpu and cuda, so the optimizer steps the
# parameters the model uses. Before, the model got new Parameters and the loss stayed flat.

def _train_moving(model, devices, make_opt, *, opt=None, forward=None, detours=()):
    """Trains one step per entry of `devices`, moving the model to it first; the optimizer
    (`opt`, else made by `make_opt`) is made before any move. `forward`: what computes the
    output (default the model; a compiled model, say). `detours`: steps before which the
    model first visits the CPU (a checkpoint between two steps)."""
    opt = opt if opt is not None else make_opt(model.parameters())
    forward = forward if forward is not None else model
    ids = [id(p) for p in model.parameters()]
    gen = torch.Generator().manual_seed(1)
    losses = []
    for step, device in enumerate(devices):
        if step in detours:
            model.cpu()
        model.to(device)
        assert [id(p) for p in model.parameters()] == ids
        x = torch.randn(32, 8, generator=gen).to(device)
        y = torch.randn(32, 4, generator=gen).to(device)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(forward(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


MOVING_OPTIMIZERS = {
    "sgd": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9),
    "adamw": lambda p: torch.optim.AdamW(p, lr=1e-2),
}


@pytest.mark.parametrize("opt", sorted(MOVING_OPTIMIZERS))
def test_optimizer_made_before_the_move_trains(opt):
    model = _mlp()
    expected = _train_moving(copy.deepcopy(model), ["cpu"] * 5, MOVING_OPTIMIZERS[opt])
    got = _train_moving(copy.deepcopy(model), ["tpu"] * 5, MOVING_OPTIMIZERS[opt])
    torch.testing.assert_close(torch.tensor(got), torch.tensor(expected), rtol=1e-4, atol=1e-6)
    assert len(set(got)) == 5  # it trains: no step repeats the loss of the one before


def test_cpu_tpu_round_trip_mid_training():
    # Plain SGD keeps no state, so steps may run on either device (as between cpu and cuda).
    make = lambda p: torch.optim.SGD(p, lr=0.05)  # noqa: E731
    model = _mlp()
    expected = _train_moving(copy.deepcopy(model), ["cpu"] * 5, make)
    got = _train_moving(copy.deepcopy(model), ["tpu", "cpu", "tpu", "cpu", "tpu"], make)
    torch.testing.assert_close(torch.tensor(got), torch.tensor(expected), rtol=1e-4, atol=1e-6)


def test_adamw_state_survives_a_round_trip_between_steps():
    # State made on tpu; the model visits the cpu between two steps (a checkpoint, say).
    make = MOVING_OPTIMIZERS["adamw"]
    model = _mlp()
    expected = _train_moving(copy.deepcopy(model), ["cpu"] * 4, make)
    got = _train_moving(copy.deepcopy(model), ["tpu"] * 4, make, detours={2})
    torch.testing.assert_close(torch.tensor(got), torch.tensor(expected), rtol=1e-4, atol=1e-6)


def test_optimizer_state_left_on_the_old_device_is_an_error_as_on_cuda():
    # CUDA does not move optimizer state either: Adam's exp_avg made on cpu meets a cuda
    # gradient and the step raises PyTorch's device-mismatch error. So does tpu.
    model = _mlp()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    model(torch.ones(2, 8)).sum().backward()
    opt.step()
    model.to("tpu")
    opt.zero_grad()
    model(torch.ones(2, 8, device="tpu")).sum().backward()
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        opt.step()


def test_move_keeps_parameter_objects_grads_hooks_and_ties():
    model = _mlp()
    tied = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4))
    tied[1].weight = tied[0].weight
    weight = model[0].weight
    weight.tag = "kept"
    calls = []
    weight.register_hook(lambda g: calls.append("hook"))
    weight.register_post_accumulate_grad_hook(lambda p: calls.append("post"))
    model(torch.ones(2, 8)).sum().backward()
    grad = weight.grad
    expected_grad = grad.clone()
    calls.clear()

    model.to("tpu")
    tied.to("tpu")
    assert model[0].weight is weight and weight.device.type == "tpu" and weight.tag == "kept"
    assert type(weight) is torch.nn.Parameter and weight.requires_grad and weight.is_leaf
    assert weight.grad is grad and grad.device.type == "tpu"
    torch.testing.assert_close(grad.cpu(), expected_grad)
    assert tied[0].weight is tied[1].weight and tied[1].weight.device.type == "tpu"
    model(torch.ones(2, 8, device="tpu")).sum().backward()
    assert calls == ["hook", "post"]
    torch.testing.assert_close(grad.cpu(), 2 * expected_grad)

    model.half()  # tpu -> tpu: PyTorch's own `param.data = ...` path
    assert model[0].weight is weight and weight.dtype == torch.float16 and weight.grad.dtype == torch.float16
    model.float().cpu()
    assert model[0].weight is weight and weight.device.type == "cpu" and weight.grad is grad
    torch.testing.assert_close(grad, 2 * expected_grad, rtol=1e-3, atol=1e-3)  # a float16 trip


def test_overwrite_flag_still_gives_new_parameters():
    # The user asked for new Parameter objects on conversion: cpu <-> cuda gives them too.
    model = _mlp()
    weight = model[0].weight
    torch.__future__.set_overwrite_module_params_on_conversion(True)
    try:
        model.to("tpu")
    finally:
        torch.__future__.set_overwrite_module_params_on_conversion(False)
    assert model[0].weight is not weight and weight.device.type == "cpu"
    assert model[0].weight.device.type == "tpu"


def test_model_compiled_before_the_move_trains_with_its_optimizer():
    # Dynamo keeps weak references to a compiled module's parameters; the objects stay
    # anyway (set_data between cpu and cuda changes them under weak references too).
    make = MOVING_OPTIMIZERS["adamw"]
    model = _mlp()
    expected = _train_moving(copy.deepcopy(model), ["cpu"] * 4, make)
    moved = copy.deepcopy(model)
    compiled = torch.compile(moved, backend="tpu")
    compiled(torch.ones(2, 8))
    opt = make(moved.parameters())
    got = _train_moving(moved, ["tpu"] * 4, make, opt=opt, forward=compiled)
    torch.testing.assert_close(torch.tensor(got), torch.tensor(expected), rtol=1e-4, atol=1e-6)


def test_a_parameter_that_cannot_keep_its_object_is_named_in_a_warning(caplog):
    model = _mlp()
    weight = model[0].weight
    row = weight[0]  # a view: a second reference to the parameter's tensor
    with caplog.at_level("WARNING", logger="torch_tpu"):
        model.to("tpu")
    assert model[0].weight is not weight and row.device.type == "cpu"
    assert model[2].weight.device.type == "tpu"
    messages = [r.getMessage() for r in caplog.records if "new Parameter objects" in r.getMessage()]
    assert len(messages) == 1 and "Linear.weight" in messages[0] and "test_device_training.py:" in messages[0]
    assert "1 parameter(s)" in messages[0]


# Foreach ops on tpu tensors (issue 28) run through their lowerings
# (compiler/lowering/foreach.py), the in-place ones as one plan writing the whole list.
def test_foreach_ops_on_device_tensors():
    generator = torch.Generator().manual_seed(2)
    a = [torch.randn(3, generator=generator), torch.randn(2, 2, generator=generator)]
    b = [torch.randn(3, generator=generator), torch.randn(2, 2, generator=generator)]
    ta, tb = [t.to("tpu") for t in a], [t.to("tpu") for t in b]

    def cpu(tensors):
        return [t.cpu() for t in tensors]

    torch.testing.assert_close(cpu(torch._foreach_add(ta, tb, alpha=2)), torch._foreach_add(a, b, alpha=2))
    torch.testing.assert_close(cpu(torch._foreach_norm(ta)), torch._foreach_norm(a))
    for tensors, others in ((ta, tb), (a, b)):
        torch._foreach_mul_(tensors, 3.0)
        torch._foreach_addcdiv_(tensors, others, [t.abs() + 1 for t in others], [0.5, 2.0])
        torch._foreach_lerp_(tensors, others, 0.25)
    assert all(t.device.type == "tpu" for t in ta)
    torch.testing.assert_close(cpu(ta), a)


@pytest.mark.strict_only("counts op-by-op launches and compiles (FUSED: test_device_fused's AdamW op count)")
def test_an_in_place_foreach_op_is_one_program_whatever_its_scalars():
    """`_foreach_addcdiv_(params, m, denom, step_sizes)` was one program per tensor
    (PyTorch's kernel, element by element): AdamW's foreach step recorded 148 FUSED ops
    for 21 parameters. Now it is one program, and its per-tensor scalars (Adam's bias
    corrections, new every step) are run-time operands: no compile per value."""
    from torch_tpu.runtime import get_client

    generator = torch.Generator().manual_seed(3)
    n = 150  # more scalars than the plan's check of its numbers once had stand-ins for
    a = [torch.randn(3, generator=generator) for _ in range(n)]
    b = [torch.randn(3, generator=generator) for _ in range(n)]
    ta, tb = [t.to("tpu") for t in a], [t.to("tpu") for t in b]
    torch._foreach_addcdiv_(ta, tb, tb, [0.5] * n)  # plans and compiles
    torch._foreach_addcdiv_(a, b, b, [0.5] * n)
    compiles = get_client().cache.stats.compiles
    before = torch.tpu.transfer_stats()
    for step in range(1, 4):
        torch._foreach_addcdiv_(ta, tb, tb, [0.1 * step + k / n for k in range(n)])
        torch._foreach_addcdiv_(a, b, b, [0.1 * step + k / n for k in range(n)])
    assert (torch.tpu.transfer_stats() - before).programs_executed == 3
    assert get_client().cache.stats.compiles == compiles
    torch.testing.assert_close([t.cpu() for t in ta], a)


def test_an_in_place_foreach_op_reading_what_it_writes_elsewhere_is_pytorchs():
    """`_foreach_add_([x, y], [y, x])`: PyTorch's kernel adds element by element, so its
    second element reads the `x` that the first wrote; one plan would read the old `x`.
    Such a call runs PyTorch's element-by-element kernel, and so does one with host
    scalars in a tensor; same-position aliasing (`_foreach_mul_(xs, xs)`) is one plan's."""
    generator = torch.Generator().manual_seed(4)
    c = [torch.randn(4, generator=generator), torch.randn(4, generator=generator)]
    tc = [t.to("tpu") for t in c]
    torch._foreach_add_(tc, [tc[1], tc[0]])
    torch._foreach_add_(c, [c[1], c[0]])
    torch._foreach_mul_(tc, tc)
    torch._foreach_mul_(c, c)
    torch._foreach_addcdiv_(tc, tc, tc, torch.tensor([0.5, 2.0]))
    torch._foreach_addcdiv_(c, c, c, torch.tensor([0.5, 2.0]))
    torch.testing.assert_close([t.cpu() for t in tc], c)
