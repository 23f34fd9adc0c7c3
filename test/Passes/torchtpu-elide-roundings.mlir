// RUN: torchtpu-opt %s --split-input-file --torchtpu-elide-roundings | FileCheck %s
// RUN: torchtpu-opt %s --split-input-file --pass-pipeline='builtin.module(torchtpu-compile-pipeline{elide-roundings=true})' | FileCheck %s --check-prefix=PIPELINE
// RUN: torchtpu-opt %s --split-input-file --pass-pipeline='builtin.module(torchtpu-compile-pipeline)' | FileCheck %s --check-prefix=EAGER

// SiLU's bfloat16 result read by the next op in float32: read unrounded, the round trip gone.
// CHECK-LABEL: func.func @silu_times_up
// CHECK:         %[[X:.*]] = stablehlo.convert %arg0 : (tensor<4x8xbf16>) -> tensor<4x8xf32>
// CHECK:         %[[S:.*]] = stablehlo.multiply %[[X]], %{{.*}} : tensor<4x8xf32>
// CHECK-NOT:     (tensor<4x8xf32>) -> tensor<4x8xbf16>
// CHECK:         %[[U:.*]] = stablehlo.convert %arg1 : (tensor<4x8xbf16>) -> tensor<4x8xf32>
// CHECK:         %[[P:.*]] = stablehlo.multiply %[[S]], %[[U]] : tensor<4x8xf32>
// CHECK:         %[[R:.*]] = stablehlo.convert %[[P]] : (tensor<4x8xf32>) -> tensor<4x8xbf16>
// CHECK:         return %[[R]]
// PIPELINE-LABEL: func.func @silu_times_up
// PIPELINE-NOT:   (tensor<4x8xf32>) -> tensor<4x8xbf16>
// PIPELINE:       stablehlo.multiply
// PIPELINE:       (tensor<4x8xf32>) -> tensor<4x8xbf16>
// PIPELINE-NEXT:  return
// EAGER-LABEL:   func.func @silu_times_up
// EAGER:         (tensor<4x8xf32>) -> tensor<4x8xbf16>
// EAGER:         (tensor<4x8xbf16>) -> tensor<4x8xf32>
func.func @silu_times_up(%g: tensor<4x8xbf16>, %u: tensor<4x8xbf16>) -> tensor<4x8xbf16> {
  %0 = stablehlo.convert %g : (tensor<4x8xbf16>) -> tensor<4x8xf32>
  %1 = stablehlo.logistic %0 : tensor<4x8xf32>
  %2 = stablehlo.multiply %0, %1 : tensor<4x8xf32>
  %3 = stablehlo.convert %2 : (tensor<4x8xf32>) -> tensor<4x8xbf16>
  %4 = stablehlo.convert %3 : (tensor<4x8xbf16>) -> tensor<4x8xf32>
  %5 = stablehlo.convert %g : (tensor<4x8xbf16>) -> tensor<4x8xf32>
  %6 = stablehlo.convert %u : (tensor<4x8xbf16>) -> tensor<4x8xf32>
  %7 = stablehlo.multiply %4, %6 : tensor<4x8xf32>
  %8 = stablehlo.convert %7 : (tensor<4x8xf32>) -> tensor<4x8xbf16>
  return %8 : tensor<4x8xbf16>
}

// -----

// A rounded intermediate that is also returned keeps its narrowing for that use (what the
// graph returns is rounded once); the op reading it in float32 reads it unrounded. Two
// widenings of one narrowing: both go, the narrowing once.
// CHECK-LABEL: func.func @returned_and_read
// CHECK:         %[[E:.*]] = stablehlo.exponential %arg0 : tensor<16xf32>
// CHECK:         %[[N:.*]] = stablehlo.convert %[[E]] : (tensor<16xf32>) -> tensor<16xf16>
// CHECK:         %[[A:.*]] = stablehlo.add %[[E]], %[[E]] : tensor<16xf32>
// CHECK:         return %[[N]], %[[A]]
func.func @returned_and_read(%x: tensor<16xf32>) -> (tensor<16xf16>, tensor<16xf32>) {
  %0 = stablehlo.exponential %x : tensor<16xf32>
  %1 = stablehlo.convert %0 : (tensor<16xf32>) -> tensor<16xf16>
  %2 = stablehlo.convert %1 : (tensor<16xf16>) -> tensor<16xf32>
  %3 = stablehlo.convert %1 : (tensor<16xf16>) -> tensor<16xf32>
  %4 = stablehlo.add %2, %3 : tensor<16xf32>
  return %1, %4 : tensor<16xf16>, tensor<16xf32>
}

// -----

