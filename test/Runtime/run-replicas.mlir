// RUN: torchtpu-run %s --replicas 4 --input-literal '2xf32=1,2' | FileCheck %s
// RUN: torchtpu-run %s --replicas 4 --per-replica-inputs --input-literal '2xf32=1,2' --input-literal '2xf32=10,20' --input-literal '2xf32=0' --input-literal '2xf32=100,200' | FileCheck %s --check-prefix=PER
// RUN: not torchtpu-run %s --replicas 2 --input-literal '2xf32=1,2' 2>&1 | FileCheck %s --check-prefix=WRONG

// N replicas on N (virtual CPU) devices with a collective across them. Every replica
// gets the same inputs, or its own with --per-replica-inputs (listed replica by replica).

// CHECK:      replica[0] result[0]: tensor<2xf32>
// CHECK-NEXT: [4, 8]
// CHECK-NEXT: replica[0] result[1]: tensor<ui32>
// CHECK-NEXT: 0
// CHECK:      replica[3] result[0]: tensor<2xf32>
// CHECK-NEXT: [4, 8]
// CHECK-NEXT: replica[3] result[1]: tensor<ui32>
// CHECK-NEXT: 3

// PER:      replica[0] result[0]: tensor<2xf32>
// PER-NEXT: [111, 222]
// PER:      replica[1] result[0]: tensor<2xf32>
// PER-NEXT: [111, 222]
// PER-NEXT: replica[1] result[1]: tensor<ui32>
// PER-NEXT: 1

// A replica count the module's collectives do not fit is XLA's one-line error.
// WRONG-NOT: stack trace
// WRONG:     run-replicas.mlir: error: XLA cannot compile the module: {{.*}}replica groups should contain 2 replicas, but found 4

module @allreduce {
  func.func public @main(%a: tensor<2xf32>) -> (tensor<2xf32>, tensor<ui32>) {
    %0 = "stablehlo.all_reduce"(%a) ({
      ^bb0(%x: tensor<f32>, %y: tensor<f32>):
        %s = stablehlo.add %x, %y : tensor<f32>
        stablehlo.return %s : tensor<f32>
    }) {replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>} : (tensor<2xf32>) -> tensor<2xf32>
    %r = stablehlo.replica_id : tensor<ui32>
    return %0, %r : tensor<2xf32>, tensor<ui32>
  }
}
