"""Graphs that the pass pipeline or XLA cannot compile still run, and nothing is raised at
call time (python/torch_tpu/backend/_recovery.py, docs/explanation/bounded-dynamism.md "When a
graph cannot be compiled"):

* a bounded-dynamic graph rejected at its bounds is compiled per concrete size;
* if that fails too, it runs in PyTorch eager;
* a static graph whose failure names an op runs that op in eager (partitioned), one whose
  failure names none runs in eager as a whole;
* TORCH_TPU_STRICT=1 raises instead, with the op, the user's source line and what to do.

The failures are real: XLA and the pipeline reject modules torch_tpu really built. To
make XLA reject deterministically, some tests change the lowering table for the test
(monkeypatch, undone after each test):

* `_without_dynamic_conv_rule`: the dynamic rule that keeps convolutions along a dynamic
  spatial dim out of the module is removed, so the ordinary convolution rule runs at the
  bounds and XLA answers "Dynamic Spatial Convolution is not supported" (the failure
  this rule exists to avoid, and the one seen in the field for ops without such a rule);
* `_sin_calls_missing_target`: aten.sin lowers to a custom call XLA:CPU has no
  implementation for; XLA's error names no op (a whole-module rejection);
* `_sin_emits_unknown_op`: aten.sin lowers to an op torchtpu-verify rejects (a pipeline
  failure with a located diagnostic);
* `_conv_along_data_dependent_size`: in a static graph, the convolution's input gets a
  dynamic spatial size, so XLA rejects it and names the op.

Compile counts read the runtime cache's `compiles` (successful compiles only); L1 is
cleared around each test so no executable compiled under a patched table is reused.
Tolerances: float32, atol/rtol 1e-5 (XLA:CPU vs eager differ by reassociation).
"""

import dataclasses
import logging

import pytest
import torch
import torch._dynamo.exc

import torch_tpu
from torch_tpu.backend import _compile
from torch_tpu.compiler.context import ir, stablehlo

from torch_tpu.compiler.lowering.registry import LOWERINGS, Lowering, Padding
from torch_tpu.runtime import get_client

aten = torch.ops.aten
TOL = {"atol": 1e-5, "rtol": 1e-5}
THIS_FILE = __file__


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    monkeypatch.delenv("TORCH_TPU_STRICT", raising=False)
    # Fallback warnings are logged once per op per process; each test sees its own.
    monkeypatch.setattr(_compile, "_reported_fallbacks", set())
    torch._dynamo.reset()
    get_client().cache.clear_l1()
    yield
    torch._dynamo.reset()
    get_client().cache.clear_l1()


def _compiles() -> int:
    return get_client().cache.stats.compiles


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "torch_tpu" and r.levelno == logging.WARNING]


def _line_of(marker: str) -> int:
    with open(THIS_FILE) as f:
        return next(i for i, line in enumerate(f, 1) if line.rstrip().endswith(marker))


# -- the patched lowerings ----------------------------------------------------------------

def _without_dynamic_conv_rule(monkeypatch) -> None:
    # Declared "masked" with no rule: the ordinary lowering reaches XLA with a dynamic
    # spatial dim, which XLA rejects.
    for op in (aten.convolution.default, aten.convolution_backward.default):
        entry = LOWERINGS[op]
        monkeypatch.setitem(LOWERINGS, op, dataclasses.replace(entry, padding=Padding.MASKED, dynamic_rule=None))


def _patch(monkeypatch, op, rule) -> None:
    # The original's padding class: the patched rule is used with dynamic operands too.
    monkeypatch.setitem(LOWERINGS, op, Lowering(op, rule, "test", padding=LOWERINGS[op].padding))


def _sin_calls_missing_target(monkeypatch, only_above: int | None = None) -> None:
    """`only_above`: only in a module with dynamic sizes whose bound exceeds it."""
    ordinary = LOWERINGS[aten.sin.default].fn

    def rule(ctx, x):
        if only_above is not None and (
            ctx.dynamic is None or max(ir.RankedTensorType(x.type).shape) <= only_above
        ):
            return ordinary(ctx, x)
        return stablehlo.CustomCallOp([x.type], [x], "torchtpu_test_missing_target").result

    _patch(monkeypatch, aten.sin.default, rule)


def _sin_emits_unknown_op(monkeypatch) -> None:
    def rule(ctx, x):
        return ir.Operation.create("torchtpu.test_unknown", results=[x.type], operands=[x]).result

    _patch(monkeypatch, aten.sin.default, rule)


