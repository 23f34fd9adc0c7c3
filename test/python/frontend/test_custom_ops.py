"""Python custom ops in compiled graphs (python/torch_tpu/backend/_custom_ops.py): an op without a
lowering whose implementation traces is compiled as the ATen ops of that implementation
(strict mode raises nothing), forward and backward, its register_autograd backward
honoured; one whose implementation reads values runs in eager, logged with the reason."""

from __future__ import annotations

import logging

import pytest
import torch

import torch_tpu
from torch_tpu.backend import _compile
from torch_tpu.runtime import Executable


# -- ops under test -------------------------------------------------------------------------
@torch.library.custom_op("torchtpu_customops::scaled_softplus", mutates_args=())
def scaled_softplus(x: torch.Tensor, scale: float) -> torch.Tensor:
    # Writes in place into a fresh tensor, and makes a constant: both must trace.
    out = torch.empty_like(x)
    out.copy_(torch.nn.functional.softplus(x) * scale)
    out.add_(torch.tensor([0.5, 1.5]).repeat(x.shape[-1] // 2))
    return out


@scaled_softplus.register_fake
def _(x, scale):
    return torch.empty_like(x)


def _straight_through_backward(ctx, grad):
    # Deliberately not the derivative of the forward: the compiled backward must be this.
    return grad * ctx.scale, None


def _save_scale(ctx, inputs, output):
    ctx.scale = inputs[1]


scaled_softplus.register_autograd(_straight_through_backward, setup_context=_save_scale)


@torch.library.custom_op("torchtpu_customops::outer_norm", mutates_args=())
def outer_norm(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    # Two results, and a call of another custom op: expanded in turn.
    norm = x.norm(dim=-1, keepdim=True)
    return scaled_softplus(x / norm, 2.0), norm


@outer_norm.register_fake
def _(x):
    return torch.empty_like(x), x.new_empty(*x.shape[:-1], 1)


# A torch.library.Library definition with a CompositeExplicitAutograd implementation.
_LIB = torch.library.Library("torchtpu_customops", "FRAGMENT")
_LIB.define("clipped_square(Tensor x, float bound) -> Tensor")
_LIB.impl("clipped_square", lambda x, bound: torch.clamp(x * x, max=bound), "CompositeExplicitAutograd")
_LIB._register_fake("clipped_square", lambda x, bound: torch.empty_like(x))


@torch.library.custom_op("torchtpu_customops::numpy_cos", mutates_args=())
def numpy_cos(x: torch.Tensor) -> torch.Tensor:
    return torch.from_numpy(__import__("numpy").cos(x.numpy()))


@numpy_cos.register_fake
def _(x):
    return torch.empty_like(x)


@torch.library.custom_op("torchtpu_customops::keep_positive_rows", mutates_args=())
def keep_positive_rows(x: torch.Tensor) -> torch.Tensor:
    # Data-dependent Python control flow on a tensor's value.
    return x * 2 if bool((x > 0).all()) else x - 1


@keep_positive_rows.register_fake
def _(x):
    return torch.empty_like(x)


# -- fixtures -------------------------------------------------------------------------------
@pytest.fixture
def fallbacks(caplog, monkeypatch):
    """The fallback messages logged so far in the test (fresh Dynamo and log-once state)."""
    monkeypatch.delenv("TORCH_TPU_STRICT", raising=False)
    monkeypatch.setattr(_compile, "_reported_fallbacks", set())
    torch._dynamo.reset()
    caplog.set_level(logging.WARNING, logger="torch_tpu")
    return lambda: [r.getMessage() for r in caplog.records if "runs in PyTorch eager" in r.getMessage()]


@pytest.fixture
def programs(monkeypatch) -> list:
    """The compiled programs called during the test."""
    calls = []
    original = Executable.__call__

    def counting(self, *args):
        calls.append(self)
        return original(self, *args)

    monkeypatch.setattr(Executable, "__call__", counting)
    return calls


# -- traced ---------------------------------------------------------------------------------
def test_a_traceable_custom_op_compiles_in_strict_mode(monkeypatch, programs):
    monkeypatch.setenv("TORCH_TPU_STRICT", "1")
    torch._dynamo.reset()

    def f(x):
        return scaled_softplus(x.sin(), 3.0).cos() + torch.ops.torchtpu_customops.clipped_square(x, 0.5)

    x = torch.randn(3, 6)
    torch.testing.assert_close(torch.compile(f, backend="tpu")(x), f(x))
    assert len(programs) == 1  # one program: nothing ran in eager between compiled parts


def test_the_registered_backward_is_compiled_not_rederived(monkeypatch):
    monkeypatch.setenv("TORCH_TPU_STRICT", "1")
    torch._dynamo.reset()

    def f(x):
        return (scaled_softplus(x * 2, 3.0) ** 2).sum()

    x = torch.randn(4, 6, requires_grad=True)
    torch.compile(f, backend="tpu")(x).backward()
    compiled_grad, x.grad = x.grad, None
    f(x).backward()
    torch.testing.assert_close(compiled_grad, x.grad)
    # The straight-through backward differs from the derivative of the traced forward.
    true_derivative = torch.func.grad(lambda t: ((torch.nn.functional.softplus(t * 2) * 3.0 + 1) ** 2).sum())(x)
    assert not torch.allclose(compiled_grad, true_derivative, atol=1e-2)


def test_several_results_and_a_nested_custom_op(monkeypatch, programs):
    monkeypatch.setenv("TORCH_TPU_STRICT", "1")
    torch._dynamo.reset()

    def f(x):
        y, norm = outer_norm(x)
        return y * norm

    x = torch.randn(5, 4, requires_grad=False)
    torch.testing.assert_close(torch.compile(f, backend="tpu")(x), f(x))
    assert len(programs) == 1


# -- not traceable --------------------------------------------------------------------------
@pytest.mark.parametrize(
    "op, why",
    [
        (numpy_cos, "RuntimeError: .numpy() is not supported for tensor subclasses"),
        (keep_positive_rows, "DataDependentOutputException: aten._local_scalar_dense.default"),
    ],
    ids=["numpy", "data-dependent"],
)
def test_an_untraceable_custom_op_falls_back_with_the_reason(fallbacks, programs, op, why):
    def f(x):
        return op(x.exp()) * 2

    x = torch.randn(4)
    torch.testing.assert_close(torch.compile(f, backend="tpu")(x), f(x))
    (message,) = fallbacks()
    name = op._opoverload.name().replace("::", ".")
    assert message.startswith(f"torch_tpu: custom op {name}.default has no lowering and its implementation "
                              f"cannot be traced: {why}; it runs in PyTorch eager."), message
    assert len(programs) == 2  # exp before it and the multiply after it still compiled


def test_strict_mode_rejects_an_untraceable_custom_op(monkeypatch):
    monkeypatch.setenv("TORCH_TPU_STRICT", "1")
    torch._dynamo.reset()
    with pytest.raises(torch._dynamo.exc.BackendCompilerFailed) as info:
        torch.compile(lambda x: numpy_cos(x) + 1, backend="tpu")(torch.randn(3))
    assert isinstance(info.value.inner_exception, torch_tpu.TorchTpuCompileError)
    assert "torchtpu_customops.numpy_cos.default (node numpy_cos)" in str(info.value.inner_exception)
    assert "untraceable custom op: its implementation cannot be traced" in str(info.value.inner_exception)


def test_the_torchtpu_views_path_expands_custom_ops_too(fallbacks, programs, caplog):
    def f(x):
        y = x.clone()
        y[1:] += scaled_softplus(x[1:], 0.5)  # a view written in place
        return y

    x = torch.randn(3, 4)
    compiled = torch.compile(f, backend="tpu", options={"functionalize": "torchtpu"})
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), f(x))
    assert fallbacks() == [] and len(programs) == 1
    # Compiled by the view passes, not handed to aot_autograd's functionalization.
    assert not [r for r in caplog.records if "functionalize='torchtpu' cannot compile" in r.getMessage()]
