# RUN: %PYTHON %s | FileCheck %s
# FX importer, non-functional mode (compiler/importer/mutation.py): written storage is a
# !torchtpu.ref, views of it are torchtpu view ops, in-place / out= ops are the
# out-of-place op on loaded values plus a store. Each case prints its name, then the
# imported module.

import torch
from torch.fx.experimental.proxy_tensor import make_fx
from torch_tpu.compiler.importer import import_graph


def run(name, fn, *args):
    print(name)
    gm = make_fx(fn, tracing_mode="fake")(*args)
    print(import_graph(gm, functional=False).text())


# CHECK-LABEL: test_add_inplace_on_input
# CHECK: func.func @main(%[[X:.*]]: !torchtpu.ref<tensor<2x3xf32>>, %[[Y:.*]]: tensor<2x3xf32>)
# CHECK:   %[[V:.*]] = "torchtpu.load"(%[[X]])
# CHECK:   %[[S:.*]] = stablehlo.add %[[V]], %[[Y]]
# CHECK:   "torchtpu.store"(%[[X]], %[[S]])
run("test_add_inplace_on_input", lambda x, y: x.add_(y), torch.randn(2, 3), torch.randn(2, 3))

# A view of written storage is a view op; the write goes through it.
# CHECK-LABEL: test_setitem_kv_cache
# CHECK: %[[SEL:.*]] = "torchtpu.select"(%arg0) {dim = 2 : i64, index = 1 : i64} : (!torchtpu.ref<tensor<2x2x4x3xf32>>) -> !torchtpu.ref<tensor<2x2x3xf32>>
# CHECK: "torchtpu.store"(%[[SEL]], %arg1)
def kv(cache, k):
    cache[:, :, 1] = k


run("test_setitem_kv_cache", kv, torch.zeros(2, 2, 4, 3), torch.randn(2, 2, 3))

# Reads after a write load the reference again; transposed views are permutes.
# CHECK-LABEL: test_transposed_write_then_read
# CHECK: %[[T:.*]] = "torchtpu.permute"(%arg0) {permutation = array<i64: 1, 0>}
# CHECK: "torchtpu.store"(%[[T]],
# CHECK: "torchtpu.load"(%arg0)
# CHECK: stablehlo.sine
run("test_transposed_write_then_read", lambda x: (x.t().mul_(2), x.sin())[1], torch.randn(3, 3))

# out= writes into its out argument; a local tensor written in place is an alloc.
# CHECK-LABEL: test_out_and_alloc
# CHECK: %[[BUF:.*]] = "torchtpu.alloc"
# CHECK: %[[ROW:.*]] = "torchtpu.select"(%[[BUF]])
# CHECK: stablehlo.multiply
# CHECK: "torchtpu.store"(%[[ROW]],
def out_and_alloc(x):
    buf = torch.zeros(2, 3)
    torch.mul(x, 2, out=buf[0])
    return buf


run("test_out_and_alloc", out_and_alloc, torch.randn(3))

# Storage that is never written stays functional: no references at all.
# CHECK-LABEL: test_unwritten_views_stay_values
# CHECK-NOT: torchtpu.
# CHECK: stablehlo.transpose
run("test_unwritten_views_stay_values", lambda x: x.t().cos(), torch.randn(2, 3))
