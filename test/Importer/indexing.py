# RUN: %PYTHON %s | FileCheck %s
# FX importer: indexing, gather/scatter, FFT and miscellaneous math
# (compiler/lowering/indexing.py, fft.py, pointwise.py, activations.py, losses.py, distances.py). Each case prints its name, then the
# imported module.

import torch
from torch.fx.experimental.proxy_tensor import make_fx
from torch_tpu.compiler.importer import import_graph

aten = torch.ops.aten


def run(name, fn, *args):
    print(name)
    print(import_graph(make_fx(fn, tracing_mode="fake")(*args)).text())


X = torch.randn(4, 5, 6)
I = torch.tensor([0, -1, 2])
J = torch.tensor([1, 2, -3])

# Adjacent advanced indices: negative indices wrap, the indices are stacked, and the
# index dim replaces the indexed dims in place (offset dim 0 is the sliced dim).
# CHECK-LABEL: test_index_adjacent
# CHECK: stablehlo.compare LT, %{{.*}}, %{{.*}}, SIGNED : (tensor<3xi32>, tensor<3xi32>) -> tensor<3xi1>
# CHECK: stablehlo.concatenate %{{.*}}, %{{.*}}, dim = 1 : (tensor<3x1xi32>, tensor<3x1xi32>) -> tensor<3x2xi32>
# CHECK: "stablehlo.gather"(%arg0,
# CHECK-SAME: offset_dims = [0], collapsed_slice_dims = [1, 2], start_index_map = [1, 2], index_vector_dim = 1
# CHECK-SAME: slice_sizes = array<i64: 4, 1, 1>
# CHECK-SAME: -> tensor<4x3xf32>
run("test_index_adjacent", lambda x, i, j: x[:, i, j], X, I, J)

# Advanced indices separated by a slice: the index dim goes first (NumPy's rule).
# CHECK-LABEL: test_index_separated
# CHECK: "stablehlo.gather"
# CHECK-SAME: offset_dims = [1], collapsed_slice_dims = [0, 2], start_index_map = [0, 2]
# CHECK-SAME: -> tensor<3x5xf32>
run("test_index_separated", lambda x, i, j: aten.index.Tensor(x, [i, None, j]), X, I, J)

# index_put with accumulate=True is a scatter-add of the broadcast values.
# CHECK-LABEL: test_index_put_accumulate
# CHECK: stablehlo.broadcast_in_dim %arg2, dims = [2] : (tensor<6xf32>) -> tensor<4x3x6xf32>
# CHECK: "stablehlo.scatter"(%arg0,
# CHECK-SAME: update_window_dims = [0, 2], inserted_window_dims = [1], scatter_dims_to_operand_dims = [1]
# CHECK: stablehlo.add
run("test_index_put_accumulate", lambda x, i, v: aten.index_put(x, [None, i], v, True), X, I, torch.randn(6))

# A boolean mask with a scalar value is a select, not a data-dependent scatter.
# CHECK-LABEL: test_index_put_mask
# CHECK-NOT: stablehlo.scatter
# CHECK: stablehlo.select
run("test_index_put_mask", lambda x, m, v: aten.index_put(x, [m], v), X, X > 0, torch.tensor(0.0))

# gather: the other dims are gather batching dims (no iota index tensors).
# CHECK-LABEL: test_gather
# CHECK-NOT: stablehlo.slice
# CHECK: "stablehlo.gather"
# CHECK-SAME: collapsed_slice_dims = [1], operand_batching_dims = [0, 2], start_indices_batching_dims = [0, 2], start_index_map = [1], index_vector_dim = 3
run("test_gather", lambda x, i: torch.gather(x, 1, i), X, torch.zeros(4, 2, 6, dtype=torch.long))

