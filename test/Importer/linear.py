# RUN: %PYTHON %s | FileCheck %s
# FX importer: matrix products, convolution, pooling and attention
# (compiler/lowering/linear.py, convolution.py, pooling.py, resampling.py, embedding.py, attention.py). Each case
# prints its name, then the imported module.

import torch
from torch.fx.experimental.proxy_tensor import make_fx
from torch_tpu.compiler.importer import import_graph

aten = torch.ops.aten


def run(name, fn, *args):
    print(name)
    print(import_graph(make_fx(fn, tracing_mode="fake")(*args)).text())


# addmm: one dot_general (precision is left to torchtpu-set-precision), then
# beta * self + product with the 1-d bias broadcast along the rows.
# CHECK-LABEL: test_addmm
# CHECK: stablehlo.dot_general %arg1, %arg2, contracting_dims = [1] x [0] : (tensor<3x5xf32>, tensor<5x4xf32>) -> tensor<3x4xf32>
# CHECK: stablehlo.broadcast_in_dim %arg0, dims = [1] : (tensor<4xf32>) -> tensor<3x4xf32>
# CHECK: stablehlo.multiply
# CHECK: stablehlo.add
run("test_addmm", lambda c, a, b: aten.addmm(c, a, b, beta=0.5), torch.randn(4), torch.randn(3, 5), torch.randn(5, 4))

# A bfloat16 addmm accumulates its product in float32 and adds the bias there, rounding once
# (the CPU and CUDA kernels' GEMM epilogue).
# CHECK-LABEL: test_addmm_bf16
# CHECK: stablehlo.dot_general %arg1, %arg2, contracting_dims = [1] x [0] : (tensor<3x5xbf16>, tensor<5x4xbf16>) -> tensor<3x4xf32>
# CHECK: stablehlo.convert %arg0 : (tensor<4xbf16>) -> tensor<4xf32>
# CHECK: stablehlo.add {{.*}} : tensor<3x4xf32>
# CHECK: stablehlo.convert {{.*}} : (tensor<3x4xf32>) -> tensor<3x4xbf16>
run("test_addmm_bf16", lambda c, a, b: aten.addmm(c, a, b), torch.randn(4, dtype=torch.bfloat16),
    torch.randn(3, 5, dtype=torch.bfloat16), torch.randn(5, 4, dtype=torch.bfloat16))

# Integer products stay integer.
# CHECK-LABEL: test_bmm_int
# CHECK: stablehlo.dot_general %arg0, %arg1, batching_dims = [0] x [0], contracting_dims = [2] x [1] :
# CHECK-SAME: -> tensor<2x3x4xi64>
run("test_bmm_int", aten.bmm, torch.ones(2, 3, 5, dtype=torch.int64), torch.ones(2, 5, 4, dtype=torch.int64))

# A grouped transposed convolution: swap in/out channels within each group, flip the
# kernel, dilate the input by the stride; output_padding goes on the high side.
# CHECK-LABEL: test_conv_transpose_groups
# CHECK: stablehlo.transpose %{{.*}}, dims = [0, 2, 1, 3, 4] : (tensor<2x2x3x3x3xf32>) -> tensor<2x3x2x3x3xf32>
# CHECK: stablehlo.reverse %{{.*}}, dims = [2, 3] : tensor<6x2x3x3xf32>
# CHECK: stablehlo.convolution(%arg0, %{{.*}}) dim_numbers = [b, f, 0, 1]x[o, i, 0, 1]->[b, f, 0, 1]
# CHECK-SAME: pad = {{\[\[}}1, 2], [1, 1]], lhs_dilate = [2, 2]
# CHECK-SAME: feature_group_count = 2
run("test_conv_transpose_groups",
    lambda x, w: aten.convolution(x, w, None, [2, 2], [1, 1], [1, 1], True, [1, 0], 2),
    torch.randn(1, 4, 5, 5), torch.randn(4, 3, 3, 3))

