"""Lowerings registered after the device started (issue 30 item 6): a user's
`register_lowering` of a custom op, or one added after the device looked the op up and
ran it on the CPU, runs on the device at the op's next call, in Strict and FUSED mode."""

from __future__ import annotations

import pytest
import torch

import torch_tpu
import torch_tpu.device  # noqa: F401 - registers the device where autoload is off
from torch_tpu.device import EagerMode, _fused, _ops, set_eager_mode


# A body that only works on CPU tensors (numpy): on tpu tensors only a lowering runs it.
@torch.library.custom_op("torchtpu_latelowering::axpy", mutates_args=())
def axpy(x: torch.Tensor, y: torch.Tensor, alpha: float) -> torch.Tensor:
    return torch.from_numpy(alpha * x.numpy() + y.numpy())


@axpy.register_fake
def _(x, y, alpha):
    return torch.empty_like(x)


# A kernel for CPU only: on tpu tensors the device's fallback copies to the host and runs it.
@torch.library.custom_op("torchtpu_latelowering::twice_plus", mutates_args=(), device_types="cpu")
def twice_plus(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return 2 * x + y


@twice_plus.register_fake
def _(x, y):
    return torch.empty_like(x)


def _lower_axpy():
    from torch_tpu.compiler import ir as hlo

    @torch_tpu.register_lowering(torch.ops.torchtpu_latelowering.axpy.default, dynamic="safe")
    def lower_axpy(ctx, x, y, alpha):
        return hlo.add(hlo.mul(x, hlo.splat(alpha, hlo.element_type_of(x), hlo.shape_of(x))), y)


def _lower_twice_plus(edited: bool = False):
    """Registers twice_plus's rule; `edited`: the same function with other code (2x - y)."""
    from torch_tpu.compiler import ir as hlo

    register = torch_tpu.register_lowering(torch.ops.torchtpu_latelowering.twice_plus.default, dynamic="safe")
    if not edited:
        @register
        def lower_twice_plus(ctx, x, y):
            return hlo.add(hlo.add(x, x), y)
    else:
        @register
        def lower_twice_plus(ctx, x, y):
            return hlo.sub(hlo.add(x, x), y)


def _recorded_ops() -> list[str]:
    trace = _fused._current[0]
    return [] if trace is None or trace.flushed else [str(plan.executable.name) for plan, _, _ in trace.ops]


@pytest.mark.parametrize("mode", [EagerMode.STRICT, EagerMode.FUSED])
def test_a_custom_op_with_a_lowering_runs_it_on_the_device(user_table, monkeypatch, mode):
    """Its Python body (numpy) would fail on tpu tensors; the lowering runs instead."""
    x, y = torch.randn(3, 5), torch.randn(3, 5)
    xt, yt = x.to("tpu"), y.to("tpu")  # the device's kernels exist before the registration
    _lower_axpy()
    monkeypatch.setenv("TORCH_TPU_STRICT", "1")  # a run on the CPU would be an error
    with set_eager_mode(mode):
        out = axpy(xt, yt, 0.5)
        if mode is EagerMode.FUSED:
            assert "torchtpu_latelowering.axpy.default" in _recorded_ops()
        assert out.device.type == "tpu"
        torch.testing.assert_close(out.cpu(), axpy(x, y, 0.5))


@pytest.mark.parametrize("mode", [EagerMode.STRICT, EagerMode.FUSED])
def test_a_lowering_registered_after_a_cpu_run_is_used_next_call(user_table, monkeypatch, mode):
    """The first call found no lowering and ran on the CPU (the plan cache remembered
    that); the lowering registered afterwards must be found at the next call."""
    x, y = torch.randn(4, 3), torch.randn(4, 3)
    xt, yt = x.to("tpu"), y.to("tpu")
    with set_eager_mode(mode):
        torch.testing.assert_close(twice_plus(xt, yt).cpu(), 2 * x + y)  # on the CPU
    assert any(plan is _ops.FALLBACK for key, plan in _ops._PLANS.items()
               if key[0] is torch.ops.torchtpu_latelowering.twice_plus.default)
    _lower_twice_plus()
    monkeypatch.setenv("TORCH_TPU_STRICT", "1")
    with set_eager_mode(mode):
        out = twice_plus(xt, yt)
        if mode is EagerMode.FUSED:
            assert "torchtpu_latelowering.twice_plus.default" in _recorded_ops()
        torch.testing.assert_close(out.cpu(), 2 * x + y)


def test_a_replaced_lowering_replaces_the_plan(user_table):
    """A re-registered rule (a re-run notebook cell with other code) is what the next
    call runs, not the plan the earlier rule made."""
    x, y = torch.randn(6), torch.randn(6)
    xt, yt = x.to("tpu"), y.to("tpu")
    _lower_twice_plus()
    torch.testing.assert_close(twice_plus(xt, yt).cpu(), 2 * x + y)
    _lower_twice_plus(edited=True)
    torch.testing.assert_close(twice_plus(xt, yt).cpu(), 2 * x - y)