def _conv_along_data_dependent_size(monkeypatch) -> None:
    ordinary = LOWERINGS[aten.convolution.default].fn

    def rule(ctx, x, *args):
        # Size of dim 2 plus 0 * x[0, 0, 0]: a size XLA cannot fold, so dim 2 is dynamic.
        f32, i32 = ir.F32Type.get(), ir.IntegerType.get_signless(32)
        first = stablehlo.SliceOp(x, [0, 0, 0], [1, 1, 1], [1, 1, 1]).result
        first = stablehlo.ReshapeOp(ir.RankedTensorType.get([], f32), first).result
        zero = stablehlo.ConstantOp(ir.DenseElementsAttr.get_splat(first.type, ir.FloatAttr.get_f32(0.0))).result
        extra = stablehlo.ConvertOp(ir.RankedTensorType.get([], i32), stablehlo.MulOp(first, zero).result).result
        size = stablehlo.AddOp(stablehlo.GetDimensionSizeOp(x, 2).result, extra).result
        x = stablehlo.SetDimensionSizeOp(x, size, 2, results=[x.type]).result
        return ordinary(ctx, x, *args)

    _patch(monkeypatch, aten.convolution.default, rule)


# -- models -------------------------------------------------------------------------------

def _conv_model():
    torch.manual_seed(0)
    conv = torch.nn.Conv1d(3, 4, 3, padding=1)

    def model(x):
        return torch.relu(conv(x)) * 2 + 1  # conv call

    return conv, model


def _sin_model(x):
    return torch.cos(torch.sin(x) * 2) + x.sum()  # sin call


def _sin_conv_model():
    torch.manual_seed(0)
    conv = torch.nn.Conv1d(3, 4, 3, padding=1)

    def model(x):
        y = torch.sin(x) * 2
        return torch.relu(conv(y)) + y.sum()  # sin-conv call

    return model


def _dynamic(x: torch.Tensor, dim: int, max: int | None = 64) -> torch.Tensor:
    if max is None:
        torch._dynamo.mark_dynamic(x, dim)
    else:
        torch._dynamo.mark_dynamic(x, dim, min=2, max=max)
    return x


# -- bounded-dynamic graphs ---------------------------------------------------------------

def test_dynamic_graph_rejected_at_bounds_compiles_per_size(monkeypatch, caplog):
    _without_dynamic_conv_rule(monkeypatch)
    _, model = _conv_model()
    compiled = torch.compile(model, backend="tpu")
    lengths = [10, 12, 7, 10, 12, 7]
    before = _compiles()
    with caplog.at_level(logging.INFO, logger="torch_tpu"), torch.no_grad():
        for length in lengths:
            x = _dynamic(torch.randn(2, 3, length), 2)
            torch.testing.assert_close(compiled(x), model(x), **TOL)
    # One executable per distinct length; the bounded module never compiled.
    assert _compiles() - before == len(set(lengths))
    [warning] = _warnings(caplog)
    assert "cannot be compiled at its bounds" in warning
    assert "aten.convolution.default" in warning
    assert f"{THIS_FILE}:{_line_of('# conv call')}" in warning
    assert "Dynamic Spatial Convolution is not supported" in warning
    assert "compiled for each concrete input size" in warning
    specialised = [r.getMessage() for r in caplog.records if "for sizes" in r.getMessage()]
    assert len(specialised) == len(set(lengths))
    assert all(r.levelno == logging.INFO for r in caplog.records if "for sizes" in r.getMessage())


def test_dynamic_training_specialises_forward_and_backward(monkeypatch, caplog):
    _without_dynamic_conv_rule(monkeypatch)
    conv, model = _conv_model()
    reference = torch.nn.Conv1d(3, 4, 3, padding=1)
    reference.load_state_dict(conv.state_dict())
    compiled = torch.compile(model, backend="tpu")
    before = _compiles()
    with caplog.at_level(logging.WARNING, logger="torch_tpu"):
        for length in (10, 12, 10):
            x = _dynamic(torch.randn(2, 3, length, requires_grad=True), 2)
            x_ref = x.detach().clone().requires_grad_()
            conv.zero_grad()
            reference.zero_grad()
            compiled(x).sum().backward()
            (torch.relu(reference(x_ref)) * 2 + 1).sum().backward()
            torch.testing.assert_close(x.grad, x_ref.grad, **TOL)
            torch.testing.assert_close(conv.weight.grad, reference.weight.grad, atol=1e-4, rtol=1e-4)
    assert _compiles() - before == 4  # forward and backward, at 10 and at 12
    warnings = _warnings(caplog)
    assert len(warnings) == 2, warnings
    assert any("forward" in w for w in warnings) and any("backward" in w for w in warnings)
    assert all("Dynamic Spatial Convolution is not supported" in w for w in warnings)


