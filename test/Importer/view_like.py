# RUN: %PYTHON %s | FileCheck %s
# FX importer: view-like/shape ops and tensor creation (compiler/lowering/view_like.py,
# compiler/lowering/creation.py). Each case prints its name, then the imported module.

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from torch_tpu.compiler.importer import import_graph

aten = torch.ops.aten


def run(name, fn, *args):
    print(name)
    print(import_graph(make_fx(fn, tracing_mode="fake")(*args)).text())


X = torch.randn(2, 3, 4)
M = torch.randn(4, 6)

# CHECK-LABEL: test_view_permute
# CHECK: stablehlo.reshape %{{.*}} : (tensor<2x3x4xf32>) -> tensor<6x4xf32>
# CHECK: stablehlo.transpose %{{.*}}, dims = [1, 0] : (tensor<6x4xf32>) -> tensor<4x6xf32>
run("test_view_permute", lambda x: x.view(6, 4).permute(1, 0), X)

# Negative start, overflowing end and a step all become one strided slice.
# CHECK-LABEL: test_slice_step
# CHECK: stablehlo.slice %{{.*}} [0:2, 0:3, 1:4:2] : (tensor<2x3x4xf32>) -> tensor<2x3x2xf32>
run("test_slice_step", lambda x: x[..., -3:100:2], X)

# cat promotes its inputs; the empty 1-D tensor is skipped.
# CHECK-LABEL: test_cat_promotes
# CHECK: stablehlo.convert %{{.*}} : (tensor<4x6xi64>) -> tensor<4x6xf32>
# CHECK: stablehlo.concatenate %{{[^,]*}}, %{{[^,]*}}, dim = 1 : (tensor<4x6xf32>, tensor<4x6xf32>) -> tensor<4x12xf32>
run("test_cat_promotes", lambda a, b, e: torch.cat([a, e, b], 1), M, M.long(), torch.empty(0))

# Negative pads crop.
# CHECK-LABEL: test_constant_pad_negative
# CHECK: stablehlo.pad %{{.*}}, %{{.*}}, low = [0, 0, -1], high = [0, 0, 2], interior = [0, 0, 0] : (tensor<2x3x4xf32>, tensor<f32>) -> tensor<2x3x5xf32>
run("test_constant_pad_negative", lambda x: aten.constant_pad_nd(x, [-1, 2], 0.5), X)

# The diagonal is a strided slice of the flattened square block.
# CHECK-LABEL: test_diagonal
# CHECK: stablehlo.slice %{{.*}} [0:4, 1:5]
# CHECK: stablehlo.reshape %{{.*}} : (tensor<4x4xf32>) -> tensor<16xf32>
# CHECK: stablehlo.slice %{{.*}} [0:16:5] : (tensor<16xf32>) -> tensor<4xf32>
run("test_diagonal", lambda m: m.diagonal(1), M)

# as_strided reads a window of the (contiguous) input's storage (storage_layout.py): a
# window that is a transposed dense block is a slice, a reshape and a transpose...
# CHECK-LABEL: test_as_strided_dense_window
# CHECK: stablehlo.reshape %{{.*}} : (tensor<4x6xf32>) -> tensor<24xf32>
# CHECK: stablehlo.slice %{{.*}} [3:7] : (tensor<24xf32>) -> tensor<4xf32>
# CHECK: stablehlo.reshape %{{.*}} : (tensor<4xf32>) -> tensor<2x2xf32>
# CHECK: stablehlo.transpose %{{.*}}, dims = [1, 0]
# CHECK-NOT: stablehlo.gather
# CHECK: return
run("test_as_strided_dense_window", lambda m: m.as_strided((2, 2), (1, 2), 3), M)

# ... an overlapping one a gather at its static positions.
# CHECK-LABEL: test_as_strided_overlapping_window
# CHECK: stablehlo.constant dense<{{\[}}[1], [3], [5], [2], [4], [6], [3], [5], [7]]> : tensor<9x1xi32>
# CHECK: "stablehlo.gather"
# CHECK-SAME: -> tensor<9xf32>
# CHECK: stablehlo.reshape %{{.*}} : (tensor<9xf32>) -> tensor<3x3xf32>
run("test_as_strided_overlapping_window", lambda m: m.as_strided((3, 3), (1, 2), 1), M)

