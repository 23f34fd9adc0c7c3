// RUN: not torchtpu-run %s --input-literal '2xf32=1' 2>&1 | FileCheck %s --check-prefix=COUNT
// RUN: not torchtpu-run %s --input-literal '2xf32=1' --input-literal '3xf32=1' 2>&1 | FileCheck %s --check-prefix=SHAPE
// RUN: not torchtpu-run %s --input-literal '2xf32=1' --input-literal '2xi32=1' 2>&1 | FileCheck %s --check-prefix=DTYPE
// RUN: not torchtpu-run %s --input %t.missing.npy --input-literal '2xf32=1' 2>&1 | FileCheck %s --check-prefix=NOINPUT
// RUN: not torchtpu-run %t.missing.mlir 2>&1 | FileCheck %s --check-prefix=NOFILE
// RUN: not torchtpu-run %s --input-literal '2xf32=1,2,3' --input-literal '2xf32=1' 2>&1 | FileCheck %s --check-prefix=LITERAL
// RUN: not torchtpu-run %s --replicas 3 --per-replica-inputs --input-literal '2xf32=1' 2>&1 | FileCheck %s --check-prefix=REPLICAS

// Wrong inputs are one-line errors (exit 1, no traceback) that say what the module takes.

// COUNT:    torchtpu-run: error: run-errors.mlir: @main takes 2 arguments (tensor<2xf32>, tensor<2xf32>), got 1 input (expected 2)
// COUNT-NOT: Traceback
// SHAPE:    torchtpu-run: error: run-errors.mlir: argument 1 (--input-literal '3xf32=1'): expected tensor<2xf32>, got tensor<3xf32>
// DTYPE:    torchtpu-run: error: run-errors.mlir: argument 1 (--input-literal '2xi32=1'): expected tensor<2xf32>, got tensor<2xi32>
// NOINPUT:  torchtpu-run: error: cannot read input '{{.*}}.missing.npy': no such file
// NOFILE:   torchtpu-run: error: cannot read '{{.*}}.missing.mlir': No such file or directory
// LITERAL:  torchtpu-run: error: --input-literal '2xf32=1,2,3': 2 values needed for shape [2], got 3
// REPLICAS: torchtpu-run: error: run-errors.mlir: @main takes 2 arguments (tensor<2xf32>, tensor<2xf32>), got 1 input (expected 2 per replica x 3 replicas = 6)

module @add {
  func.func public @main(%a: tensor<2xf32>, %b: tensor<2xf32>) -> tensor<2xf32> {
    %0 = stablehlo.add %a, %b : tensor<2xf32>
    return %0 : tensor<2xf32>
  }
}