def test_specialised_compile_fails_too_runs_eager(monkeypatch, caplog):
    _sin_calls_missing_target(monkeypatch)
    compiled = torch.compile(_sin_model, backend="tpu")
    before = _compiles()
    with caplog.at_level(logging.WARNING, logger="torch_tpu"):
        for length in (10, 12, 10, 20):
            x = _dynamic(torch.randn(length, 3), 0)
            torch.testing.assert_close(compiled(x), _sin_model(x), **TOL)
    assert _compiles() - before == 0
    at_bounds, either = _warnings(caplog)
    assert "cannot be compiled at its bounds" in at_bounds
    # Safe ops run on static layouts (bounded dynamism), so XLA's error is the bare missing
    # target with no op metadata: the warning names the target, not a node.
    assert "torchtpu_test_missing_target" in at_bounds
    assert "cannot be compiled for its concrete sizes {'s" in either and "either" in either
    assert "the module calls the custom-call target 'torchtpu_test_missing_target'" in either
    assert "runs in PyTorch eager" in either


def test_size_above_bound_whose_recompile_fails_recovers_during_the_call(monkeypatch, caplog):
    """A size above the policy bound recompiles during the call; that compile fails (the
    patched rule rejects bounds above 16), so the graph is compiled for the call's size
    instead, and the call returns the right answer."""
    _sin_calls_missing_target(monkeypatch, only_above=16)
    compiled = torch.compile(_sin_model, backend="tpu")
    before = _compiles()
    with caplog.at_level(logging.WARNING, logger="torch_tpu"):
        x = _dynamic(torch.randn(10, 3), 0, max=None)  # bound 16 (TORCH_TPU_DYNAMIC_BOUND=pow2)
        torch.testing.assert_close(compiled(x), _sin_model(x), **TOL)
        assert _compiles() - before == 1
        assert _warnings(caplog) == []
        for length in (40, 10, 40):
            x = _dynamic(torch.randn(length, 3), 0, max=None)
            torch.testing.assert_close(compiled(x), _sin_model(x), **TOL)
    assert _compiles() - before == 3  # at bound 16, then for 40 and for 10
    warnings = _warnings(caplog)
    assert any("exceeds its compiled bound" in w for w in warnings)
    [recovered] = [w for w in warnings if "cannot be compiled at its bounds" in w]
    assert "torchtpu_test_missing_target" in recovered


def test_unpatched_xla_rejection_at_bounds_still_runs(caplog):
    """No patched table: with jaxlib 0.10.2, XLA rejects a real FFT along a dynamic dim
    ("Asked to propagate a dynamic dimension from hlo ... to hlo %... = c64[...] fft(...)").
    Whatever rule a later change gives the op, every size must run and match eager; the
    warning, when there is one, quotes the HLO instruction by name only."""

    def model(x):
        return torch.fft.rfft(x, dim=0).abs() * 2

    compiled = torch.compile(model, backend="tpu")
    with caplog.at_level(logging.WARNING, logger="torch_tpu"):
        for length in (6, 11, 7):
            # (No max=: Dynamo's guards for rfft's output size conflict with a given range.)
            x = _dynamic(torch.randn(length, 4), 0, max=None)
            torch.testing.assert_close(compiled(x), model(x), atol=1e-4, rtol=1e-4)
    for warning in _warnings(caplog):
        assert " = c64[" not in warning and "metadata=" not in warning, warning


# -- static graphs ------------------------------------------------------------------------

def test_static_graph_rejected_without_an_op_runs_eager(monkeypatch, caplog):
    _sin_calls_missing_target(monkeypatch)
    compiled = torch.compile(_sin_model, backend="tpu")
    x = torch.randn(5, 3)
    before = _compiles()
    with caplog.at_level(logging.WARNING, logger="torch_tpu"):
        torch.testing.assert_close(compiled(x), _sin_model(x), **TOL)
        torch.testing.assert_close(compiled(x + 1), _sin_model(x + 1), **TOL)
    assert _compiles() - before == 0
    [warning] = _warnings(caplog)
    assert [r.levelno for r in caplog.records if r.name == "torch_tpu"] == [logging.WARNING]
    assert "cannot be compiled (the module calls the custom-call target 'torchtpu_test_missing_target'" in warning
    assert "it runs in PyTorch eager" in warning


