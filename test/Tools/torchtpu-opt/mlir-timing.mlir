// RUN: torchtpu-opt %s --pass-pipeline='builtin.module(torchtpu-verify,canonicalize,func.func(cse))' --mlir-timing -o %t.mlir 2>&1 | FileCheck %s
// RUN: FileCheck %s --input-file %t.mlir --check-prefix=OUT

// The timing report (stderr) lists every pass, Python and upstream, in pipeline order;
// the module itself is unaffected.

// CHECK:      Execution time report
// CHECK:      Total Execution Time:
// CHECK:      Name
// CHECK:      VerifyPass
// CHECK-NEXT: CanonicalizerPass
// CHECK-NEXT: 'func.func' Pipeline
// CHECK-NEXT:   CSEPass
// CHECK:      Total

// OUT: func.func @f
func.func @f(%a: tensor<4xf32>) -> tensor<4xf32> {
  return %a : tensor<4xf32>
}
