# RUN: %PYTHON %s | FileCheck %s
# FX importer: elementwise ops (compiler/lowering/elementwise.py). Each case prints its
# name, then the imported module.

import torch
from torch.fx.experimental.proxy_tensor import make_fx
from torch_tpu.compiler.importer import import_graph


def run(name, fn, *args):
    print(name)
    print(import_graph(make_fx(fn, tracing_mode="fake")(*args)).text())


X = torch.randn(2, 3)
I = torch.randint(0, 5, (2, 3), dtype=torch.int32)

# Type promotion: an int tensor plus a float scalar computes in the default float dtype.
# CHECK-LABEL: test_int_plus_float_scalar
# CHECK: stablehlo.convert %arg0 : (tensor<2x3xi32>) -> tensor<2x3xf32>
# CHECK: stablehlo.add %{{.*}}, %{{.*}} : tensor<2x3xf32>
run("test_int_plus_float_scalar", lambda a: a + 1.5, I)

# Broadcasting goes through broadcast_in_dim, never implicit broadcasting.
# CHECK-LABEL: test_broadcast_add_alpha
# CHECK: stablehlo.broadcast_in_dim %arg1, dims = [1] : (tensor<3xf32>) -> tensor<2x3xf32>
# CHECK: stablehlo.multiply
# CHECK: stablehlo.add
run("test_broadcast_add_alpha", lambda a, b: torch.add(a, b, alpha=2), X, torch.randn(3))

# Comparisons pick the compare type from the dtype.
# CHECK-LABEL: test_compare_types
# CHECK: stablehlo.compare LT, %{{.*}}, %{{.*}}, FLOAT
# CHECK: stablehlo.compare GE, %{{.*}}, %{{.*}}, SIGNED
run("test_compare_types", lambda a, b: (a < 0, b >= 2), X, I)

# Python-style remainder: the sign of the divisor, via a select on the C remainder.
# CHECK-LABEL: test_remainder
# CHECK: %[[REM:.*]] = stablehlo.remainder %arg0
# CHECK: stablehlo.select %{{.*}}, %{{.*}}, %[[REM]]
run("test_remainder", lambda a: torch.remainder(a, 0.7), X)

# gelu (erf form) uses chlo.erf; the tanh approximation uses stablehlo.tanh.
# CHECK-LABEL: test_gelu
# CHECK: chlo.erf
# CHECK-NOT: stablehlo.tanh
# CHECK-LABEL: test_gelu_tanh
# CHECK: stablehlo.tanh
run("test_gelu", lambda a: torch.nn.functional.gelu(a), X)
run("test_gelu_tanh", lambda a: torch.nn.functional.gelu(a, approximate="tanh"), X)
