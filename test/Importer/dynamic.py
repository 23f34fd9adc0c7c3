# RUN: %PYTHON %s | FileCheck %s
# FX importer with symbolic sizes (bounded dynamism, compiler/importer/dynamic.py,
# the dynamic rules of compiler/lowering/). Graphs come from torch.export with a dynamic
# dim `s` <= 16; each case prints its name, then the imported module.

import torch
from torch.export import Dim
from torch_tpu.compiler.importer import import_graph
from torch_tpu.compiler.importer.dynamic import symbol_bounds_from

S = Dim("s", min=2, max=16)


def run(name, fn, args, dynamic_shapes):
    print(name)
    gm = (
        torch.export.export(fn, args, dynamic_shapes={"args": dynamic_shapes})
        .run_decompositions()
        .graph_module
    )
    print(import_graph(gm, symbol_bounds=symbol_bounds_from(gm, lambda size: 64)).text())


class Fn(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *args):
        return self.fn(*args)


X = torch.randn(2, 5, 8)
W = torch.randn(4, 8)

# The dynamic argument is `?` with its bound; its size is read, the buffer is used at its
# bound with the size attached, and the result is returned as `?`. The linear layer's
# flatten to [2*s, 8] stays in place (no gather): its rows are interleaved with padding
# and the inverse view restores them.
# CHECK-LABEL: test_linear
# CHECK:       func.func @main(%{{.*}}: tensor<2x?x8xf32> {torchtpu.bounds = array<i64: -1, 16, -1>}, %{{.*}}: tensor<4x8xf32>) -> tensor<2x?x4xf32>
# CHECK:         %[[N:.*]] = stablehlo.get_dimension_size %arg0, dim = 1
# CHECK:         stablehlo.set_dimension_size %arg0, %[[N]], dim = 1 : (tensor<2x?x8xf32>, tensor<i32>) -> tensor<2x16x8xf32>
# CHECK-NOT:     stablehlo.gather
# CHECK:         stablehlo.dot_general {{.*}} -> tensor<32x4xf32>
# CHECK-NOT:     stablehlo.gather
# CHECK:         stablehlo.set_dimension_size {{.*}} dim = 1 : (tensor<2x16x4xf32>, tensor<i32>) -> tensor<2x?x4xf32>
run("test_linear", Fn(lambda x, w: torch.nn.functional.linear(x, w)), (X, W), ({1: S}, None))

# A mean over the dynamic dim divides by the run-time size, not the bound.
# CHECK-LABEL: test_mean
# CHECK:         %[[N:.*]] = stablehlo.get_dimension_size %arg0, dim = 1
# CHECK:         %[[N64:.*]] = stablehlo.convert %[[N]] : (tensor<i32>) -> tensor<i64>
# CHECK:         stablehlo.reduce
# CHECK:         stablehlo.convert %[[N64]] : (tensor<i64>) -> tensor<f32>
# CHECK:         stablehlo.divide
run("test_mean", Fn(lambda x: x.mean(1)), (X,), ({1: S},))

# The last element along the dynamic dim starts at the run-time size minus one.
# CHECK-LABEL: test_last
# CHECK:         stablehlo.add {{.*}} : tensor<i64>
# CHECK:         stablehlo.dynamic_slice
run("test_last", Fn(lambda x: x[:, -1] * 2), (X,), ({1: S},))

# A size used as a value (`x * s`) is its run-time value.
# CHECK-LABEL: test_size_value
# CHECK:         %[[N:.*]] = stablehlo.get_dimension_size %arg0, dim = 1
# CHECK:         %[[N64:.*]] = stablehlo.convert %[[N]] : (tensor<i32>) -> tensor<i64>
# CHECK:         stablehlo.convert %[[N64]] : (tensor<i64>) -> tensor<f32>
# CHECK:         stablehlo.multiply
run("test_size_value", Fn(lambda x: x * x.shape[1]), (X,), ({1: S},))
