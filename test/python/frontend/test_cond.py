"""`torch.cond` under torch.compile(backend="tpu"): the graph's `higher_order.cond` is lowered
to a `stablehlo.if` whose regions hold the two branch graphs (compiler/importer/fx_importer.py
`_lower_cond`); before, the whole cond ran in PyTorch eager inside the compiled graph.
Forward and backward (aot_autograd makes the backward a cond too), host and tpu tensors,
both branches, tuples of results, parameters the branches close over."""

import copy
import logging

import pytest
import torch
import torch.nn as nn

import torch_tpu.device  # noqa: F401 - registers the device where autoload is off


@pytest.fixture
def strict(monkeypatch):
    """TORCH_TPU_STRICT=1: a node falling back to PyTorch eager is an error."""
    monkeypatch.setenv("TORCH_TPU_STRICT", "1")


@pytest.fixture
def eager_fallbacks(caplog):
    caplog.set_level(logging.INFO, logger="torch_tpu")
    yield lambda: [r.getMessage() for r in caplog.records if "PyTorch eager" in r.getMessage()]


def _branchy(a, b):
    return torch.cond(a.sum() > 0, lambda a, b: (a * 2 + b).sin(), lambda a, b: a - b, (a, b))


@pytest.mark.parametrize("device", ["cpu", "tpu"])
@pytest.mark.parametrize("sign", [1.0, -1.0], ids=["true-branch", "false-branch"])
def test_cond_runs_the_branch_the_predicate_picks(device, sign, strict):
    torch._dynamo.reset()
    compiled = torch.compile(_branchy, backend="tpu", fullgraph=True)
    a, b = torch.full((3,), sign), torch.randn(3, generator=torch.Generator().manual_seed(0))
    got = compiled(a.to(device), b.to(device))
    assert got.device.type == device
    torch.testing.assert_close(got.cpu(), _branchy(a, b))


class _TwoConds(nn.Module):
    def __init__(self):
        super().__init__()
        self.first, self.second = nn.Linear(4, 4), nn.Linear(4, 4)

    def forward(self, x):
        y = torch.cond(x.mean() > 0, lambda x: self.first(x).tanh(), lambda x: self.second(x) * 2, (x,))
        return torch.cond(y.sum() > 1, lambda y: (y.sin(), y.cos()), lambda y: (y * 3, y + 1), (y,))


@pytest.mark.parametrize("shift", [1.0, -1.0])
def test_cond_trains_through_both_branches(shift, strict):
    """Parameters the branches close over become operands; the backward is a cond of the
    branches' backward graphs: outputs and every gradient equal eager CPU's."""
    torch.manual_seed(0)
    model = _TwoConds()
    on_device = copy.deepcopy(model).to("tpu")
    torch._dynamo.reset()
    compiled = torch.compile(on_device, backend="tpu", fullgraph=True)
    x = torch.randn(2, 4, generator=torch.Generator().manual_seed(1)) + shift
    want, got = model(x), compiled(x.to("tpu"))
    (want[0].square().sum() + want[1].sum()).backward()
    (got[0].square().sum() + got[1].sum()).backward()
    for w, g in zip(want, got):
        torch.testing.assert_close(g.detach().cpu(), w.detach(), atol=1e-6, rtol=1e-5)
    for (name, p), q in zip(model.named_parameters(), on_device.parameters()):
        assert p.grad is not None or q.grad is None, name
        if p.grad is not None:
            torch.testing.assert_close(q.grad.cpu(), p.grad, atol=1e-5, rtol=1e-5, msg=name)


def test_cond_with_an_op_without_lowering_runs_in_eager(eager_fallbacks):
    """A branch holding an op the importer cannot lower leaves the cond to PyTorch eager
    (the partitioner asks about every node of both branches), with the same values."""
    lib = torch.library.Library("tpu_cond_test", "FRAGMENT")
    lib.define("halve(Tensor x) -> Tensor")
    lib.impl("halve", lambda x: x / 2, "CompositeExplicitAutograd")
    halve = torch.ops.tpu_cond_test.halve.default

    def f(a):
        return torch.cond(a.sum() > 0, lambda a: halve(a) + 1, lambda a: a - 1, (a,))

    torch._dynamo.reset()
    a = torch.ones(3)
    torch.testing.assert_close(torch.compile(f, backend="tpu")(a), f(a))
    assert any("holds tpu_cond_test.halve.default, which has no lowering" in m for m in eager_fallbacks())
