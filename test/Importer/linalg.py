# RUN: %PYTHON %s | FileCheck %s
# FX importer: dense linear algebra (compiler/lowering/linalg/). Each case prints its
# name, then the imported module.

import torch
from torch.fx.experimental.proxy_tensor import make_fx
from torch_tpu.compiler.importer import import_graph

aten = torch.ops.aten


def run(name, fn, *args):
    print(name)
    print(import_graph(make_fx(fn, tracing_mode="fake")(*args)).text())


# Triangular solves map to stablehlo.triangular_solve after broadcasting batch dims;
# X A = B is a right-side solve.
# CHECK-LABEL: test_solve_triangular
# CHECK: stablehlo.broadcast_in_dim %arg1, dims = [1, 2] : (tensor<4x3xf32>) -> tensor<2x4x3xf32>
# CHECK: "stablehlo.triangular_solve"(%arg0, %{{.*}}) <{left_side = false, lower = false, transpose_a = #stablehlo<transpose NO_TRANSPOSE>, unit_diagonal = true}>
run("test_solve_triangular",
    lambda a, b: torch.linalg.solve_triangular(a, b, upper=True, left=False, unitriangular=True),
    torch.randn(2, 3, 3), torch.randn(4, 3))

# cholesky_solve: two triangular solves with the factor, the second one adjoint.
# CHECK-LABEL: test_cholesky_solve
# CHECK: "stablehlo.triangular_solve"(%arg1, %arg0) <{left_side = true, lower = true, transpose_a = #stablehlo<transpose NO_TRANSPOSE>
# CHECK: "stablehlo.triangular_solve"(%arg1, %{{.*}}) <{left_side = true, lower = true, transpose_a = #stablehlo<transpose ADJOINT>
run("test_cholesky_solve", lambda b, l: aten.cholesky_solve(b, l), torch.randn(3, 2), torch.randn(3, 3))

# Cholesky: stablehlo.cholesky with the upper triangle zeroed; LAPACK's info comes from
# a loop of its own, and upper=True transposes the factor.
# CHECK-LABEL: test_cholesky_ex
# CHECK: stablehlo.cholesky %arg0, lower = true : tensor<3x3xf32>
# CHECK: stablehlo.select
# CHECK: stablehlo.while
# CHECK: stablehlo.transpose %{{.*}}, dims = [1, 0]
# CHECK: return %{{.*}}, %{{.*}}#2 : tensor<3x3xf32>, tensor<i32>
run("test_cholesky_ex", lambda a: torch.linalg.cholesky_ex(a, upper=True), torch.randn(3, 3))

# LU with partial pivoting: a while loop over the 3 columns carrying the matrix, the row
# order and the int32 pivots; info from the diagonal.
# CHECK-LABEL: test_lu_factor
# CHECK: stablehlo.while(%{{.*}} = %{{.*}}, %{{.*}} = %arg0, %{{.*}} = %{{.*}}, %{{.*}} = %{{.*}}) : tensor<i32>, tensor<2x3x5xf32>, tensor<2x3xi32>, tensor<2x3xi32>
# CHECK: stablehlo.reduce
# CHECK: stablehlo.maximum
# CHECK: return %{{.*}}, %{{.*}}, %{{.*}} : tensor<2x3x5xf32>, tensor<2x3xi32>, tensor<2xi32>
run("test_lu_factor", lambda a: torch.linalg.lu_factor_ex(a), torch.randn(2, 3, 5))

# lu_solve: the pivots become a row order (a loop of interchanges), applied to B with a
# batched gather, then two triangular solves.
# CHECK-LABEL: test_lu_solve
# CHECK: stablehlo.while
# CHECK: "stablehlo.gather"{{.*}}operand_batching_dims = [0], start_indices_batching_dims = [0]
# CHECK: "stablehlo.triangular_solve"{{.*}}lower = true{{.*}}unit_diagonal = true
# CHECK: "stablehlo.triangular_solve"{{.*}}lower = false{{.*}}unit_diagonal = false
run("test_lu_solve", lambda lu, p, b: torch.linalg.lu_solve(lu, p, b),
    torch.randn(2, 3, 3), torch.ones(2, 3, dtype=torch.int32), torch.randn(2, 3, 4))

# eigh: Jacobi sweeps (an outer while over sweeps, an inner one over the rounds), then
# the eigenvalues sorted ascending with their eigenvectors.
# CHECK-LABEL: test_eigh
# CHECK: stablehlo.while
# CHECK: stablehlo.while
# CHECK: "stablehlo.sort"
# CHECK: return %{{.*}}, %{{.*}} : tensor<4xf32>, tensor<4x4xf32>
run("test_eigh", lambda a: torch.linalg.eigh(a), torch.randn(4, 4))
