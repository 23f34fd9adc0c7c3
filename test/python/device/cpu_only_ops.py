"""An op for the device tests' fallback paths: a custom op with a CPU kernel and nothing
else, which no lowering table will ever cover, so a tpu tensor given to it reaches the
device's CPU fallback (aten ops used as the example kept getting lowered)."""

import torch


@torch.library.custom_op("torchtpu_test::halve_on_cpu_only", mutates_args=(), device_types="cpu")
def halve_on_cpu_only(x: torch.Tensor) -> torch.Tensor:
    return x / 2