// Left as they are: a scalar rounded to the tensor's dtype (a constant, a 0-dim value, a
// broadcast of one: PyTorch's kernels round `alpha` and the scalar of `x + 0.3` so), a
// widening then a narrowing (bf16 -> f32 -> bf16 is exact), a round trip through another
// wide type (f64 -> bf16 -> f64) and one that does not come back to its own type.
// CHECK-LABEL: func.func @kept
// CHECK-COUNT-2: (tensor<8xf32>) -> tensor<8xbf16>
// CHECK:         (tensor<f32>) -> tensor<bf16>
// CHECK:         (tensor<8xbf16>) -> tensor<8xf32>
// CHECK:         (tensor<8xf32>) -> tensor<8xbf16>
// CHECK:         (tensor<8xf64>) -> tensor<8xbf16>
// CHECK:         (tensor<8xbf16>) -> tensor<8xf64>
// CHECK:         (tensor<8xf32>) -> tensor<8xf16>
// CHECK:         (tensor<8xf16>) -> tensor<8xf64>
func.func @kept(%b: tensor<8xbf16>, %s: tensor<f32>, %d: tensor<8xf64>, %f: tensor<8xf32>) -> (tensor<8xf32>, tensor<f32>, tensor<8xbf16>, tensor<8xf64>, tensor<8xf64>) {
  %c = stablehlo.constant dense<3.000000e-01> : tensor<8xf32>
  %0 = stablehlo.convert %c : (tensor<8xf32>) -> tensor<8xbf16>
  %1 = stablehlo.convert %0 : (tensor<8xbf16>) -> tensor<8xf32>
  %2 = stablehlo.broadcast_in_dim %s, dims = [] : (tensor<f32>) -> tensor<8xf32>
  %3 = stablehlo.convert %2 : (tensor<8xf32>) -> tensor<8xbf16>
  %4 = stablehlo.convert %3 : (tensor<8xbf16>) -> tensor<8xf32>
  %5 = stablehlo.add %1, %4 : tensor<8xf32>
  %6 = stablehlo.convert %s : (tensor<f32>) -> tensor<bf16>
  %7 = stablehlo.convert %6 : (tensor<bf16>) -> tensor<f32>
  %8 = stablehlo.convert %b : (tensor<8xbf16>) -> tensor<8xf32>
  %9 = stablehlo.convert %8 : (tensor<8xf32>) -> tensor<8xbf16>
  %10 = stablehlo.convert %d : (tensor<8xf64>) -> tensor<8xbf16>
  %11 = stablehlo.convert %10 : (tensor<8xbf16>) -> tensor<8xf64>
  %12 = stablehlo.convert %f : (tensor<8xf32>) -> tensor<8xf16>
  %13 = stablehlo.convert %12 : (tensor<8xf16>) -> tensor<8xf64>
  return %5, %7, %9, %11, %13 : tensor<8xf32>, tensor<f32>, tensor<8xbf16>, tensor<8xf64>, tensor<8xf64>
}

// -----

// Roundings inductor keeps: a cast the user wrote (`x.to(torch.bfloat16).float()`, named by
// the importer's location) and a rounding whose value reaches a comparison through
// elementwise ops (an unrounded value can fall on the other side of a tie). SiLU's implicit
// rounding beside them goes.
// CHECK-LABEL: func.func @explicit_cast_and_comparison
// CHECK:         %[[C:.*]] = stablehlo.convert %arg0 : (tensor<8xf32>) -> tensor<8xbf16>
// CHECK:         stablehlo.convert %[[C]] : (tensor<8xbf16>) -> tensor<8xf32>
// CHECK:         %[[L:.*]] = stablehlo.logistic %arg0
// CHECK:         %[[R:.*]] = stablehlo.convert %[[L]] : (tensor<8xf32>) -> tensor<8xbf16>
// CHECK:         %[[W:.*]] = stablehlo.convert %[[R]] : (tensor<8xbf16>) -> tensor<8xf32>
// CHECK:         %[[M:.*]] = stablehlo.multiply %[[W]], %arg0
// CHECK:         stablehlo.compare GT, %[[M]]
// CHECK:         %[[E:.*]] = stablehlo.exponential %arg0
// CHECK-NOT:     (tensor<8xbf16>) -> tensor<8xf32>
// CHECK:         stablehlo.add %[[E]], %arg0
func.func @explicit_cast_and_comparison(%x: tensor<8xf32>) -> (tensor<8xf32>, tensor<8xi1>, tensor<8xf32>) {
  %0 = stablehlo.convert %x : (tensor<8xf32>) -> tensor<8xbf16> loc("aten._to_copy.default"("model.py":3:9))
  %1 = stablehlo.convert %0 : (tensor<8xbf16>) -> tensor<8xf32> loc("aten._to_copy.default"("model.py":3:9))
  %2 = stablehlo.logistic %x : tensor<8xf32>
  %3 = stablehlo.convert %2 : (tensor<8xf32>) -> tensor<8xbf16> loc("aten.sigmoid.default"("model.py":4:9))
  %4 = stablehlo.convert %3 : (tensor<8xbf16>) -> tensor<8xf32> loc("aten.mul.Tensor"("model.py":4:9))
  %5 = stablehlo.multiply %4, %x : tensor<8xf32>
  %c = stablehlo.constant dense<5.000000e-01> : tensor<8xf32>
  %6 = stablehlo.compare GT, %5, %c : (tensor<8xf32>, tensor<8xf32>) -> tensor<8xi1>
  %7 = stablehlo.exponential %x : tensor<8xf32>
  %8 = stablehlo.convert %7 : (tensor<8xf32>) -> tensor<8xbf16> loc("aten.exp.default"("model.py":5:9))
  %9 = stablehlo.convert %8 : (tensor<8xbf16>) -> tensor<8xf32> loc("aten.add.Tensor"("model.py":5:9))
  %10 = stablehlo.add %9, %x : tensor<8xf32>
  return %1, %6, %10 : tensor<8xf32>, tensor<8xi1>, tensor<8xf32>
}
