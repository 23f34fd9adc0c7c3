"""torch_tpu.jax_op (issue 16 part 1): a JAX function as the custom op torch_tpu::<name>,
on CPU tensors (through the runtime), on eager tpu tensors (through the lowering table),
inside torch.compile without a graph break or fallback, and under autograd. Every
result is compared with the same math in PyTorch eager on CPU."""

import os
import subprocess
import sys
import textwrap

import pytest
import torch

import torch_tpu
import torch_tpu.device  # noqa: F401 - registers the device where autoload is off
from torch_tpu import JaxOpError, jax_op
from torch_tpu.device import _ops

jax = pytest.importorskip("jax")
jnp = jax.numpy

# Defined once, at module level, as the docs ask.
SINE_MATMUL = jax_op("test_sine_matmul", lambda x, y: (jnp.sin(x) @ y, x.sum()))
SOFTMAX = jax_op("test_softmax", lambda x: jax.nn.softmax(x, axis=-1))
STATS = jax_op("test_stats", lambda x, n: (x.sum(axis=0) + n, jnp.argmax(x, axis=-1), x > 0))


def _reference(x, y):
    return torch.sin(x) @ y, x.sum()


def _close(a, b, **tol):
    torch.testing.assert_close(a, b, **({"rtol": 1e-5, "atol": 1e-5} | tol))


