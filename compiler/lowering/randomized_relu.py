"""`F.rrelu` (`nn.RReLU`) as ATen functions of device ops: `rrelu_with_noise` and its
in-place form have CPU and CUDA kernels only, so on the device every call, in training
and in evaluation, ran on the host.

Semantics are PyTorch's kernels' (aten/src/ATen/native/Activation.cpp): in training, each
element x <= 0 is multiplied by a slope drawn uniformly from [lower, upper], recorded in
`noise` (1 for x > 0, which pass unchanged); in evaluation every x <= 0 is multiplied by
the mean slope (lower + upper) / 2 (`leaky_relu`) and `noise` is left as it is. The slopes
come from the device's generator: in training the values differ from CPU's, as they do
between CPU and CUDA.
"""

from __future__ import annotations

import torch

from .opmath import to_opmath

aten = torch.ops.aten


def rrelu_with_noise_functional(x, noise, lower=0.125, upper=1.0 / 3.0, training=False, generator=None):
    """`rrelu_with_noise_functional(self, noise, lower, upper, training, generator) ->
    (Tensor, Tensor noise_out)`: the functional form, which a compiled graph holds."""
    if not training:
        return aten.leaky_relu.default(x, (lower + upper) / 2), noise.clone()
    value = to_opmath(x)
    # The functional `uniform`: in a traced graph this runs after functionalization.
    slopes = aten.uniform.default(torch.empty_like(value), lower, upper, generator=generator)
    negative = value <= 0
    new_noise = torch.where(negative, slopes, torch.ones_like(slopes)).to(noise.dtype)
    return torch.where(negative, value * slopes, value).to(x.dtype), new_noise


def rrelu_with_noise(x, noise, lower=0.125, upper=1.0 / 3.0, training=False, generator=None):
    """`rrelu_with_noise(self, noise, lower, upper, training, generator) -> Tensor`, which
    writes `noise` in training."""
    if not training:
        return aten.leaky_relu.default(x, (lower + upper) / 2)
    out, new_noise = rrelu_with_noise_functional(x, noise, lower, upper, training, generator)
    noise.copy_(new_noise)
    return out


def rrelu_with_noise_(x, noise, lower=0.125, upper=1.0 / 3.0, training=False, generator=None):
    return x.copy_(rrelu_with_noise(x, noise, lower, upper, training, generator))


DECOMPOSITIONS = {
    aten.rrelu_with_noise_functional.default: rrelu_with_noise_functional,
    aten.rrelu_with_noise.default: rrelu_with_noise,
    aten.rrelu_with_noise_.default: rrelu_with_noise_,
}
