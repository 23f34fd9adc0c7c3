"""`torch.compile(model, backend="tpu")` on eager tpu tensors (issue 13 item 8): the
graph takes the tensors' device buffers (no host round trip), returns tpu tensors, and
keeps no host-side copy of parameters on the device."""

import copy

import pytest
import torch

import torch_tpu.device  # noqa: F401 - registers the device where autoload is off
from torch_tpu.program.invoker import RESIDENT_PARAMETERS
from torch_tpu.device import _storage
from runtime.buffer import DeviceBuffer


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.fixture
def no_host_reads(monkeypatch):
    """Fails any read of a device value on the host while the test body runs (the
    device's read path, and a DeviceBuffer's own); `allow()` ends the ban."""

    def fail(*_args, **_kwargs):
        raise AssertionError("a tpu value was read on the host inside the compiled call")

    monkeypatch.setattr(_storage, "storage_to_host", fail)
    monkeypatch.setattr(DeviceBuffer, "to_torch", fail)
    return monkeypatch.undo


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(6, 16), torch.nn.BatchNorm1d(16), torch.nn.ReLU(), torch.nn.Linear(16, 3)
    )


def test_forward_on_device_buffers(no_host_reads):
    model = _model().eval()
    on_tpu = copy.deepcopy(model).to("tpu")
    resident_before = len(RESIDENT_PARAMETERS)
    compiled = torch.compile(on_tpu, backend="tpu")
    x = torch.randn(5, 6)
    with torch.no_grad():
        out = compiled(x.to("tpu"))
        again = compiled(x.to("tpu") * 2)
    no_host_reads()
    assert out.device.type == "tpu" and again.device.type == "tpu"
    # Parameters on the device are device buffers: no host-side resident copy.
    assert len(RESIDENT_PARAMETERS) == resident_before
    with torch.no_grad():
        torch.testing.assert_close(out.cpu(), model(x))
        torch.testing.assert_close(again.cpu(), model(x * 2))


