"""Ops that renormalize parameters, as ATen functions of device ops: the backward of weight
normalization (`nn.utils.parametrizations.weight_norm`, `nn.utils.weight_norm`) and
`nn.Embedding(max_norm=...)`'s in-place row renormalization.

Both have CPU and CUDA kernels only: on the device, every backward of a weight-normalized
layer (wav2vec2's positional convolution, HiFi-GAN's every convolution) and every forward
of an embedding with `max_norm` copied the weights to the host and back.

Semantics are PyTorch's kernels' (aten/src/ATen/native/WeightNorm.cpp, Embedding.cpp).
"""

from __future__ import annotations

import torch

from .opmath import to_opmath

aten = torch.ops.aten


def weight_norm_interface_backward(grad_w, saved_v, saved_g, saved_norms, dim):
    """`_weight_norm_interface_backward(grad_w, saved_v, saved_g, saved_norms, dim) ->
    (grad_v, grad_g)` for w = g * v / ||v||, the norm taken over every dimension but `dim`
    (0 or the last, the only ones the forward kernel takes): with s = sum(grad_w * v) over
    those dimensions, grad_g = s / norm and grad_v = (g / norm) * (grad_w - v * s / norm²).
    16-bit floats compute in float32, as the kernels do."""
    grad, v, g, norms = (to_opmath(t) for t in (grad_w, saved_v, saved_g, saved_norms))
    reduced = [d for d in range(v.dim()) if d != dim % max(v.dim(), 1)]
    s = (grad * v).sum(dim=reduced, keepdim=True) if reduced else grad * v
    grad_g = s / norms
    grad_v = (g / norms) * (grad - v * (s / (norms * norms)))
    return grad_v.to(saved_v.dtype), grad_g.reshape(saved_g.shape).to(saved_g.dtype)


def _renormalized_rows(weight, rows, max_norm, norm_type):
    """The rows of `weight` named by `rows`, each scaled by max_norm / (norm + 1e-7) where
    its `norm_type`-norm exceeds `max_norm`."""
    selected = weight.index_select(0, rows)
    norms = torch.linalg.vector_norm(to_opmath(selected), ord=norm_type, dim=-1, keepdim=True)
    scale = torch.where(norms > max_norm, max_norm / (norms + 1e-7), torch.ones_like(norms))
    return (to_opmath(selected) * scale).to(weight.dtype)


def embedding_renorm_(weight, indices, max_norm, norm_type):
    """`embedding_renorm_(self, indices, max_norm, norm_type) -> self`: the rows named by
    `indices` renormalized in place. Only those rows are read and written (a repeated
    index writes its row's one new value again), never the whole table."""
    rows = indices.reshape(-1)
    if rows.numel() == 0:
        return weight
    return weight.index_put_((rows,), _renormalized_rows(weight, rows, max_norm, norm_type))


def embedding_renorm(weight, indices, max_norm, norm_type):
    """`embedding_renorm(self, indices, max_norm, norm_type) -> Tensor`: the functional
    form, which a compiled graph holds (functionalization's rewrite of the in-place op)."""
    rows = indices.reshape(-1)
    if rows.numel() == 0:
        return weight.clone()
    return weight.index_put((rows,), _renormalized_rows(weight, rows, max_norm, norm_type))


DECOMPOSITIONS = {
    aten._weight_norm_interface_backward.default: weight_norm_interface_backward,
    aten.embedding_renorm_.default: embedding_renorm_,
    aten.embedding_renorm.default: embedding_renorm,
}
