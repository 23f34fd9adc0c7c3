// RUN: torchtpu-opt %s --pass-pipeline='builtin.module(torchtpu-verify,func.func(cse),torchtpu-set-precision{mode=high})' --mlir-print-ir-after-all -o /dev/null 2>&1 | FileCheck %s --check-prefix=AFTER
// RUN: torchtpu-opt %s --torchtpu-set-precision --mlir-print-ir-before-all -o /dev/null 2>&1 | FileCheck %s --check-prefix=BEFORE
// RUN: torchtpu-opt %s --torchtpu-set-precision --mlir-print-ir-before-all --mlir-print-ir-after-all -o /dev/null 2>&1 | FileCheck %s --check-prefix=BOTH

// IR dumps go to stderr, one per pass, for our Python passes and upstream ones alike,
// showing the whole module.

// AFTER:      IR Dump After VerifyPass: torchtpu-verify ('builtin.module' operation)
// AFTER-NEXT: module {
// AFTER:      IR Dump After CSEPass: cse ('func.func' operation: @f)
// AFTER:      stablehlo.dot %{{.*}}, %{{.*}} :
// AFTER:      IR Dump After SetPrecisionPass: torchtpu-set-precision ('builtin.module' operation)
// AFTER:      stablehlo.dot %{{.*}}, %{{.*}}, precision = [HIGH, HIGH]
// AFTER-NOT:  IR Dump Before

// BEFORE:     IR Dump Before SetPrecisionPass: torchtpu-set-precision
// BEFORE-NOT: precision = [DEFAULT, DEFAULT]
// BEFORE-NOT: IR Dump After

// BOTH:       IR Dump Before SetPrecisionPass
// BOTH-NOT:   precision =
// BOTH:       IR Dump After SetPrecisionPass
// BOTH-NEXT:  module {
// BOTH:       precision = [DEFAULT, DEFAULT]

func.func @f(%a: tensor<2x2xf32>) -> tensor<2x2xf32> {
  %0 = stablehlo.dot %a, %a : (tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<2x2xf32>
  %1 = stablehlo.dot %a, %a : (tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<2x2xf32>
  %2 = stablehlo.add %0, %1 : tensor<2x2xf32>
  return %2 : tensor<2x2xf32>
}
