"""Dynamo graphs that only take views of their inputs run as eager views, not as a program
(`backend/_view_graphs.py`): same values, the caller's storage shared as in eager, no
program launched, and no wait for a value that is still being computed."""

from __future__ import annotations

import pytest
import torch

from torch_tpu.backend._view_graphs import only_views
from torch_tpu.device import EagerMode, _fused, set_eager_mode
from torch_tpu.runtime import transfer_stats

VIEWS = {
    "detach": lambda x: x.detach(),
    "transpose": lambda x: x.t(),
    "reshape": lambda x: x.view(4, 3, 2),
    "slice": lambda x: x[1:, ::2],
    "split": lambda x: x.split(2, dim=1),
    "unbind": lambda x: x.unbind(0),
    "expand": lambda x: x[:1].expand(5, 6),
}


def _aten_graph(fn, x) -> torch.fx.GraphModule:
    from torch.fx.experimental.proxy_tensor import make_fx

    return make_fx(fn)(x)


@pytest.mark.parametrize("name", sorted(VIEWS))
def test_view_only_graphs_are_recognised(name):
    assert only_views(_aten_graph(VIEWS[name], torch.randn(4, 6)))


@pytest.mark.parametrize("fn", [lambda x: x + 1, lambda x: x.t().contiguous(), lambda x: x.add_(1).t(),
                                lambda x: x.clone()])
def test_graphs_that_compute_or_write_are_not(fn):
    assert not only_views(_aten_graph(fn, torch.randn(4, 6)))


def test_an_empty_graph_is_not_a_view_graph():
    assert not only_views(_aten_graph(lambda x: x, torch.randn(3)))


@pytest.mark.parametrize("name", sorted(VIEWS))
@pytest.mark.parametrize("device", ["cpu", "tpu"])
def test_a_compiled_view_is_eagers_view_and_runs_no_program(name, device):
    torch._dynamo.reset()
    fn = VIEWS[name]
    x = torch.randn(4, 6).to(device)
    compiled = torch.compile(fn, backend="tpu")
    compiled(x)  # compiles
    before = transfer_stats().programs_executed
    got, want = compiled(x), fn(x)
    assert transfer_stats().programs_executed == before
    for g, w in zip(*(v if isinstance(v, tuple) else (v,) for v in (got, want))):
        assert (g.shape, g.stride(), g.storage_offset()) == (w.shape, w.stride(), w.storage_offset())
        assert g.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
        torch.testing.assert_close(g.cpu(), w.cpu(), rtol=0, atol=0)


def test_a_compiled_view_of_a_pending_value_does_not_run_its_trace():
    torch._dynamo.reset()
    compiled = torch.compile(lambda t: t.detach(), backend="tpu")
    x = torch.randn(4, 6).to("tpu")
    with set_eager_mode(EagerMode.FUSED):
        compiled(x)  # compiles
        y = x * 2
        flushes = _fused.STATS["flushes"]
        view = compiled(y)
        assert _fused.STATS["flushes"] == flushes
        y.add_(1)  # the view shares y's storage, as in eager
        torch.testing.assert_close(view.cpu(), (x * 2 + 1).cpu())