def test_static_pipeline_failure_naming_an_op_partitions_it_out(monkeypatch, caplog):
    _sin_emits_unknown_op(monkeypatch)
    model = _sin_conv_model()
    compiled = torch.compile(model, backend="tpu")
    x = torch.randn(2, 3, 10)
    before = _compiles()
    with caplog.at_level(logging.WARNING, logger="torch_tpu"), torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), **TOL)
    assert _compiles() - before == 1  # everything after aten.sin, in one piece
    [warning] = _warnings(caplog)
    assert warning.startswith("torch_tpu: aten.sin.default cannot be compiled (torchtpu-verify: unknown op")
    assert "runs in PyTorch eager" in warning


def test_static_xla_rejection_naming_an_op_partitions_it_out(monkeypatch, caplog):
    _conv_along_data_dependent_size(monkeypatch)
    model = _sin_conv_model()
    compiled = torch.compile(model, backend="tpu")
    x = torch.randn(2, 3, 10)
    before = _compiles()
    with caplog.at_level(logging.WARNING, logger="torch_tpu"), torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), **TOL)
    assert _compiles() - before == 2  # the pieces before and after the eager convolution
    [warning] = _warnings(caplog)
    assert warning.startswith("torch_tpu: aten.convolution.default cannot be compiled (XLA cannot compile "
                              "the module: Dynamic Spatial Convolution is not supported)")


# -- strict mode --------------------------------------------------------------------------

def test_strict_mode_raises_for_a_dynamic_graph_rejected_at_bounds(monkeypatch):
    _without_dynamic_conv_rule(monkeypatch)
    monkeypatch.setenv("TORCH_TPU_STRICT", "1")
    _, model = _conv_model()
    x = _dynamic(torch.randn(2, 3, 10), 2)
    with pytest.raises(torch._dynamo.exc.BackendCompilerFailed) as info, torch.no_grad():
        torch.compile(model, backend="tpu")(x)
    inner = info.value.inner_exception
    assert isinstance(inner, torch_tpu.TorchTpuCompileError)
    text = str(inner)
    assert "aten.convolution.default (node convolution)" in text
    assert f"{THIS_FILE}:{_line_of('# conv call')}" in text
    assert "Dynamic Spatial Convolution is not supported" in text
    assert "TORCH_TPU_STRICT=1 forbids falling back; unset it" in text


def test_strict_mode_raises_for_a_static_xla_rejection(monkeypatch):
    _conv_along_data_dependent_size(monkeypatch)
    monkeypatch.setenv("TORCH_TPU_STRICT", "1")
    model = _sin_conv_model()
    with pytest.raises(torch._dynamo.exc.BackendCompilerFailed) as info, torch.no_grad():
        torch.compile(model, backend="tpu")(torch.randn(2, 3, 10))
    text = str(info.value.inner_exception)
    assert f"aten.convolution.default (node convolution) at {THIS_FILE}:{_line_of('# sin-conv call')}" in text
    assert "Dynamic Spatial Convolution is not supported" in text
    assert "TORCH_TPU_STRICT=1" in text


def test_strict_mode_raises_for_a_static_graph_rejected_as_a_whole(monkeypatch):
    _sin_calls_missing_target(monkeypatch)
    monkeypatch.setenv("TORCH_TPU_STRICT", "1")
    with pytest.raises(torch._dynamo.exc.BackendCompilerFailed) as info:
        torch.compile(_sin_model, backend="tpu")(torch.randn(5, 3))
    text = str(info.value.inner_exception)
    assert "cannot be compiled: the module calls the custom-call target 'torchtpu_test_missing_target'" in text
    assert "unset it and torch_tpu runs it in PyTorch eager" in text
    assert "TORCH_TPU_DUMP_DIR" in text


# -- a root cause the recovery found ------------------------------------------------------

def test_dynamic_graph_with_a_random_op_compiles_once_at_its_bounds(caplog):
    """The seed argument of a graph with random ops made the bounded module invalid
    ("'func.func' op expects argument attribute array to have the same number of elements
    as the number of function arguments"): every such graph was compiled per size."""

    def model(x):
        return torch.nn.functional.dropout(x, p=0.5, training=True) + 1

    compiled = torch.compile(model, backend="tpu")
    before = _compiles()
    with caplog.at_level(logging.WARNING, logger="torch_tpu"):
        for length in (10, 12, 7):
            x = _dynamic(torch.rand(length, 3) + 1, 0)
            out = compiled(x) - 1
            assert out.shape == x.shape
            kept = out != 0
            torch.testing.assert_close(out[kept], 2 * x[kept], **TOL)
            assert 0 < int(kept.sum()) < x.numel()
    assert _compiles() - before == 1
    assert _warnings(caplog) == []