# -- CPU tensors -------------------------------------------------------------------------------
def test_cpu_two_results():
    x, y = torch.randn(4, 8), torch.randn(8, 3)
    out = SINE_MATMUL(x, y)
    assert isinstance(out, tuple) and len(out) == 2
    for got, want in zip(out, _reference(x, y)):
        assert got.device.type == "cpu"
        _close(got, want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cpu_single_result_and_non_contiguous_input(dtype):
    x = torch.randn(8, 6, dtype=dtype).t()  # a transposed view
    out = SOFTMAX(x)
    assert isinstance(out, torch.Tensor) and out.dtype == dtype
    _close(out, torch.softmax(x, -1), **({"rtol": 2e-2, "atol": 1e-2} if dtype == torch.bfloat16 else {}))


def test_cpu_integer_and_bool_results_and_int64_input():
    # int64 inputs turn jax's x64 on for the trace: nothing is truncated to 32 bits.
    x = torch.randn(5, 4, dtype=torch.float64)
    n = torch.tensor([2**40, 1, 2, 3], dtype=torch.int64)
    total, arg, pos = STATS(x, n)
    assert total.dtype == torch.float64 and arg.dtype == torch.int64 and pos.dtype == torch.bool
    _close(total, x.sum(0) + n)
    assert torch.equal(arg, x.argmax(-1)) and torch.equal(pos, x > 0)


def test_trace_is_cached_per_signature():
    calls = []

    def double(x):
        calls.append(x.shape)
        return x * 2

    op = jax_op("test_cached_double", double)
    for _ in range(3):
        _close(op(torch.ones(3)), torch.full((3,), 2.0))
    _close(op(torch.ones(2, 2)), torch.full((2, 2), 2.0))
    assert calls == [(3,), (2, 2)]


def test_trace_follows_the_float32_matmul_precision():
    # A Pallas kernel's dots are compiled inside the kernel (Mosaic), out of reach of any
    # later pass: the precision mode must be in effect while jax traces the function.
    op = jax_op("test_precision_matmul", lambda x, y: x @ y)
    from torch_tpu.kernels._jax_trace import ArraySpec

    specs = tuple(ArraySpec.of(t) for t in (torch.ones(2, 2), torch.ones(2, 2)))
    seen = {}
    for mode, jax_name in (("highest", "HIGHEST"), ("high", "HIGH"), ("medium", "DEFAULT")):
        with torch_tpu.precision(mode):
            seen[mode] = op.traced(specs)
        assert f"precision = [{jax_name}, {jax_name}]" in seen[mode].stablehlo, mode
    assert len({t.digest for t in seen.values()}) == 3  # one lowering (and compile key) per mode


# -- eager tpu tensors ------------------------------------------------------------------------
def test_tpu_runs_through_the_lowering_table():
    x, y = torch.randn(4, 8), torch.randn(8, 3)
    out = SINE_MATMUL(x.to("tpu")[:, :], y.to("tpu"))
    for got, want in zip(out, _reference(x, y)):
        assert got.device.type == "tpu"
        _close(got.cpu(), want)
    plans = [plan for key, plan in _ops._PLANS.items() if key[0] == SINE_MATMUL.op]
    assert plans and all(isinstance(p, _ops.Plan) for p in plans), "the op fell back to the CPU"


def test_tpu_strided_view_input():
    x = torch.randn(6, 10)
    out = SOFTMAX(x.to("tpu")[1:, ::2])
    _close(out.cpu(), torch.softmax(x[1:, ::2], -1))


def test_tpu_autograd():
    x = torch.randn(4, 8)
    xt = x.to("tpu").requires_grad_()
    SOFTMAX(xt).pow(2).sum().backward()
    xr = x.clone().requires_grad_()
    torch.softmax(xr, -1).pow(2).sum().backward()
    assert xt.grad.device.type == "tpu"
    _close(xt.grad.cpu(), xr.grad)


# -- torch.compile ----------------------------------------------------------------------------
def _model(x, y):
    a, b = SINE_MATMUL(x * 2, y)
    return SOFTMAX(a) * b


def _model_reference(x, y):
    a, b = _reference(x * 2, y)
    return torch.softmax(a, -1) * b


def test_compiled_without_graph_break_or_fallback(monkeypatch):
    monkeypatch.setenv("TORCH_TPU_STRICT", "1")  # a fallback would raise
    x, y = torch.randn(4, 8), torch.randn(8, 3)
    explanation = torch._dynamo.explain(_model)(x, y)
    assert explanation.graph_break_count == 0, explanation.break_reasons
    torch._dynamo.reset()
    _close(torch.compile(_model, backend="tpu")(x, y), _model_reference(x, y))


def test_compiled_autograd(monkeypatch):
    monkeypatch.setenv("TORCH_TPU_STRICT", "1")
    x, y = torch.randn(4, 8), torch.randn(8, 3)
    xs, ys = x.clone().requires_grad_(), y.clone().requires_grad_()
    torch.compile(_model, backend="tpu")(xs, ys).sum().backward()
    xr, yr = x.clone().requires_grad_(), y.clone().requires_grad_()
    _model_reference(xr, yr).sum().backward()
    _close(xs.grad, xr.grad, rtol=1e-4, atol=1e-4)
    _close(ys.grad, yr.grad, rtol=1e-4, atol=1e-4)


def test_compiled_on_tpu_tensors():
    x, y = torch.randn(4, 8), torch.randn(8, 3)
    out = torch.compile(_model, backend="tpu")(x.to("tpu"), y.to("tpu"))
    assert out.device.type == "tpu"
    _close(out.cpu(), _model_reference(x, y))


# -- a backward given by the user -------------------------------------------------------------
def test_register_autograd_replaces_vjp():
    op = jax_op("test_user_backward", lambda x: jnp.tanh(x))
    seen = []

    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(output)

    def backward(ctx, grad):
        (y,) = ctx.saved_tensors
        seen.append(True)
        return grad * (1 - y * y) * 10  # 10x: shows this backward ran, not jax.vjp's

    op.register_autograd(backward, setup_context=setup_context)
    x = torch.randn(5, requires_grad=True)
    op(x).sum().backward()
    assert seen == [True]
    _close(x.grad, (1 - torch.tanh(x.detach()) ** 2) * 10)


def test_integer_inputs_get_no_gradient():
    op = jax_op("test_gather_rows", lambda x, i: x[i] * 3)
    x = torch.randn(5, 2, requires_grad=True)
    i = torch.tensor([4, 0, 4])
    op(x, i).sum().backward()
    want = torch.zeros(5, 2)
    want[0] = 3
    want[4] = 6
    _close(x.grad, want)


# -- errors -----------------------------------------------------------------------------------
def _fails_to_trace(x):
    return x @ jnp.ones((3, 3))  # x is (4, 5): the shapes do not fit


FAILING = jax_op("test_fails_to_trace", _fails_to_trace)
_FAILING_LINE = _fails_to_trace.__code__.co_firstlineno + 1


def test_trace_error_names_op_and_user_line():
    with pytest.raises(JaxOpError) as info:
        FAILING(torch.randn(4, 5))
    message = str(info.value)
    assert "jax_op 'test_fails_to_trace'" in message
    assert f"test_jax_op.py:{_FAILING_LINE}" in message
    assert "float32[4,5]" in message


def test_trace_error_inside_compile_names_op_and_user_line():
    with pytest.raises(Exception) as info:
        torch.compile(lambda x: FAILING(x) + 1, backend="tpu")(torch.randn(4, 5))
    message = str(info.value)
    assert "jax_op 'test_fails_to_trace'" in message and f"test_jax_op.py:{_FAILING_LINE}" in message


def test_definition_errors():
    assert jax_op("test_softmax", SOFTMAX.fn) is SOFTMAX  # same function: the same op
    with pytest.raises(JaxOpError, match="'test_softmax' is already defined .*module level"):
        jax_op("test_softmax", lambda x: x)
    with pytest.raises(ValueError, match="not a valid op name"):
        jax_op("has space", lambda x: x)
    with pytest.raises(JaxOpError, match="argument 1 is a float, not a tensor.*functools.partial"):
        SOFTMAX(torch.ones(2), 0.5)


def test_nested_result_is_rejected():
    op = jax_op("test_nested", lambda x: (x, (x, x)))
    with pytest.raises(JaxOpError, match="nested structure"):
        op(torch.ones(2))


# -- process-level facts ----------------------------------------------------------------------
def _run(script: str, env: dict | None = None) -> str:
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], capture_output=True, text=True,
                            env={**os.environ, **(env or {})}, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def test_jax_is_imported_only_when_a_jax_op_is_called():
    out = _run("""
        import sys, torch, torch_tpu
        op = torch_tpu.jax_op("lazy", lambda x: x + 1)
        import torch_tpu.kernels
        # Neither jax nor the lowering table (seconds to import) at definition time.
        print("jax" in sys.modules, "torch_tpu.compiler.lowering" in sys.modules)
        op(torch.ones(2))
        print("jax" in sys.modules)
    """)
    assert out.split() == ["False", "False", "True"]


