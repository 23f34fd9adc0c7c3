// RUN: torchtpu-opt %s --mlir-print-debuginfo | FileCheck %s
// RUN: torchtpu-opt %s | FileCheck %s --check-prefix=NOLOC

// Locations of the input file are kept through parsing and printed on request,
// including named and fused locations written in the input.

// CHECK-LABEL: func.func @f
// CHECK:       stablehlo.add {{.*}} loc(#[[ADD:loc[0-9]*]])
// CHECK:       stablehlo.multiply {{.*}} loc(#[[MUL:loc[0-9]*]])
// CHECK-DAG:   #[[ADD]] = loc("{{.*}}mlir-print-debuginfo.mlir":[[# @LINE + 7]]:8)
// CHECK-DAG:   #[[MUL]] = loc("layer1/mul"(#{{loc[0-9]*}}))
// CHECK-DAG:   loc("model.py":42:7)

// NOLOC-NOT:   loc(

func.func @f(%a: tensor<4xf32>) -> tensor<4xf32> {
  %0 = stablehlo.add %a, %a : tensor<4xf32>
  %1 = stablehlo.multiply %0, %a : tensor<4xf32> loc("layer1/mul"("model.py":42:7))
  return %1 : tensor<4xf32>
}
