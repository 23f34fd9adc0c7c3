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
