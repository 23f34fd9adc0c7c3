// RUN: torchtpu-opt - --canonicalize < %s | FileCheck %s
// RUN: torchtpu-opt --canonicalize < %s | FileCheck %s
// RUN: not torchtpu-opt - < %S/Inputs/parse-error.mlir 2>&1 | FileCheck %s --check-prefix=ERR
// RUN: not torchtpu-opt %t.does-not-exist.mlir 2>&1 | FileCheck %s --check-prefix=MISSING

// Input from stdin, named '-' or implied; its diagnostics name <stdin>.

// CHECK-LABEL: func.func @f
// CHECK-NEXT:    return %arg0
// ERR:         <stdin>:2:3: error: custom op 'stablehlo.frobnicate' is unknown
// MISSING:     torchtpu-opt: error: could not open input file '{{.*}}.does-not-exist.mlir': No such file or directory

func.func @f(%a: tensor<4xf32>) -> tensor<4xf32> {
  %0 = stablehlo.add %a, %a : tensor<4xf32>
  return %a : tensor<4xf32>
}
