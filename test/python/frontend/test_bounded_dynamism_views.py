"""Outputs of a bounded-dynamic graph that are views of an input or of another output
(issue 30 item 8): equal to eager's views -- values, sizes, strides -- at every size, on
CPU and on tpu tensors.

aot_autograd rebuilds such outputs from their metadata after the call; the program's
results were views of padded buffers, so it reshaped the caller's input to the padded
shape ("setStorage: ... out of bounds"), or read the padded layout as eager's (a view of
an intermediate with a dynamic inner dim came back wrong, silently). `backend/_dynamic_alias.py`
returns each as eager's view, its metadata evaluated at the call's sizes."""

import pytest
import torch
import torch.fx.experimental._config as fx_config
from torch import nn

import torch_tpu
import torch_tpu.device  # noqa: F401 - registers the device where autoload is off
from torch_tpu.runtime import get_client

SIZES = [3, 5, 7]
BOUND = 16


@pytest.fixture(autouse=True)
def _fresh():
    torch._dynamo.reset()
    with fx_config.patch(backed_size_oblivious=True):
        yield
    torch._dynamo.reset()


class FlattenHead(nn.Module):
    """flatten of the module's dynamic-size input, returned beside a layer's output."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.proj = nn.Linear(12, 3)

    def forward(self, x):
        flat = torch.flatten(x, 1)
        return self.proj(flat), flat


def _broadcast(x, y):
    return torch.broadcast_tensors(x, y)


def _expand_as(x, y):
    return x.expand_as(y), y


def _chunk_unpacking(x):
    first, second = x.chunk(2, dim=-1)
    return second, first


def _views_of_an_intermediate(x):
    y = x * 2
    return y, y.t(), y[:, 1:]


# name -> (function, inputs at size n, dims marked dynamic as (input, dim))
CASES = {
    "broadcast_tensors": (_broadcast, lambda n: (torch.randn(n, 1), torch.randn(1, 4)), [(0, 0)]),
    "expand_as": (_expand_as, lambda n: (torch.randn(n, 1), torch.randn(n, 4)), [(0, 0), (1, 0)]),
    "flatten_of_module_input": (FlattenHead, lambda n: (torch.randn(n, 3, 4),), [(0, 0)]),
    "chunk_unpacking": (_chunk_unpacking, lambda n: (torch.randn(n, 2, 6),), [(0, 0)]),
    # A dynamic inner dim: the padded buffer interleaves padding between rows.
    "views_of_an_intermediate": (_views_of_an_intermediate, lambda n: (torch.randn(4, n),), [(0, 1)]),
}


@pytest.mark.parametrize("device", ["cpu", "tpu"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_view_outputs_equal_eager(case, device):
    make_fn, make_inputs, marks = CASES[case]
    fn = make_fn() if isinstance(make_fn, type) else make_fn
    eager_fn = fn
    if isinstance(fn, nn.Module):
        eager_fn, fn = fn, make_fn().to(device)
    compiled = torch.compile(fn, backend="tpu")
    compiles = get_client().cache.stats.compiles
    for i, n in enumerate(SIZES):
        torch.manual_seed(n)
        inputs = make_inputs(n)
        args = [a.to(device) for a in inputs]
        for index, dim in marks:
            torch_tpu.mark_dynamic(args[index], dim, max=BOUND)
        with torch.no_grad():
            expected = eager_fn(*inputs)
            actual = compiled(*args)
        assert len(actual) == len(expected)
        for a, e in zip(actual, expected):
            assert a.device.type == device
            assert (a.shape, a.stride()) == (e.shape, e.stride())
            torch.testing.assert_close(a.cpu(), e)
        if i == 0:
            compiles = get_client().cache.stats.compiles
    if device == "cpu":  # (on tpu the device's own small programs compile per size)
        assert get_client().cache.stats.compiles == compiles, "a later size compiled the graph again"


def test_views_of_an_input_train_like_eager():
    def fn(x, y):
        a, b = torch.broadcast_tensors(x, y)
        return a, b, x.expand_as(y)

    compiled = torch.compile(fn, backend="tpu")
    for n in SIZES:
        torch.manual_seed(n)
        x0, y0 = torch.randn(n, 1), torch.randn(n, 4)
        x, y = x0.to("tpu").requires_grad_(), y0.to("tpu").requires_grad_()
        torch_tpu.mark_dynamic(x, 0, max=BOUND)
        torch_tpu.mark_dynamic(y, 0, max=BOUND)
        xe, ye = x0.clone().requires_grad_(), y0.clone().requires_grad_()
        expected, actual = fn(xe, ye), compiled(x, y)
        sum((o * (k + 1)).sum() for k, o in enumerate(expected)).backward()
        sum((o * (k + 1)).sum() for k, o in enumerate(actual)).backward()
        for a, e in zip(actual, expected):
            torch.testing.assert_close(a.detach().cpu(), e.detach())
        torch.testing.assert_close(x.grad.cpu(), xe.grad)
        torch.testing.assert_close(y.grad.cpu(), ye.grad)