def test_compile_caches_key_by_the_function_not_the_name(tmp_path):
    """Two processes define an op of the same name with different functions and share
    the L2 compile cache: the second must not run the first one's executable (compiled
    graph, eager tpu plan)."""
    script = """
        import sys, torch, torch_tpu, torch_tpu.device, jax.numpy as jnp
        fn = {"sin": jnp.sin, "cos": jnp.cos}[sys.argv[1]]
        op = torch_tpu.jax_op("same_name", lambda x: fn(x))
        x = torch.linspace(0, 1, 8)
        compiled = torch.compile(lambda x: op(x) * 2, backend="tpu")(x)
        eager = op(x.to("tpu")).cpu()
        print(float((compiled - 2 * getattr(torch, sys.argv[1])(x)).abs().max()),
              float((eager - getattr(torch, sys.argv[1])(x)).abs().max()))
    """
    env = {"TORCH_TPU_CACHE_L2": "1", "TORCH_TPU_CACHE_DIR": str(tmp_path)}
    for which in ("sin", "cos"):
        result = subprocess.run([sys.executable, "-c", textwrap.dedent(script), which], capture_output=True,
                                text=True, env={**os.environ, **env}, timeout=300)
        assert result.returncode == 0, result.stderr[-3000:]
        errors = [float(v) for v in result.stdout.split()]
        assert max(errors) < 1e-5, (which, errors)