# convolution_backward: grad_input is a transposed convolution, grad_weight correlates
# input and grad_output over the batch (batch_group_count = groups), grad_bias a sum.
# CHECK-LABEL: test_conv_backward
# CHECK: stablehlo.convolution(%arg0, %{{.*}}) {{.*}} lhs_dilate = [2, 2]
# CHECK-SAME: -> tensor<1x4x8x8xf32>
# CHECK: stablehlo.convolution(%arg1, %arg0) dim_numbers = [f, b, 0, 1]x[i, o, 0, 1]->[f, b, 0, 1]
# CHECK-SAME: rhs_dilate = [2, 2]
# CHECK-SAME: batch_group_count = 2 : i64, feature_group_count = 1 : i64
# CHECK-SAME: -> tensor<6x2x3x3xf32>
# CHECK: stablehlo.reduce(%arg0 init: %{{.*}}) applies stablehlo.add across dimensions = [0, 2, 3]
run("test_conv_backward",
    lambda g, x, w: aten.convolution_backward(g, x, w, [6], [2, 2], [1, 1], [1, 1], False, [0, 0], 2, [True, True, True]),
    torch.randn(1, 6, 4, 4), torch.randn(1, 4, 8, 8), torch.randn(6, 2, 3, 3))

# max_pool2d_with_indices: one variadic reduce_window over (value, flat plane index);
# ceil_mode shows as extra high padding.
# CHECK-LABEL: test_max_pool2d
# CHECK: stablehlo.iota dim = 0 : tensor<64xi64>
# CHECK: "stablehlo.reduce_window"(%arg0, %{{.*}}, %{{.*}}, %{{.*}})
# CHECK-SAME: padding = dense<{{\[\[}}0, 0], [0, 0], [1, 2], [1, 2]]>
# CHECK-SAME: window_dimensions = array<i64: 1, 1, 3, 3>, window_strides = array<i64: 1, 1, 2, 2>
# CHECK: stablehlo.compare NE, %[[A:[^,]*]], %[[A]], FLOAT
# CHECK: -> (tensor<1x2x5x5xf32>, tensor<1x2x5x5xi64>)
run("test_max_pool2d", lambda x: aten.max_pool2d_with_indices(x, [3, 3], [2, 2], [1, 1], [1, 1], True),
    torch.randn(1, 2, 8, 8))

# Non-uniform adaptive bins: gather each bin's elements, mask the short bins, sum, then
# divide by the static bin sizes. Uniform bins (8 -> 4) are a reshape and a sum.
# CHECK-LABEL: test_adaptive_avg_pool2d
# CHECK: "stablehlo.gather"(%arg0, %{{.*}})
# CHECK-SAME: -> tensor<1x2x12x8xf32>
# CHECK: stablehlo.select
# CHECK: applies stablehlo.add across dimensions = [3]
# CHECK-NOT: stablehlo.gather
# CHECK: stablehlo.reshape %{{.*}} : (tensor<1x2x3x8xf32>) -> tensor<1x2x3x4x2xf32>
# CHECK: applies stablehlo.add across dimensions = [4]
# CHECK: stablehlo.divide
run("test_adaptive_avg_pool2d", lambda x: aten._adaptive_avg_pool2d(x, [3, 4]), torch.randn(1, 2, 8, 8))

# Bilinear upsampling: two taps per axis (static indices and weights), W first.
# CHECK-LABEL: test_upsample_bilinear2d
# CHECK-COUNT-2: "stablehlo.gather"{{.*}}-> tensor<1x2x4x6xf32>
# CHECK-COUNT-2: "stablehlo.gather"{{.*}}-> tensor<1x2x8x6xf32>
# CHECK-NOT: stablehlo.gather
run("test_upsample_bilinear2d", lambda x: torch.nn.functional.interpolate(x, size=(8, 6), mode="bilinear"),
    torch.randn(1, 2, 4, 3))

# Grouped-query attention: the 4 query heads are grouped over the 2 key/value heads in
# dot_general (no repeat of K/V); the causal mask is top-left aligned; the logsumexp is
# the second result.
# CHECK-LABEL: test_sdpa_gqa
# CHECK: stablehlo.reshape %arg0 : (tensor<1x4x5x8xf32>) -> tensor<1x2x2x5x8xf32>
# CHECK: stablehlo.dot_general %{{.*}}, %arg1, batching_dims = [0, 1] x [0, 1], contracting_dims = [4] x [3]
# CHECK: stablehlo.compare LE
# CHECK: applies stablehlo.maximum across dimensions = [4]
# CHECK: stablehlo.exponential
# CHECK: stablehlo.dot_general %{{.*}}, %arg2, batching_dims = [0, 1] x [0, 1], contracting_dims = [4] x [2]
# CHECK: stablehlo.log
# CHECK: return %{{.*}}, %{{.*}} : tensor<1x4x5x8xf32>, tensor<1x4x5xf32>
run("test_sdpa_gqa",
    lambda q, k, v: aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, is_causal=True),
    torch.randn(1, 4, 5, 8), torch.randn(1, 2, 6, 8), torch.randn(1, 2, 6, 8))
