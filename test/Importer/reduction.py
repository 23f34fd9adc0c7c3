# RUN: %PYTHON %s | FileCheck %s
# FX importer: reductions, scans, sorting and normalization
# (compiler/lowering/reduction.py, compiler/lowering/normalization.py). Each case prints
# its name, then the imported module.

import torch
from torch.fx.experimental.proxy_tensor import make_fx
from torch_tpu.compiler.importer import import_graph

aten = torch.ops.aten


def run(name, fn, *args):
    print(name)
    print(import_graph(make_fx(fn, tracing_mode="fake")(*args)).text())


X = torch.randn(2, 3, 4)

# Integer sums accumulate in int64.
# CHECK-LABEL: test_sum_int_promotes
# CHECK: stablehlo.convert %{{.*}} : (tensor<2x3xi32>) -> tensor<2x3xi64>
# CHECK: stablehlo.reduce(%{{.*}} init: %{{.*}}) applies stablehlo.add across dimensions = [1]
# CHECK-SAME: -> tensor<2xi64>
run("test_sum_int_promotes", lambda x: x.sum(1), torch.ones(2, 3, dtype=torch.int32))

# keepdim reshapes the reduced dims back to size 1.
# CHECK-LABEL: test_amax_keepdim
# CHECK: applies stablehlo.maximum across dimensions = [0, 2]
# CHECK: stablehlo.reshape %{{.*}} : (tensor<3xf32>) -> tensor<1x3x1xf32>
run("test_amax_keepdim", lambda x: x.amax((0, -1), keepdim=True), X)

# argmax: one variadic reduce over (value, iota); NaN wins, ties take the smaller index.
# CHECK-LABEL: test_argmax
# CHECK: stablehlo.iota dim = 1 : tensor<2x3x4xi64>
# CHECK: stablehlo.reduce(%arg0 init: %{{.*}}), (%{{.*}} init: %{{.*}}) across dimensions = [1]
# CHECK-SAME: -> (tensor<2x4xf32>, tensor<2x4xi64>)
# CHECK: stablehlo.compare LT, %{{.*}}, %{{.*}}, SIGNED
# CHECK: stablehlo.compare GT
# CHECK: stablehlo.compare NE, %[[A:[^,]*]], %[[A]], FLOAT
# CHECK: return %{{.*}}#1 : tensor<2x4xi64>
run("test_argmax", lambda x: x.argmax(1), X)

# bf16 accumulates in f32: max-shifted exp, one sum, then back to bf16.
# CHECK-LABEL: test_softmax_bf16
# CHECK: stablehlo.convert %arg0 : (tensor<2x3x4xbf16>) -> tensor<2x3x4xf32>
# CHECK: applies stablehlo.maximum across dimensions = [2]
# CHECK: stablehlo.subtract
# CHECK: stablehlo.exponential
# CHECK: applies stablehlo.add across dimensions = [2]
# CHECK: stablehlo.divide
# CHECK: stablehlo.convert %{{.*}} : (tensor<2x3x4xf32>) -> tensor<2x3x4xbf16>
# CHECK-NOT: stablehlo.exponential
run("test_softmax_bf16", lambda x: x.softmax(-1), X.bfloat16())

# cumsum is a reduce_window spanning the dim with n - 1 low padding.
# CHECK-LABEL: test_cumsum
# CHECK: "stablehlo.reduce_window"
# CHECK-SAME: padding = dense<{{\[\[}}0, 0], [0, 0], [3, 0]]>
# CHECK-SAME: window_dimensions = array<i64: 1, 1, 4>
# CHECK: stablehlo.add
run("test_cumsum", lambda x: x.cumsum(2), X)

# Descending sort swaps the comparator's operands; NaN sorts above +inf.
# CHECK-LABEL: test_sort_descending
# CHECK: stablehlo.iota dim = 1 : tensor<2x3x4xi64>
# CHECK: "stablehlo.sort"(%arg0, %{{.*}}) <{dimension = 1 : i64, is_stable = true}>
# CHECK: ^bb0(%[[L:.*]]: tensor<f32>, %[[R:[^:]*]]: tensor<f32>
# CHECK: stablehlo.compare LT, %[[R]], %[[L]], FLOAT
# CHECK: stablehlo.compare NE, %[[R]], %[[R]], FLOAT
run("test_sort_descending", lambda x: tuple(x.sort(1, descending=True)), X)

# topk is the sorted prefix.
# CHECK-LABEL: test_topk
# CHECK: "stablehlo.sort"
# CHECK: stablehlo.slice %{{.*}}#0 [0:2, 0:3, 0:2] : (tensor<2x3x4xf32>) -> tensor<2x3x2xf32>
# CHECK: stablehlo.slice %{{.*}}#1 [0:2, 0:3, 0:2] : (tensor<2x3x4xi64>) -> tensor<2x3x2xi64>
run("test_topk", lambda x: tuple(x.topk(2)), X)

# native_layer_norm returns out, mean and rstd with the normalized dims kept as 1.
# CHECK-LABEL: test_native_layer_norm
# CHECK: func.func @main(%arg0: tensor<2x3x4xf32>, %arg1: tensor<4xf32>, %arg2: tensor<4xf32>)
# CHECK-SAME: -> (tensor<2x3x4xf32>, tensor<2x3x1xf32>, tensor<2x3x1xf32>)
# CHECK: stablehlo.rsqrt %{{.*}} : tensor<2x3x1xf32>
# CHECK: stablehlo.broadcast_in_dim %arg1, dims = [2] : (tensor<4xf32>) -> tensor<2x3x4xf32>
run(
    "test_native_layer_norm",
    lambda x, w, b: aten.native_layer_norm(x, [4], w, b, 1e-5),
    X,
    torch.ones(4),
    torch.zeros(4),
)

# The functionalized training batch norm also returns the updated running stats.
# CHECK-LABEL: test_batch_norm_functional
# CHECK: func.func @main
# CHECK-SAME: -> (tensor<2x3x4xf32>, tensor<3xf32>, tensor<3xf32>, tensor<3xf32>, tensor<3xf32>)
# CHECK: applies stablehlo.add across dimensions = [0, 2]
# CHECK: stablehlo.rsqrt
run(
    "test_batch_norm_functional",
    lambda x, rm, rv: aten._native_batch_norm_legit_functional(
        x, None, None, rm, rv, True, 0.1, 1e-5
    ),
    X,
    torch.zeros(3),
    torch.ones(3),
)
