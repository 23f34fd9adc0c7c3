# RUN: %PYTHON %s | FileCheck %s
# FX importer: special functions and the remaining elementwise math
# (compiler/lowering/special/). Each case prints its name, then the imported module.

import torch
from torch.fx.experimental.proxy_tensor import make_fx
from torch_tpu.compiler.importer import import_graph

S = torch.special


def run(name, fn, *args):
    print(name)
    print(import_graph(make_fx(fn, tracing_mode="fake")(*args)).text())


X = torch.randn(3)

# Cephes j0: both branches computed, the asymptotic one with sin/cos, then selected.
# CHECK-LABEL: test_bessel_j0
# CHECK: stablehlo.sine
# CHECK: stablehlo.cosine
# CHECK: stablehlo.compare LE
# CHECK: stablehlo.select
# CHECK: return %{{.*}} : tensor<3xf32>
run("test_bessel_j0", S.bessel_j0, X)

# A polynomial of tensor degree: the recurrence is a while loop that runs while any
# element is still iterating (an OR-reduce in the condition) and freezes the others.
# CHECK-LABEL: test_legendre_polynomial_p
# CHECK: stablehlo.convert %{{.*}} : (tensor<3xf32>) -> tensor<3xi64>
# CHECK: stablehlo.while
# CHECK: cond {
# CHECK: stablehlo.reduce(%{{.*}} init: %{{.*}}) applies stablehlo.or across dimensions = [0]
# CHECK: } do {
# CHECK: stablehlo.divide
# CHECK: stablehlo.select
# CHECK: return %{{.*}} : tensor<3xf32>
run("test_legendre_polynomial_p", S.legendre_polynomial_p, X, torch.rand(3))

# zeta accumulates in double for float inputs, as PyTorch's CPU kernel does.
# CHECK-LABEL: test_zeta_accumulates_in_f64
# CHECK: stablehlo.convert %arg0 : (tensor<3xf32>) -> tensor<3xf64>
# CHECK: stablehlo.power %{{.*}}, %{{.*}} : tensor<3xf64>
# CHECK: stablehlo.while
# CHECK: stablehlo.convert %{{.*}} : (tensor<3xf64>) -> tensor<3xf32>
run("test_zeta_accumulates_in_f64", S.zeta, X, torch.rand(3))

# erfcx looks its per-interval polynomial coefficients up in 100-entry tables.
# CHECK-LABEL: test_erfcx
# CHECK: "stablehlo.gather"
# CHECK-SAME: (tensor<100xf32>, tensor<3x1xi32>) -> tensor<3xf32>
run("test_erfcx", S.erfcx, X)

# frexp works on the bits (subnormals are normalised with a leading-zero count).
# CHECK-LABEL: test_frexp
# CHECK: stablehlo.bitcast_convert %arg0 : (tensor<3xf32>) -> tensor<3xi32>
# CHECK: stablehlo.count_leading_zeros
# CHECK: stablehlo.bitcast_convert %{{.*}} : (tensor<3xi32>) -> tensor<3xf32>
# CHECK: return %{{.*}}, %{{.*}} : tensor<3xf32>, tensor<3xi32>
run("test_frexp", torch.frexp, X)

# fmax: maximum, then the non-NaN operand wherever one of them is NaN.
# CHECK-LABEL: test_fmax
# CHECK: stablehlo.maximum %{{.*}}, %{{.*}} : tensor<2x3xf32>
# CHECK: stablehlo.compare NE
# CHECK: stablehlo.select
# CHECK: stablehlo.select
# CHECK: return %{{.*}} : tensor<2x3xf32>
run("test_fmax", torch.fmax, X, torch.randn(2, 1))

# signbit reads the sign bit (true for -0.0 and negative NaNs).
# CHECK-LABEL: test_signbit
# CHECK: stablehlo.bitcast_convert %arg0 : (tensor<3xf16>) -> tensor<3xi16>
# CHECK: stablehlo.compare LT, %{{.*}}, %{{.*}}, SIGNED
run("test_signbit", torch.signbit, X.half())
