// RUN: torchtpu-opt %s --pass-pipeline='builtin.module(torchtpu-verify,canonicalize,func.func(cse),torchtpu-set-precision{mode=highest})' | FileCheck %s
// RUN: torchtpu-opt %s --torchtpu-verify --canonicalize --cse --torchtpu-set-precision=mode=highest | FileCheck %s
// RUN: torchtpu-opt %s --pass-pipeline='torchtpu-verify, func.func(canonicalize, cse), torchtpu-set-precision{ mode=highest }' | FileCheck %s

// Python passes and upstream MLIR passes in one pipeline, in either syntax: the
// upstream ones simplify (canonicalize erases the unused multiply, cse merges the two
// dots), ours sets the precision, and torchtpu ops survive untouched.

// CHECK-LABEL: func.func @f
// CHECK:         %[[V:.*]] = "torchtpu.load"
// CHECK:         %[[D:.*]] = stablehlo.dot %[[V]], %[[V]], precision = [HIGHEST, HIGHEST]
// CHECK-NOT:     stablehlo.dot
// CHECK-NOT:     stablehlo.multiply
// CHECK:         %[[S:.*]] = stablehlo.add %[[D]], %[[D]]
// CHECK:         "torchtpu.store"(%{{.*}}, %[[S]])
func.func @f(%r: !torchtpu.ref<tensor<2x2xf32>>) -> tensor<2x2xf32> {
  %v = "torchtpu.load"(%r) : (!torchtpu.ref<tensor<2x2xf32>>) -> tensor<2x2xf32>
  %0 = stablehlo.dot %v, %v : (tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<2x2xf32>
  %1 = stablehlo.dot %v, %v : (tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<2x2xf32>
  %unused = stablehlo.multiply %1, %1 : tensor<2x2xf32>
  %3 = stablehlo.add %0, %1 : tensor<2x2xf32>
  "torchtpu.store"(%r, %3) : (!torchtpu.ref<tensor<2x2xf32>>, tensor<2x2xf32>) -> ()
  return %3 : tensor<2x2xf32>
}
