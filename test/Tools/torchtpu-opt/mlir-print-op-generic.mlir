// RUN: torchtpu-opt %s --mlir-print-op-generic | FileCheck %s
// RUN: torchtpu-opt %s --mlir-print-op-generic | torchtpu-opt - | FileCheck %s --check-prefix=REPARSED

// Generic form: every op as "dialect.op"(operands) <{properties}> : type.

// CHECK:      "builtin.module"() ({
// CHECK:        "func.func"() <{function_type = (tensor<4xf32>) -> tensor<4xf32>, sym_name = "f"}> ({
// CHECK-NEXT:   ^bb0(%[[ARG:.*]]: tensor<4xf32>):
// CHECK-NEXT:     %[[SUM:.*]] = "stablehlo.add"(%[[ARG]], %[[ARG]]) : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
// CHECK-NEXT:     "func.return"(%[[SUM]]) : (tensor<4xf32>) -> ()

// The generic form parses back to the same module.
// REPARSED:      func.func @f(%[[A:.*]]: tensor<4xf32>) -> tensor<4xf32> {
// REPARSED-NEXT:   %[[S:.*]] = stablehlo.add %[[A]], %[[A]] : tensor<4xf32>
// REPARSED-NEXT:   return %[[S]] : tensor<4xf32>

func.func @f(%a: tensor<4xf32>) -> tensor<4xf32> {
  %0 = stablehlo.add %a, %a : tensor<4xf32>
  return %0 : tensor<4xf32>
}
