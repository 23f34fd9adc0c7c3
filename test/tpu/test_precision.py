"""float32 matrix products on the chip at each precision mode. XLA:TPU multiplies float32 with
bf16 passes of the matrix unit: 'highest' (six passes, the default) agrees with a float64
reference to ~1e-6 relative; 'high' (three) and 'medium' (one) are measured here and stated
in docs/howto/run-on-a-tpu-vm.md."""

from __future__ import annotations

import pytest
import torch

import torch_tpu
from tpu_support import tpu_only

# Relative error bound of each mode, relative to the product's magnitude (|a| |b| summed):
# 'highest' is float32 accuracy; 'high' ~bf16x3 (about 2^-16); 'medium' is one bf16 pass (2^-8).
BOUNDS = {"highest": 2e-6, "high": 4e-5, "medium": 1e-2}


def _relative_error(mode: str, compiled: bool) -> float:
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(256, 512, generator=g), torch.randn(512, 128, generator=g)
    reference = a.double() @ b.double()
    scale = a.double().abs() @ b.double().abs()
    with torch_tpu.precision(mode):
        if compiled:
            got = torch.compile(lambda x, y: x @ y, backend="tpu")(a.to("tpu"), b.to("tpu")).cpu()
        else:
            got = (a.to("tpu") @ b.to("tpu")).cpu()
    return ((got.double() - reference).abs() / scale).max().item()


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("mode", ["highest", "high", "medium"])
def test_float32_matmul_precision_modes(chip, platform, mode, compiled):
    err = _relative_error(mode, compiled)
    print(f"{mode} {'compiled' if compiled else 'eager'}: max relative error {err:.2e}")
    assert err < BOUNDS[mode], f"{mode}: relative error {err:.2e} over {BOUNDS[mode]:.0e}"
    if mode == "medium":
        tpu_only(platform, "XLA:CPU computes every mode in float32")
        assert err > 1e-5, f"'medium' gave float32 accuracy ({err:.2e}): the mode did not reach XLA:TPU"


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("mode", ["highest", "medium"])
def test_precision_block_holds_in_the_backward(chip, platform, mode, compiled):
    """Autograd runs the backward on its own thread: the block's mode must reach the
    gradient's matrix product (grad_a = grad_out @ b^T) there, as it reaches the forward's."""
    g = torch.Generator().manual_seed(1)
    a, b, grad_out = (torch.randn(256, 512, generator=g), torch.randn(512, 128, generator=g),
                      torch.randn(256, 128, generator=g))
    reference = grad_out.double() @ b.double().T
    scale = grad_out.double().abs() @ b.double().abs().T
    fn = (lambda x, y: x @ y)
    if compiled:
        torch._dynamo.reset()
        fn = torch.compile(fn, backend="tpu")
    x = a.to("tpu").requires_grad_()
    with torch_tpu.precision(mode):
        fn(x, b.to("tpu")).backward(grad_out.to("tpu"))
    err = ((x.grad.cpu().double() - reference).abs() / scale).max().item()
    print(f"{mode} {'compiled' if compiled else 'eager'} backward: max relative error {err:.2e}")
    assert err < BOUNDS[mode], f"{mode} backward: relative error {err:.2e} over {BOUNDS[mode]:.0e}"
    if mode == "medium":
        tpu_only(platform, "XLA:CPU computes every mode in float32")
        assert err > 1e-5, f"'medium' backward gave float32 accuracy ({err:.2e}): the block did not reach it"


def test_sigmoid_keeps_its_relative_accuracy(chip):
    """sigmoid, and SiLU through it, lowered as 1 / (1 + exp(-x)): XLA:TPU's own
    `stablehlo.logistic` goes through tanh and lost 1.8e-2 relative accuracy at x = -8 on a
    v5e (this form: 5.0e-6, JAX's)."""
    x = torch.linspace(-8, 8, 20001)
    for name, fn in (("sigmoid", torch.sigmoid), ("silu", torch.nn.functional.silu)):
        want = fn(x.double())
        got = fn(x.to("tpu")).cpu().double()
        err = ((got - want).abs() / want.abs().clamp_min(1e-30)).max().item()
        print(f"{name}: max relative error {err:.2e}")
        assert err < 2e-5, f"{name}: relative error {err:.2e}"
