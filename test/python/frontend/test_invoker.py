"""The invoker (`torch_tpu.program.invoker`): argument plans (module state held on the device and
never served stale), DeviceBuffer pass-through, output plans, and the dump on error that
compiled graphs and the views path share."""

from __future__ import annotations

import collections

import pytest
import torch

from torch_tpu.program import invoker as program_invoker
from torch_tpu.program.invoker import RESIDENT_PARAMETERS, Invoker, OutputPlan
from torch_tpu.runtime import DeviceBuffer, get_client


@pytest.fixture
def uploads(monkeypatch):
    """Every tensor the resident cache uploads (a cache hit is not an upload)."""
    seen: list[torch.Tensor] = []
    real = RESIDENT_PARAMETERS.get

    def counting(tensor, client):
        entry = RESIDENT_PARAMETERS._entries.get(id(tensor))
        buffer = real(tensor, client)
        if entry is None or entry[-1] is not buffer:
            seen.append(tensor)
        return buffer

    monkeypatch.setattr(RESIDENT_PARAMETERS, "get", counting)
    return seen


def test_module_buffers_are_resident_and_updates_are_seen(uploads):
    torch._dynamo.reset()
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.BatchNorm1d(8)).eval()
    with torch.no_grad():
        model[1].running_mean.normal_()
        model[1].running_var.uniform_(0.5, 2.0)
    compiled = torch.compile(model, backend="tpu")
    x = torch.randn(5, 6)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x))
        # weight, bias, BN weight, bias, running_mean, running_var (num_batches_tracked is
        # unused in eval mode and not an input)
        first = len(uploads)
        assert {id(t) for t in uploads} >= {id(model[1].running_mean), id(model[1].running_var)}
        torch.testing.assert_close(compiled(x), model(x))
        assert len(uploads) == first  # unchanged state: served from the device

        model[1].running_mean.add_(3.0)  # a buffer updated in place: its _version changes
        torch.testing.assert_close(compiled(x), model(x))
        assert len(uploads) == first + 1

        model[0].weight.mul_(-1.0)  # a parameter updated in place
        torch.testing.assert_close(compiled(x), model(x))
        assert len(uploads) == first + 2


def test_a_new_tensor_object_in_a_parameters_place_is_seen():
    torch._dynamo.reset()
    model = torch.nn.Linear(4, 3)
    compiled = torch.compile(model, backend="tpu")
    x = torch.randn(2, 4)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x))
        model.weight = torch.nn.Parameter(torch.randn(3, 4))  # a new object (Dynamo may recompile)
        torch.testing.assert_close(compiled(x), model(x))
        model.weight.data = torch.randn(3, 4)  # same object, new storage
        torch.testing.assert_close(compiled(x), model(x))
        del model.bias  # a plain tensor attribute instead of a Parameter
        model.bias = torch.randn(3)
        torch.testing.assert_close(compiled(x), model(x))


def test_dtype_and_shape_changes_recompile():
    torch._dynamo.reset()
    model = torch.nn.Linear(4, 3)
    compiled = torch.compile(model, backend="tpu", dynamic=False)
    with torch.no_grad():
        x = torch.randn(2, 4)
        torch.testing.assert_close(compiled(x), model(x))
        x5 = torch.randn(5, 4)
        torch.testing.assert_close(compiled(x5), model(x5))
        model.double()  # parameters replaced by float64 tensors
        xd = torch.randn(2, 4, dtype=torch.float64)
        out = compiled(xd)
        assert out.dtype == torch.float64
        torch.testing.assert_close(out, model(xd))


def test_effect_tokens_and_python_scalars_follow_the_plan():
    specs = [_Spec((2,), torch.float32), _Spec((), torch.float32), _Spec((0,), torch.float32)]
    plan = program_invoker.ArgumentPlan(specs, get_client())
    x = torch.randn(2)
    first = plan([x, 2.5, None])
    assert first[0] is x  # a plain tensor passes through untouched
    assert first[1].dtype == torch.float32 and first[1].item() == 2.5
    assert first[2].shape == (0,)
    second = plan([x, -1.0, None])
    assert second[1].item() == -1.0  # a scalar is a run-time value, never baked in
    assert second[2] is first[2]  # one token tensor for every call