# scatter_reduce without self: the touched positions are first reset to the identity
# (-inf for amax), then reduced with maximum.
# CHECK-LABEL: test_scatter_reduce_amax
# CHECK: %[[NEG_INF:.*]] = stablehlo.constant dense<0xFF800000> : tensor<4x2x6xf32>
# CHECK: %[[RESET:.*]] = "stablehlo.scatter"(%arg0, %{{.*}}, %[[NEG_INF]])
# CHECK: "stablehlo.scatter"(%[[RESET]], %{{.*}}, %arg2)
# CHECK: stablehlo.maximum
run(
    "test_scatter_reduce_amax",
    lambda x, i, s: torch.scatter_reduce(x, 1, i, s, "amax", include_self=False),
    X, torch.zeros(4, 2, 6, dtype=torch.long), torch.randn(4, 2, 6),
)

# masked_scatter: positions from a log-step prefix sum of the mask, then one gather.
# CHECK-LABEL: test_masked_scatter
# CHECK: stablehlo.pad
# CHECK: "stablehlo.gather"
# CHECK: stablehlo.select
run("test_masked_scatter", lambda x, m, s: x.masked_scatter(m, s), X, X > 0, torch.randn(120))

# Data-dependent ops fail with a message naming the reason.
# CHECK-LABEL: test_nonzero_fails
# CHECK: nonzero is not supported: its output shape depends on the values of a tensor
print("test_nonzero_fails")
try:
    import_graph(make_fx(lambda x: torch.nonzero(x), tracing_mode="real")(X))
except Exception as err:  # noqa: BLE001
    print(err)

# rfftn over dims (0, 2): dim 0 is moved next to dim 2, the last listed dim is halved,
# and norm="ortho" scales by 1/sqrt(4 * 6).
# CHECK-LABEL: test_rfftn
# CHECK: stablehlo.transpose %arg0, dims = [1, 0, 2] : (tensor<4x5x6xf32>) -> tensor<5x4x6xf32>
# CHECK: stablehlo.fft %{{.*}}, type = RFFT, length = [4, 6] : (tensor<5x4x6xf32>) -> tensor<5x4x4xcomplex<f32>>
# CHECK: stablehlo.transpose %{{.*}}, dims = [1, 0, 2]
# CHECK: stablehlo.constant dense<0.204124153>
run("test_rfftn", lambda x: torch.fft.rfftn(x, dim=(0, 2), norm="ortho"), X)

# irfft: XLA's inverse already divides by n, so the default norm adds no scaling.
# CHECK-LABEL: test_irfft
# CHECK: stablehlo.fft %arg0, type = IRFFT, length = [8] : (tensor<3x5xcomplex<f32>>) -> tensor<3x8xf32>
# CHECK-NOT: stablehlo.multiply
run("test_irfft", lambda x: torch.fft.irfft(x, n=8), torch.randn(3, 5, dtype=torch.complex64))

# cdist with p=1: broadcast differences, |.|, one sum over the feature dim.
# CHECK-LABEL: test_cdist_p1
# CHECK: stablehlo.broadcast_in_dim %arg0, dims = [0, 2] : (tensor<3x4xf32>) -> tensor<3x5x4xf32>
# CHECK: stablehlo.broadcast_in_dim %arg1, dims = [1, 2] : (tensor<5x4xf32>) -> tensor<3x5x4xf32>
# CHECK: stablehlo.abs
# CHECK: applies stablehlo.add across dimensions = [2]
run("test_cdist_p1", lambda a, b: torch.cdist(a, b, p=1.0), torch.randn(3, 4), torch.randn(5, 4))

# nll_loss_forward: a one-hot select over the class dim instead of a gather; the classes
# compared in int32 (ignored targets are -1 per sample), once per element.
# CHECK-LABEL: test_nll_loss
# CHECK: stablehlo.iota dim = 1 : tensor<6x4xi32>
# CHECK: stablehlo.compare EQ, %{{.*}}, %{{.*}} : (tensor<6x4xi32>, tensor<6x4xi32>) -> tensor<6x4xi1>
# CHECK-NOT: stablehlo.and
# CHECK-NOT: stablehlo.gather
# CHECK: return %{{.*}}, %{{.*}} : tensor<f32>, tensor<f32>
run("test_nll_loss", lambda x, t: aten.nll_loss_forward(x, t, None, 1, -100), torch.randn(6, 4), torch.tensor([0, 3, -100, 1, 3, 2]))
