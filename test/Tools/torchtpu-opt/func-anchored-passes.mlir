// RUN: torchtpu-opt %s --chlo-legalize-to-stablehlo | FileCheck %s
// RUN: torchtpu-opt %s --pass-pipeline='builtin.module(chlo-legalize-to-stablehlo)' | FileCheck %s
// RUN: torchtpu-opt %s --pass-pipeline='builtin.module(func.func(chlo-legalize-to-stablehlo))' | FileCheck %s
// RUN: torchtpu-opt %s --chlo-legalize-to-stablehlo --mlir-print-ir-after-all -o /dev/null 2>&1 | FileCheck %s --check-prefix=NESTED

// Upstream passes that only run on functions are nested under func.func for the user
// when named at module level, and run on every function.

// CHECK-LABEL: func.func @broadcast_add
// CHECK-NOT:     chlo.
// CHECK:         stablehlo.add
// CHECK-LABEL: func.func @erf
// CHECK-NOT:     chlo.erf
// CHECK:         stablehlo.
// NESTED: IR Dump After ChloLegalizeToStablehloPass{{.*}} ('func.func' operation: @broadcast_add)
// NESTED: IR Dump After ChloLegalizeToStablehloPass{{.*}} ('func.func' operation: @erf)

func.func @broadcast_add(%a: tensor<4xf32>, %b: tensor<4xf32>) -> tensor<4xf32> {
  %0 = chlo.broadcast_add %a, %b : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  return %0 : tensor<4xf32>
}

func.func @erf(%a: tensor<4xf32>) -> tensor<4xf32> {
  %0 = chlo.erf %a : tensor<4xf32> -> tensor<4xf32>
  return %0 : tensor<4xf32>
}
