// RUN: torchtpu-opt %s --emit-bytecode -o %t.mlirbc
// RUN: torchtpu-opt %t.mlirbc | FileCheck %s
// RUN: torchtpu-opt %s --emit-bytecode | torchtpu-opt - --torchtpu-verify --mlir-print-debuginfo | FileCheck %s --check-prefix=LOC
// RUN: not torchtpu-opt %s --emit-bytecode --split-input-file 2>&1 | FileCheck %s --check-prefix=SPLIT

// Bytecode keeps ops (torchtpu ones included), types and locations: written, read
// back (from a file or stdin) and printed, it is the same module.

// CHECK-LABEL: func.func @f
// CHECK-SAME:    (%[[REF:.*]]: !torchtpu.ref<tensor<4xf32>>, %[[X:.*]]: tensor<4xf32>) -> tensor<4xf32>
// CHECK:         %[[V:.*]] = "torchtpu.load"(%[[REF]]) : (!torchtpu.ref<tensor<4xf32>>) -> tensor<4xf32>
// CHECK:         %[[S:.*]] = stablehlo.add %[[V]], %[[X]] : tensor<4xf32>
// CHECK:         "torchtpu.store"(%[[REF]], %[[S]])
// CHECK:         return %[[S]]

// LOC: stablehlo.add {{.*}} loc(#[[L:loc[0-9]*]])
// LOC: #[[L]] = loc("{{.*}}emit-bytecode.mlir":[[# @LINE + 6]]:8)

// SPLIT: torchtpu-opt: error: --emit-bytecode cannot be combined with --split-input-file

func.func @f(%r: !torchtpu.ref<tensor<4xf32>>, %x: tensor<4xf32>) -> tensor<4xf32> {
  %0 = "torchtpu.load"(%r) : (!torchtpu.ref<tensor<4xf32>>) -> tensor<4xf32>
  %1 = stablehlo.add %0, %x : tensor<4xf32>
  "torchtpu.store"(%r, %1) : (!torchtpu.ref<tensor<4xf32>>, tensor<4xf32>) -> ()
  return %1 : tensor<4xf32>
}
