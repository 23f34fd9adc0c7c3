// RUN: rm -f %t.mlir
// RUN: torchtpu-opt %s --torchtpu-set-precision=mode=highest -o %t.mlir > %t.stdout
// RUN: FileCheck %s --input-file %t.mlir
// RUN: FileCheck %s --input-file %t.stdout --check-prefix=EMPTY --allow-empty
// RUN: not torchtpu-opt %s -o %t.missing-dir/out.mlir 2>&1 | FileCheck %s --check-prefix=UNWRITABLE

// -o writes the result to the file and nothing to stdout.

// CHECK-LABEL: func.func @f
// CHECK:       precision = [HIGHEST, HIGHEST]
// EMPTY-NOT:   {{.}}
// UNWRITABLE:  torchtpu-opt: error: could not write output '{{.*}}.missing-dir/out.mlir': No such file or directory

func.func @f(%a: tensor<2x2xf32>) -> tensor<2x2xf32> {
  %0 = stablehlo.dot %a, %a : (tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<2x2xf32>
  return %0 : tensor<2x2xf32>
}