# as_strided_scatter into a dense block, or into a box of the storage seen as a row-major
# block array, updates it in place; into any other window, every storage position gathers
# its new value from [src, old storage].
# CHECK-LABEL: test_as_strided_scatter_dense_window
# CHECK: stablehlo.transpose %{{.*}}, dims = [1, 0] : (tensor<2x3xf32>) -> tensor<3x2xf32>
# CHECK: stablehlo.dynamic_update_slice %{{.*}}, %{{.*}}, %{{.*}} : (tensor<24xf32>, tensor<6xf32>, tensor<i64>) -> tensor<24xf32>
# CHECK-NOT: stablehlo.gather
# CHECK: return
run("test_as_strided_scatter_dense_window", lambda m, s: torch.as_strided_scatter(m, s, (2, 3), (1, 2), 4), M,
    torch.ones(2, 3))

# CHECK-LABEL: test_as_strided_scatter_box_window
# CHECK: stablehlo.reshape %{{.*}} : (tensor<24xf32>) -> tensor<2x12xf32>
# CHECK: stablehlo.dynamic_update_slice %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}} : (tensor<2x12xf32>, tensor<2x2xf32>, tensor<i64>, tensor<i64>) -> tensor<2x12xf32>
# CHECK-NOT: stablehlo.gather
# CHECK: return
run("test_as_strided_scatter_box_window", lambda m, s: torch.as_strided_scatter(m, s, (2, 2), (12, 1), 3), M,
    torch.ones(2, 2))

# CHECK-LABEL: test_as_strided_scatter_gapped_window
# CHECK: stablehlo.concatenate %{{.*}}, %{{.*}}, dim = 0 : (tensor<4xf32>, tensor<24xf32>) -> tensor<28xf32>
# CHECK: "stablehlo.gather"
# CHECK-SAME: (tensor<28xf32>, tensor<24x1xi32>) -> tensor<24xf32>
# CHECK-NOT: dynamic_update_slice
# CHECK: return
run("test_as_strided_scatter_gapped_window", lambda m, s: torch.as_strided_scatter(m, s, (2, 2), (7, 2), 1), M,
    torch.ones(2, 2))

# CHECK-LABEL: test_slice_scatter
# CHECK: stablehlo.dynamic_update_slice
# CHECK-SAME: (tensor<4x6xf32>, tensor<4x2xf32>, tensor<i64>, tensor<i64>) -> tensor<4x6xf32>
run("test_slice_scatter", lambda m, s: torch.slice_scatter(m, s, 1, 2, 4), M, torch.ones(4, 2))

# CHECK-LABEL: test_arange
# CHECK: stablehlo.iota dim = 0 : tensor<5xi64>
# CHECK: stablehlo.multiply
# CHECK: stablehlo.add
run("test_arange", lambda x: torch.arange(10, 0, -2), X)

# Random ops thread the RNG state the importer adds as the last argument.
# CHECK-LABEL: test_dropout
# CHECK: func.func @main(%{{.*}}: tensor<4x6xf32>{{.*}}, %{{.*}}: tensor<2xui64>{{.*}}) -> (tensor<4x6xf32>, tensor<4x6xi1>)
# CHECK: stablehlo.rng_bit_generator {{.*}} -> (tensor<2xui64>, tensor<4x6xui32>)
# CHECK: stablehlo.compare LT
# CHECK: stablehlo.multiply
run("test_dropout", lambda m: aten.native_dropout(m, 0.25, True), M)

# CHECK-LABEL: test_randperm
# CHECK: stablehlo.rng_bit_generator {{.*}} -> (tensor<2xui64>, tensor<8xui64>)
# CHECK: "stablehlo.sort"
# CHECK: }) : (tensor<8xui64>, tensor<8xi64>) -> (tensor<8xui64>, tensor<8xi64>)
run("test_randperm", lambda x: torch.randperm(8), X)