def test_export_keeps_the_merged_function():
    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(8, 8)

        def forward(self, x):
            return SOFTMAX(self.linear(x))

    model, x = Model(), torch.randn(4, 8)
    exported = torch_tpu.export(model, (x,))
    assert "func.func private @jax_op.test_softmax." in exported.text
    _close(exported(x), model(x).detach())


def test_call_without_tensors_is_an_error():
    with pytest.raises(JaxOpError, match="called without tensors"):
        SOFTMAX()


def test_compiled_with_torchtpu_view_passes(caplog):
    """functionalize="torchtpu": the view passes run after torchtpu-inline, so a graph
    holding a jax_op's merged call compiles on that path (no aot_autograd fallback)."""

    def f(x):
        y = x.clone()
        y.add_(1)
        return SOFTMAX(y[:, :4]) * 2

    x = torch.randn(4, 8)
    with torch.no_grad(), caplog.at_level("WARNING", logger="torch_tpu"):
        out = torch.compile(f, backend="tpu", options={"functionalize": "torchtpu"})(x)
    assert "cannot compile" not in caplog.text
    _close(out, torch.softmax(x[:, :4] + 1, -1) * 2)


def test_compiled_shape_changes_specialise():
    """Shapes are static to a jax_op: when Dynamo's automatic dynamic shapes make a dim
    symbolic after a size change, the op specialises it (one trace per size) instead of
    failing."""
    compiled = torch.compile(lambda x: SOFTMAX(x * 2) + 1, backend="tpu")
    for rows in (6, 9, 11):
        x = torch.randn(rows, 8)
        _close(compiled(x), torch.softmax(x * 2, -1) + 1)


def test_first_call_on_tpu_runs_on_the_device(monkeypatch):
    """A jax_op whose first call is on tpu tensors (the how-to's first example): its rule
    is in the table before the device plans the op, so neither that call nor later ones
    run on the CPU (they did from then on: the device remembered "no lowering")."""
    first = jax_op("test_first_on_tpu", lambda x: jnp.tanh(x) * 3)
    monkeypatch.setenv("TORCH_TPU_STRICT", "1")  # a CPU fallback raises
    x = torch.randn(5, 7)
    for _ in range(2):
        _close(first(x.to("tpu")).cpu(), torch.tanh(x) * 3)
    assert not any(plan is _ops.FALLBACK for key, plan in _ops._PLANS.items() if key[0] is first.op)


def test_missing_jax_says_how_to_install_it():
    """torch_tpu installs jaxlib only: without jax the first call says what to install."""
    script = """
        import sys, torch, torch_tpu
        sys.modules["jax"] = None  # as if jax were not installed
        op = torch_tpu.jax_op("needs_jax", lambda x: x + 1)
        try:
            op(torch.ones(2))
        except torch_tpu.JaxOpError as err:
            print(err)
    """
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], capture_output=True, text=True,
                            timeout=300)
    from importlib.metadata import version

    assert "jax is not installed" in result.stdout, result.stderr[-2000:]
    assert f"pip install 'jax=={version('jaxlib')}'" in result.stdout


def _jax_halve(x):
    return x / 2


def test_the_lowering_is_written_through_the_one_writer(user_table):
    """The rule a jax_op adds at its first trace is an ordinary table entry: its site is
    the user's jax function, and another rule for the op is refused, naming that site."""
    from torch_tpu.compiler.lowering.registry import LOWERINGS

    op = jax_op("test_halve_site", _jax_halve)
    _close(op(torch.ones(3)), torch.full((3,), 0.5))
    entry = LOWERINGS[op.op]
    assert entry.family == "jax_op"
    assert entry.site == f"{__file__}:{_jax_halve.__code__.co_firstlineno} (_jax_halve)"
    with pytest.raises(ValueError, match=r"has two lowerings: .*test_jax_op.py:\d+ \(_jax_halve\) \(family jax_op\)"):
        torch_tpu.register_lowering(op.op)(lambda ctx, inputs: inputs)
    assert LOWERINGS[op.op] is entry
    _close(op(torch.ones(2)), torch.full((2,), 0.5))  # a new signature traces again: no second registration
    assert LOWERINGS[op.op] is entry