@pytest.mark.parametrize("compile_step", [False, True], ids=["eager_step", "compiled_step"])
def test_training_step_equals_cpu(no_host_reads, compile_step):
    model = _model()
    on_tpu = copy.deepcopy(model).to("tpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    opt_tpu = torch.optim.SGD(on_tpu.parameters(), lr=0.1, momentum=0.9)
    compiled = torch.compile(on_tpu, backend="tpu")
    step = torch.compile(opt_tpu.step, backend="tpu") if compile_step else opt_tpu.step
    gen = torch.Generator().manual_seed(1)
    batches = [(torch.randn(8, 6, generator=gen), torch.randn(8, 3, generator=gen)) for _ in range(3)]
    losses = []
    for x, y in batches:
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        loss_tpu = torch.nn.functional.mse_loss(compiled(x.to("tpu")), y.to("tpu"))
        opt_tpu.zero_grad()
        loss_tpu.backward()
        step()
        losses.append((loss.detach(), loss_tpu.detach()))
    no_host_reads()
    for loss, loss_tpu in losses:
        assert loss_tpu.device.type == "tpu"
        torch.testing.assert_close(loss_tpu.cpu(), loss)
    for p, p_tpu in zip(model.parameters(), on_tpu.parameters()):
        assert p_tpu.device.type == "tpu"
        torch.testing.assert_close(p_tpu.cpu(), p.detach())
    # Written inputs (BatchNorm's running stats) are rebound on the device.
    bn, bn_tpu = model[1], on_tpu[1]
    torch.testing.assert_close(bn_tpu.running_mean.cpu(), bn.running_mean)
    torch.testing.assert_close(bn_tpu.running_var.cpu(), bn.running_var)
    assert int(bn_tpu.num_batches_tracked.cpu()) == 3


def test_view_inputs_read_on_device(no_host_reads):
    """Offsets, strides and transposes of a storage are read by the device's read path."""
    base = torch.randn(6, 8)
    on_tpu = base.to("tpu")
    fn = torch.compile(lambda a, b: a * 2 + b.sin(), backend="tpu")
    out = fn(on_tpu[1:5:2, ::3], on_tpu.t()[2:5, :2].t())
    no_host_reads()
    assert out.device.type == "tpu"
    torch.testing.assert_close(out.cpu(), base[1:5:2, ::3] * 2 + base.t()[2:5, :2].t().sin())


@pytest.mark.parametrize("mode", ["STRICT", "FUSED"])
def test_contiguous_view_at_an_offset_after_a_dense_call(mode):
    """A contiguous view at a nonzero storage offset has the sizes and strides of the dense
    tensor the graph first took, so Dynamo reuses the graph; the device's fast paths
    (Strict's and FUSED's recording: a table hit on the data pointer, the storage's shape)
    must read it at its offset, not from its storage's start."""
    from torch_tpu.device import EagerMode, set_eager_mode

    base = torch.randn(5, 4)
    on_tpu = base.to("tpu")
    dense = torch.randn(4, 4)
    fn = torch.compile(lambda a: a * 2 + 1, backend="tpu")
    with set_eager_mode(getattr(EagerMode, mode)):
        first = fn(dense.to("tpu"))
        shifted = on_tpu[1:]  # rows 1..4: offset 4, contiguous, shape (4, 4)
        assert shifted.storage_offset() == 4 and shifted.is_contiguous()
        out = fn(shifted)
        torch.testing.assert_close(first.cpu(), dense * 2 + 1)
        torch.testing.assert_close(out.cpu(), base[1:] * 2 + 1)


def test_cpu_outputs_stay_on_cpu():
    """A CPU tensor no op combines with a tpu one keeps its device, as in eager."""
    fn = torch.compile(lambda a, i: (a + 1, i * 2), backend="tpu")
    a = torch.randn(3)
    out, idx = fn(a.to("tpu"), torch.arange(3))
    assert out.device.type == "tpu" and idx.device.type == "cpu"
    torch.testing.assert_close(out.cpu(), a + 1)
    torch.testing.assert_close(idx, torch.arange(3) * 2)


def test_mixed_devices_raise_pytorch_error():
    fn = torch.compile(lambda a, b: a + b, backend="tpu")
    with pytest.raises(Exception, match="device"):
        fn(torch.randn(3), torch.randn(3).to("tpu"))


def test_in_place_graph_rebinds_inputs(no_host_reads):
    """functionalize="torchtpu": inputs written in place are updated on the device."""

    def fn(x, y):
        x.add_(y)
        x[0].mul_(2)
        return x.sum()

    a, b = torch.randn(3, 4), torch.randn(3, 4)
    a_tpu, b_tpu = a.to("tpu"), b.to("tpu")
    compiled = torch.compile(fn, backend="tpu", options={"functionalize": "torchtpu"})
    with torch.no_grad():
        out = compiled(a_tpu, b_tpu)
        expected = fn(a, b)
    no_host_reads()
    assert out.device.type == "tpu"
    torch.testing.assert_close(out.cpu(), expected)
    torch.testing.assert_close(a_tpu.cpu(), a)


def test_dynamic_sizes_stay_on_device():
    compiled = torch.compile(lambda x: (x * 2).sum(0), backend="tpu", dynamic=True)
    for rows in (3, 5, 40):
        x = torch.randn(rows, 4)
        out = compiled(x.to("tpu"))
        assert out.device.type == "tpu"
        torch.testing.assert_close(out.cpu(), (x * 2).sum(0))


def test_graph_creating_tpu_tensors():
    """A graph whose only tpu tensors are made inside it returns them on the device."""
    compiled = torch.compile(lambda n: torch.arange(n, device="tpu") * 2.0, backend="tpu")
    out = compiled(5)
    assert out.device.type == "tpu"
    torch.testing.assert_close(out.cpu(), torch.arange(5) * 2.0)


def test_cpu_scalar_argument_is_read_when_the_compiled_graph_is_called():
    # The graph runs asynchronously on tpu tensors: a 0-d CPU tensor argument (a learning
    # rate a scheduler updates in place) is read at the call, as PyTorch reads it.
    def f(x, s):
        return torch.tanh(x @ x) * s

    x = torch.randn(256, 256).to("tpu") / 16
    compiled = torch.compile(f, backend="tpu")
    expected = f(x.cpu(), torch.tensor(2.0))
    s = torch.tensor(2.0)
    compiled(x, s)
    results = []
    for _ in range(3):
        results.append(compiled(x, s))
        s.fill_(100.0)  # right after the call returned, before the program ran
        s = torch.tensor(2.0)
    for y in results:
        torch.testing.assert_close(y.cpu(), expected, rtol=1e-4, atol=1e-4)