def test_written_parameters_are_never_resident():
    spec = _Spec((3,), torch.float32)
    plan = program_invoker.ArgumentPlan([spec, spec], get_client(), resident=[0, 1], written=[1])
    p, q = torch.nn.Parameter(torch.randn(3)), torch.nn.Parameter(torch.randn(3))
    resident, written = plan([p, q])
    assert isinstance(resident, DeviceBuffer)
    assert isinstance(written, torch.Tensor) and not isinstance(written, torch.nn.Parameter)
    assert not written.requires_grad


def test_device_buffers_pass_through_and_come_back_as_buffers():
    client = get_client()
    exe = client.compile(_ADD_MUL, name="add_mul")
    specs = [_Spec((4,), torch.float32), _Spec((4,), torch.float32)]
    invoker = Invoker(exe, specs)
    a, b = torch.randn(4), torch.randn(4)
    a_buf = client.to_device(a)
    outs = invoker.buffers(a_buf, b)  # a buffer and a host tensor in one call
    assert all(isinstance(o, DeviceBuffer) for o in outs)
    torch.testing.assert_close(outs[0].to_torch(), (a + b) * b)
    # An output buffer feeds the next call without a host round trip.
    again = invoker.buffers(outs[0], client.to_device(b))
    torch.testing.assert_close(again[0].to_torch(), ((a + b) * b + b) * b)
    [host] = invoker(a, b)
    assert isinstance(host, torch.Tensor)
    torch.testing.assert_close(host, (a + b) * b)


def test_plain_arguments_skip_the_plan_after_the_first_call(monkeypatch):
    """The eager device's hot path: once a call's arguments all pass through untouched,
    later calls go straight to the executable; a plan with steps keeps running them."""
    client = get_client()
    exe = client.compile(_ADD_MUL, name="add_mul")
    specs = [_Spec((4,), torch.float32), _Spec((4,), torch.float32)]
    direct = Invoker(exe, specs)
    a, b = torch.randn(4), torch.randn(4)
    direct.buffers(client.to_device(a), client.to_device(b))
    monkeypatch.setattr(program_invoker.ArgumentPlan, "__call__", lambda self, args: pytest.fail("planned again"))
    torch.testing.assert_close(direct.buffers(client.to_device(a), client.to_device(b))[0].to_torch(), (a + b) * b)
    monkeypatch.undo()
    # Host tensors: after the first call, `invoker(...)` is the executable's call itself.
    [first] = direct(a, b)
    monkeypatch.setattr(program_invoker.ArgumentPlan, "__call__", lambda self, args: pytest.fail("planned again"))
    monkeypatch.setattr(program_invoker.Invoker, "run", lambda self, arguments: pytest.fail("ran through the plan"))
    [again] = direct(b, a)
    torch.testing.assert_close(first, (a + b) * b)
    torch.testing.assert_close(again, (b + a) * a)
    monkeypatch.undo()
    # A parameter is a step (resident upload): the plan runs on every call.
    stepped = Invoker(exe, specs)
    p = torch.nn.Parameter(torch.randn(4))
    stepped(p, b)
    with torch.no_grad():
        p.add_(1.0)  # a new version: the plan must upload it again
    [out] = stepped(p, b)
    torch.testing.assert_close(out, (p.detach() + b) * b)


def test_output_plan_rebuilds_structures_and_constants():
    import torch.utils._pytree as pytree

    out = collections.namedtuple("Out", "y z")
    _, flat_tree = pytree.tree_flatten((1, 2))
    direct = OutputPlan([_OutSpec("tensor", 0), _OutSpec("tensor", 1)], flat_tree)
    r = [torch.ones(1), torch.zeros(1)]
    assert direct(r) == tuple(r)
    _, nested = pytree.tree_flatten({"a": 1, "b": out(2, 3)})
    plan = OutputPlan([_OutSpec("tensor", 1), _OutSpec("constant", None, 7), _OutSpec("tensor", 0)], nested)
    got = plan(r)
    assert got["a"] is r[1] and got["b"].y == 7 and got["b"].z is r[0]


def test_compiled_functions_return_their_structures():
    torch._dynamo.reset()

    def f(x):
        return {"sum": x + 1, "pair": (x * 2, x.t())}

    x = torch.randn(3, 2)
    got = torch.compile(f, backend="tpu")(x)
    want = f(x)
    torch.testing.assert_close(got, want)
    assert got["pair"][1].stride() == want["pair"][1].stride()  # eager's layout


