"""`torch.autocast("tpu", dtype=torch.bfloat16)`: the autocast policy of the tpu device.

PyTorch registers autocast kernels for its own backends only; a PrivateUse1 backend
brings its own. The policy is the accelerator one PyTorch uses for CUDA (and torch_xla
for TPUs): matmul-like ops (convolutions, linear, matmul, attention) run in the
autocast dtype; ops that lose accuracy in low precision (reductions, softmax,
normalizations, losses, exp/log/pow) run in float32. Every other op runs in the dtype
of its inputs (a fallthrough), and mixed inputs promote as usual. Only floating tpu
tensors other than float64 are cast, as on CUDA."""

from __future__ import annotations

import torch
import torch.utils._pytree as pytree

_KEY = torch._C.DispatchKey.AutocastPrivateUse1
_EXCLUDE = torch._C.DispatchKeySet(_KEY)

# PyTorch's CUDA lists (aten/src/ATen/autocast_mode.cpp), by op name; every overload.
LOWER_PRECISION = (
    "_convolution", "conv1d", "conv2d", "conv3d", "conv_tbc", "conv_transpose1d", "conv_transpose2d",
    "conv_transpose3d", "convolution", "prelu", "addmm", "addmv", "addr", "matmul", "einsum", "mm",
    "mv", "linalg_vecdot", "linear", "addbmm", "baddbmm", "bmm", "chain_matmul", "linalg_multi_dot",
    "_thnn_fused_lstm_cell", "_thnn_fused_gru_cell", "lstm_cell", "gru_cell", "rnn_tanh_cell",
    "rnn_relu_cell", "_scaled_dot_product_flash_attention", "scaled_dot_product_attention",
)
FLOAT32 = (
    "acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p", "reciprocal",
    "rsqrt", "sinh", "tan", "pow", "softplus", "layer_norm", "native_layer_norm", "group_norm",
    "frobenius_norm", "nuclear_norm", "cosine_similarity", "poisson_nll_loss", "cosine_embedding_loss",
    "nll_loss", "nll_loss2d", "hinge_embedding_loss", "kl_div", "l1_loss", "smooth_l1_loss", "huber_loss",
    "mse_loss", "margin_ranking_loss", "multilabel_margin_loss", "soft_margin_loss",
    "triplet_margin_loss", "multi_margin_loss", "binary_cross_entropy_with_logits", "dist", "pdist",
    "cdist", "renorm", "logsumexp", "upsample_nearest1d", "_upsample_nearest_exact1d",
    "upsample_nearest2d", "_upsample_nearest_exact2d", "upsample_nearest3d", "_upsample_nearest_exact3d",
    "upsample_linear1d", "upsample_bilinear2d", "_upsample_bilinear2d_aa", "upsample_trilinear3d",
    "upsample_bicubic2d", "_upsample_bicubic2d_aa", "prod", "softmax", "log_softmax", "cumprod",
    "cumsum", "linalg_vector_norm", "linalg_matrix_norm", "sum", "norm", "cross_entropy_loss",
)


def _eligible(value) -> bool:
    return (isinstance(value, torch.Tensor) and value.device.type == "tpu" and value.is_floating_point()
            and value.dtype is not torch.float64)


def _kernel(op, lower: bool):
    def kernel(*args, **kwargs):
        dtype = torch.get_autocast_dtype("tpu") if lower else torch.float32
        args, kwargs = pytree.tree_map(
            lambda v: v.to(dtype) if _eligible(v) and v.dtype != dtype else v, (args, kwargs))
        with torch._C._ExcludeDispatchKeyGuard(_EXCLUDE):
            return op(*args, **kwargs)

    return kernel


def _overloads(name: str):
    packet = getattr(torch.ops.aten, name, None)
    if packet is None:
        return
    for overload in packet.overloads():
        op = getattr(packet, overload)
        if "out" in overload or op._schema.name.endswith("_"):
            continue  # out= and in-place forms keep their output's dtype: not autocast
        yield op


def register(fallback_library, impl_library) -> None:
    """Every op falls through autocast but the two lists, which cast their inputs."""
    fallback_library.fallback(torch.library.fallthrough_kernel, "AutocastPrivateUse1")
    for names, lower in ((LOWER_PRECISION, True), (FLOAT32, False)):
        for name in names:
            for op in _overloads(name):
                impl_library.impl(op, _kernel(op, lower), "AutocastPrivateUse1")
