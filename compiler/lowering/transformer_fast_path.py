"""The inference fast path of `nn.TransformerEncoderLayer` and `nn.MultiheadAttention`.

In eval mode without gradients those modules call one fused op for any input on CPU, CUDA or
the PrivateUse1 device (ours): `_transformer_encoder_layer_fwd` (a whole encoder layer) and
`_native_multi_head_attention`, whose kernels exist for CPU and CUDA only. Without these
decompositions every encoder layer of a model on the tpu device ran on the CPU (a round trip
through the host per layer), in eager and inside compiled graphs alike.

The formulas follow PyTorch's kernels (aten/src/ATen/native/transformers): the query is
scaled by 1/sqrt(head dim) before its product with the keys; a mask is boolean (a float
mask is converted, nonzero meaning masked, as those kernels do) and a row with every key
masked gives NaN, as PyTorch's `_masked_softmax` does; `mask_type` 0 is a [T, T] mask, 1 a [B, T]
key padding mask, 2 (or None) a mask of the scores' shape. float16 and bfloat16 softmax in
float32.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .opmath import to_opmath

aten = torch.ops.aten


def masked_softmax(input, mask, dim=None, mask_type=None):
    """`_masked_softmax`: softmax over `dim` (the last by default) with the `True` entries of
    `mask` left out (NaN where a whole row is masked, as PyTorch's kernel gives); no mask
    (None, from `native_multi_head_attention`): a plain softmax, in opmath likewise."""
    dim = input.dim() - 1 if dim is None else dim
    x = to_opmath(input)
    if mask is not None:
        if mask_type == 1 and input.dim() == 4 and mask.dim() == 2:
            mask = mask.view(mask.size(0), 1, 1, mask.size(1))
        x = x.masked_fill(mask.expand(input.shape), float("-inf"))
    return torch.softmax(x, dim).to(input.dtype)


def native_multi_head_attention(query, key, value, embed_dim, num_head, qkv_weight, qkv_bias, proj_weight,
                                proj_bias, mask=None, need_weights=True, average_attn_weights=True, mask_type=None):
    """-> (output [B, T, D], attention weights: [B, T, S] averaged over heads, [B, H, T, S]
    not averaged, None without `need_weights`)."""
    batch, target = query.shape[0], query.shape[1]
    head_dim = embed_dim // num_head
    wq, wk, wv = qkv_weight.chunk(3, 0)
    bq, bk, bv = qkv_bias.chunk(3, 0)

    def heads(t):
        return t.reshape(t.shape[0], t.shape[1], num_head, head_dim).transpose(1, 2)

    q = heads(F.linear(query, wq, bq)) * (1.0 / math.sqrt(head_dim))
    scores = q @ heads(F.linear(key, wk, bk)).transpose(-2, -1)
    weights = masked_softmax(scores, None if mask is None else mask.to(torch.bool), -1, mask_type)
    context = weights @ heads(F.linear(value, wv, bv))
    out = F.linear(context.transpose(1, 2).reshape(batch, target, embed_dim), proj_weight, proj_bias)
    if not need_weights:
        return out, None
    return out, (weights.sum(1) / num_head if average_attn_weights else weights)


def transformer_encoder_layer(src, embed_dim, num_heads, qkv_weight, qkv_bias, proj_weight, proj_bias, use_gelu,
                              norm_first, eps, norm_weight_1, norm_bias_1, norm_weight_2, norm_bias_2, ffn_weight_1,
                              ffn_bias_1, ffn_weight_2, ffn_bias_2, mask=None, mask_type=None):
    """`_transformer_encoder_layer_fwd`: self-attention and the feed-forward block, each
    with its residual, layer norms before (`norm_first`) or after."""
    shape = (embed_dim,)
    x = F.layer_norm(src, shape, norm_weight_1, norm_bias_1, eps) if norm_first else src
    x = native_multi_head_attention(x, x, x, embed_dim, num_heads, qkv_weight, qkv_bias, proj_weight, proj_bias,
                                    mask, False, True, mask_type)[0] + src
    if not norm_first:
        x = F.layer_norm(x, shape, norm_weight_1, norm_bias_1, eps)
    residual = x
    if norm_first:
        x = F.layer_norm(x, shape, norm_weight_2, norm_bias_2, eps)
    hidden = F.linear(x, ffn_weight_1, ffn_bias_1)
    hidden = F.gelu(hidden) if use_gelu else F.relu(hidden)
    x = F.linear(hidden, ffn_weight_2, ffn_bias_2) + residual
    return F.layer_norm(x, shape, norm_weight_2, norm_bias_2, eps) if not norm_first else x


DECOMPOSITIONS = {
    aten._masked_softmax.default: masked_softmax,
    aten._native_multi_head_attention.default: native_multi_head_attention,
    aten._transformer_encoder_layer_fwd.default: transformer_encoder_layer,
}
