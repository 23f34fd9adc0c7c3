"""The statistics kernels of `nn.SyncBatchNorm`, which PyTorch has for CUDA only.

`nn.SyncBatchNorm` accepts a PrivateUse1 device's tensors (ours) and, while training in a
process group of more than one rank, computes each rank's batch statistics, gathers them,
normalizes and, in its backward, all-reduces two sums per channel. Its per-rank steps are
six ops with CUDA kernels only; they are decomposed here into reductions and elementwise
ops (the collectives between them are `tpu_dist`'s), for `torch.distributed` jobs on the
tpu device.

Formulas follow PyTorch's CUDA kernels (aten/src/ATen/native/cuda/Normalization.cu): the
statistics of a channel are over every dimension but 1; `invstd` is 1 / sqrt(biased
variance + eps); the gathered statistics combine each rank's mean and variance weighted
by its element count (the same result as the kernel's running merge, up to rounding) and
update the running mean and the unbiased running variance in place. float16 and bfloat16
inputs give float32 statistics, as the kernels' accumulate type does.
"""

from __future__ import annotations

import torch

from .opmath import to_opmath

aten = torch.ops.aten


def _per_channel(t: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A [C] tensor shaped to broadcast over `like`'s channel dimension (dimension 1)."""
    return t.reshape([1, -1] + [1] * (like.dim() - 2))


def _reduced_dims(t: torch.Tensor) -> list[int]:
    return [d for d in range(t.dim()) if d != 1]


def batch_norm_stats(input, eps):
    """-> (mean, invstd), per channel."""
    x = to_opmath(input)
    var, mean = torch.var_mean(x, _reduced_dims(x), correction=0)
    return mean, torch.rsqrt(var + eps)


def batch_norm_gather_stats_with_counts(input, mean, invstd, running_mean, running_var, momentum, eps, counts):
    """Each rank's (mean, invstd) rows and element counts -> the group's (mean, invstd);
    the running statistics are updated in place."""
    counts = counts.to(mean.dtype).reshape(-1, 1)
    total = counts.sum(0)
    avg = (counts * mean).sum(0) / total
    var_n = (counts * (invstd.reciprocal().square() - eps)).sum(0) + (counts * (mean - avg).square()).sum(0)
    if running_mean is not None:
        running_mean.copy_(running_mean * (1 - momentum) + avg.to(running_mean.dtype) * momentum)
    if running_var is not None:
        unbiased = var_n / (total - 1)
        running_var.copy_(running_var * (1 - momentum) + unbiased.to(running_var.dtype) * momentum)
    return avg, torch.rsqrt(var_n / total + eps)


def batch_norm_elemt(input, weight, bias, mean, invstd, eps):
    x = to_opmath(input)
    out = (x - _per_channel(mean, x)) * _per_channel(invstd, x)
    if weight is not None:
        out = out * _per_channel(to_opmath(weight), x)
    if bias is not None:
        out = out + _per_channel(to_opmath(bias), x)
    return out.to(input.dtype)


def batch_norm_backward_reduce(grad_out, input, mean, invstd, weight, input_g, weight_g, bias_g):
    """-> (sum_dy, sum_dy_xmu, grad_weight, grad_bias); each None where its flag is off
    (`input_g` for the two sums), as PyTorch's kernel leaves them undefined."""
    dy, x = to_opmath(grad_out), to_opmath(input)
    dims = _reduced_dims(x)
    sum_dy = dy.sum(dims)
    sum_dy_xmu = (dy * (x - _per_channel(mean, x))).sum(dims)
    out_dtype = weight.dtype if weight is not None else mean.dtype
    grad_weight = (sum_dy_xmu * invstd).to(out_dtype) if weight_g else None
    grad_bias = sum_dy.to(out_dtype) if bias_g else None
    if not input_g:
        return None, None, grad_weight, grad_bias
    return sum_dy.to(mean.dtype), sum_dy_xmu.to(mean.dtype), grad_weight, grad_bias


def batch_norm_backward_elemt(grad_out, input, mean, invstd, weight, sum_dy, sum_dy_xmu, count):
    """The input's gradient from the group's sums (`count`: each rank's element count)."""
    dy, x = to_opmath(grad_out), to_opmath(input)
    total = count.sum().to(sum_dy.dtype)
    mean_dy = _per_channel(sum_dy / total, x)
    mean_dy_xmu = _per_channel(sum_dy_xmu / total, x)
    istd = _per_channel(invstd, x)
    scale = istd if weight is None else istd * _per_channel(to_opmath(weight), x)
    grad = (dy - mean_dy - (x - _per_channel(mean, x)) * istd.square() * mean_dy_xmu) * scale
    return grad.to(grad_out.dtype)


DECOMPOSITIONS = {
    aten.batch_norm_stats.default: batch_norm_stats,
    aten.batch_norm_gather_stats_with_counts.default: batch_norm_gather_stats_with_counts,
    aten.batch_norm_elemt.default: batch_norm_elemt,
    aten.batch_norm_backward_reduce.default: batch_norm_backward_reduce,
    aten.batch_norm_backward_elemt.default: batch_norm_backward_elemt,
}
