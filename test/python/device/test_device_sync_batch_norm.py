"""nn.SyncBatchNorm's per-rank kernels on the tpu device (compiler/lowering/sync_batch_norm.py;
PyTorch has them for CUDA only). The ranks of a group are simulated in one process: each
chunk of a batch is one rank's input, the gathered statistics and the summed gradients are
what the collectives would give, and the result must be plain batch norm over the whole
batch -- the output, the running statistics and every gradient. `test_tpu_dist.py` runs
SyncBatchNorm in a real two-rank job."""

import pytest
import torch
import torch.nn.functional as F

import torch_tpu.device  # noqa: F401 - registers the device where autoload is off

EPS, MOMENTUM = 1e-5, 0.1


def _synced_batch_norm(chunks, weight, bias, running_mean, running_var, grads):
    """SyncBatchNorm's forward and backward (torch/nn/modules/_functions.py), the ranks'
    chunks in one process, through the ops under test."""
    stats = [torch.batch_norm_stats(x, EPS) for x in chunks]
    means = torch.stack([m for m, _ in stats])
    invstds = torch.stack([s for _, s in stats])
    counts = torch.tensor([x.numel() // x.size(1) for x in chunks], dtype=means.dtype).to(means.device)
    mean, invstd = torch.batch_norm_gather_stats_with_counts(chunks[0], means, invstds, running_mean, running_var,
                                                             MOMENTUM, EPS, counts)
    outs = [torch.batch_norm_elemt(x, weight, bias, mean, invstd, EPS) for x in chunks]
    reduced = [torch.batch_norm_backward_reduce(g, x, mean, invstd, weight, True, True, True)
               for g, x in zip(grads, chunks)]
    sum_dy = sum(r[0] for r in reduced)
    sum_dy_xmu = sum(r[1] for r in reduced)
    grad_weight = sum(r[2] for r in reduced)
    grad_bias = sum(r[3] for r in reduced)
    count = counts.to(torch.int32)
    grad_inputs = [torch.batch_norm_backward_elemt(g, x, mean, invstd, weight, sum_dy, sum_dy_xmu, count)
                   for g, x in zip(grads, chunks)]
    return torch.cat(outs), torch.cat(grad_inputs), grad_weight, grad_bias


@pytest.mark.parametrize("device", ["cpu-formulas", "tpu"])
@pytest.mark.parametrize("shape,split", [((6, 3, 4, 5), [2, 4]), ((5, 4), [3, 2]), ((4, 2, 7), [1, 3])])
def test_synced_statistics_equal_batch_norm_over_the_whole_batch(shape, split, device):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(shape, generator=gen) * 3 + 1
    grad = torch.randn(shape, generator=gen)
    channels = shape[1]
    weight, bias = torch.randn(channels, generator=gen), torch.randn(channels, generator=gen)
    rm, rv = torch.randn(channels, generator=gen), torch.rand(channels, generator=gen) + 0.5

    # the reference: batch norm over the whole batch, on CPU
    xr = x.clone().requires_grad_()
    wr, br = weight.clone().requires_grad_(), bias.clone().requires_grad_()
    rm_ref, rv_ref = rm.clone(), rv.clone()
    out_ref = F.batch_norm(xr, rm_ref, rv_ref, wr, br, training=True, momentum=MOMENTUM, eps=EPS)
    out_ref.backward(grad)

    if device == "tpu":
        move = lambda t: t.to("tpu")  # noqa: E731
    else:  # the formulas alone, on CPU tensors (PyTorch has no CPU kernel for these ops)
        from torch_tpu.compiler.lowering import sync_batch_norm as ops

        move = lambda t: t  # noqa: E731
        torch_ops = {name: getattr(ops, name) for name in ("batch_norm_stats", "batch_norm_gather_stats_with_counts",
                                                            "batch_norm_elemt", "batch_norm_backward_reduce",
                                                            "batch_norm_backward_elemt")}
    rm_t, rv_t = move(rm.clone()), move(rv.clone())
    chunks = [move(c) for c in x.split(split)]
    grads = [move(g) for g in grad.split(split)]
    if device == "tpu":
        got = _synced_batch_norm(chunks, move(weight), move(bias), rm_t, rv_t, grads)
    else:
        saved = {name: getattr(torch, name) for name in torch_ops}
        try:
            for name, fn in torch_ops.items():
                setattr(torch, name, fn)
            got = _synced_batch_norm(chunks, weight, bias, rm_t, rv_t, grads)
        finally:
            for name, fn in saved.items():
                setattr(torch, name, fn)
    out, grad_input, grad_weight, grad_bias = (t.cpu() for t in got)
    torch.testing.assert_close(out, out_ref.detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(grad_input, xr.grad, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(grad_weight, wr.grad, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(grad_bias, br.grad, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(rm_t.cpu(), rm_ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(rv_t.cpu(), rv_ref, rtol=1e-5, atol=1e-6)


def test_reduced_precision_input_gives_float32_statistics():
    x = torch.randn(4, 3, 5).to(torch.bfloat16).to("tpu")
    mean, invstd = torch.batch_norm_stats(x, EPS)
    assert mean.dtype == invstd.dtype == torch.float32
    var, want = torch.var_mean(x.cpu().float(), [0, 2], correction=0)
    torch.testing.assert_close(mean.cpu(), want)
    torch.testing.assert_close(invstd.cpu(), torch.rsqrt(var + EPS))
    out = torch.batch_norm_elemt(x, None, None, mean, invstd, EPS)
    assert out.dtype == torch.bfloat16


def test_backward_reduce_leaves_out_what_is_not_asked():
    x, g = torch.randn(4, 3).to("tpu"), torch.randn(4, 3).to("tpu")
    mean, invstd = torch.batch_norm_stats(x, EPS)
    sum_dy, sum_dy_xmu, grad_weight, grad_bias = torch.batch_norm_backward_reduce(
        g, x, mean, invstd, torch.ones(3).to("tpu"), False, True, False)
    assert sum_dy is None and sum_dy_xmu is None and grad_bias is None
    assert grad_weight.shape == (3,)