@pytest.mark.parametrize("functionalize", ["aot_autograd", "torchtpu"])
def test_an_import_failure_is_dumped_with_its_error(tmp_path, monkeypatch, functionalize):
    from torch_tpu.compiler.lowering import LoweringError
    from torch_tpu.compiler.lowering.registry import LOWERINGS, Lowering

    def rule(ctx, x):
        raise LoweringError("test: this lowering rejects every call")

    sin = torch.ops.aten.sin.default
    monkeypatch.setitem(LOWERINGS, sin, Lowering(sin, rule, "test", padding=LOWERINGS[sin].padding))
    monkeypatch.setenv("TORCH_TPU_DUMP_DIR", str(tmp_path))
    torch._dynamo.reset()

    def f(t):
        return torch.sin(t) + 1

    x = torch.randn(4)
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(f, backend="tpu", options={"functionalize": functionalize})(x), f(x))
    errors = [d / "error.txt" for d in tmp_path.iterdir() if (d / "error.txt").exists()]
    if functionalize == "torchtpu":  # the views path's own attempt (then aot_autograd's)
        errors = [e for e in errors if e.parent.name.endswith("-views")]
    assert errors, [p.name for p in tmp_path.iterdir()]
    text = errors[0].read_text()
    assert text.startswith("importing the graph failed")
    assert "this lowering rejects every call" in text and "aten.sin" in text
    assert (errors[0].parent / "fx_graph.py").exists()


class _Spec:
    def __init__(self, shape, dtype, name="arg") -> None:
        self.shape, self.dtype, self.name, self.role = shape, dtype, name, "input"


class _OutSpec:
    def __init__(self, kind, index, value=None) -> None:
        self.kind, self.index, self.value = kind, index, value


_ADD_MUL = """
module @add_mul {
  func.func public @main(%a: tensor<4xf32>, %b: tensor<4xf32>) -> tensor<4xf32> {
    %0 = stablehlo.add %a, %b : tensor<4xf32>
    %1 = stablehlo.multiply %0, %b : tensor<4xf32>
    return %1 : tensor<4xf32>
  }
}
"""


# -- inference graphs called without aot_autograd's runtime wrappers ---------------------------


def _compile_recording(fn):
    """torch.compile(fn, backend="tpu"), and the list of what the backend returned."""
    from torch_tpu.backend import tpu_backend

    returned = []

    def backend(gm, example_inputs):
        compiled = tpu_backend(gm, example_inputs)
        returned.append(getattr(compiled, "__wrapped__", compiled))
        return compiled

    torch._dynamo.reset()
    return torch.compile(fn, backend=backend), returned


def test_a_plain_inference_graph_is_called_directly():
    from torch_tpu.backend._invoker import PrecisionKeyed

    compiled, returned = _compile_recording(lambda x, w: (torch.relu(x @ w), x.sum()))
    x, w = torch.randn(3, 4), torch.randn(4, 5)
    with torch.no_grad():
        got = compiled(x, w)
    assert [type(r) for r in returned] == [PrecisionKeyed]
    torch.testing.assert_close(got, (torch.relu(x @ w), x.sum()))
    assert not any(t.requires_grad for t in got)


@pytest.mark.parametrize("case", ["mutates_input", "view_of_input"])
def test_graphs_needing_the_wrappers_keep_them(case):
    from torch_tpu.backend._invoker import PrecisionKeyed

    def mutates_input(x):
        x.mul_(2)
        return x + 1

    def view_of_input(x):
        return x.view(-1), x + 1

    fn = {"mutates_input": mutates_input, "view_of_input": view_of_input}[case]
    compiled, returned = _compile_recording(fn)
    x = torch.randn(2, 3)
    expected_x = x.clone()
    with torch.no_grad():
        got = compiled(x)
        want = fn(expected_x)
    assert returned and not isinstance(returned[0], PrecisionKeyed)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(x, expected_x)  # the mutation reached the caller's tensor
    if case == "view_of_input":
        assert got[0].untyped_storage().data_ptr() == x.untyped_storage().data_ptr()


def test_training_graphs_keep_the_wrappers_and_backpropagate():
    from torch_tpu.backend._invoker import PrecisionKeyed

    model = torch.nn.Linear(4, 2)
    compiled, returned = _compile_recording(model)
    x = torch.randn(3, 4)
    compiled(x).sum().backward()
    assert returned and not isinstance(returned[0], PrecisionKeyed)
    grad = model.weight.grad.clone()
    model.weight.grad = None
    model(x).sum().backward()
    torch.testing.assert_close(grad, model.weight.grad)
