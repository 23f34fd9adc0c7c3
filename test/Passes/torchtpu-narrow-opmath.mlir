// RUN: torchtpu-opt %s --split-input-file --torchtpu-narrow-opmath | FileCheck %s
// RUN: torchtpu-opt %s --split-input-file --pass-pipeline='builtin.module(torchtpu-compile-pipeline{elide-roundings=true})' | FileCheck %s --check-prefix=PIPELINE
// RUN: torchtpu-opt %s --split-input-file --pass-pipeline='builtin.module(torchtpu-compile-pipeline)' | FileCheck %s --check-prefix=EAGER

// A residual add of two bfloat16 values, spelled in float32 and rounded: the bfloat16 add,
// and the next add reading it (a chain narrows in one walk). The widenings go with it.
// CHECK-LABEL: func.func @residual_adds
// CHECK-NEXT:    %[[H:.*]] = stablehlo.add %arg0, %arg1 : tensor<4x8xbf16>
// CHECK-NEXT:    %[[H2:.*]] = stablehlo.add %[[H]], %arg2 : tensor<4x8xbf16>
// CHECK-NEXT:    return %[[H2]]
// PIPELINE-LABEL: func.func @residual_adds
// PIPELINE-COUNT-2: stablehlo.add {{.*}} : tensor<4x8xbf16>
// EAGER-LABEL:   func.func @residual_adds
// EAGER-COUNT-2: stablehlo.add {{.*}} : tensor<4x8xf32>
func.func @residual_adds(%x: tensor<4x8xbf16>, %a: tensor<4x8xbf16>, %m: tensor<4x8xbf16>) -> tensor<4x8xbf16> {
  %0 = stablehlo.convert %x : (tensor<4x8xbf16>) -> tensor<4x8xf32>
  %1 = stablehlo.convert %a : (tensor<4x8xbf16>) -> tensor<4x8xf32>
  %2 = stablehlo.add %0, %1 : tensor<4x8xf32>
  %3 = stablehlo.convert %2 : (tensor<4x8xf32>) -> tensor<4x8xbf16>
  %4 = stablehlo.convert %3 : (tensor<4x8xbf16>) -> tensor<4x8xf32>
  %5 = stablehlo.convert %m : (tensor<4x8xbf16>) -> tensor<4x8xf32>
  %6 = stablehlo.add %4, %5 : tensor<4x8xf32>
  %7 = stablehlo.convert %6 : (tensor<4x8xf32>) -> tensor<4x8xbf16>
  return %7 : tensor<4x8xbf16>
}

// -----

// Operands that are 16-bit values too: a constant exact in bfloat16 (2.0) and a broadcast
// of a widened bfloat16 weight, rebuilt in bfloat16; float16 likewise.
// CHECK-LABEL: func.func @constants_and_broadcasts
// CHECK:         %[[TWO:.*]] = stablehlo.constant dense<2.000000e+00> : tensor<4x8xbf16>
// CHECK:         %[[P:.*]] = stablehlo.multiply %arg0, %[[TWO]] : tensor<4x8xbf16>
// CHECK:         %[[W:.*]] = stablehlo.broadcast_in_dim %arg1, dims = [1] : (tensor<8xbf16>) -> tensor<4x8xbf16>
// CHECK:         stablehlo.multiply %[[P]], %[[W]] : tensor<4x8xbf16>
// CHECK:         stablehlo.subtract %arg2, %arg2 : tensor<4x8xf16>
// CHECK-NOT:     tensor<4x8xf32>
func.func @constants_and_broadcasts(%x: tensor<4x8xbf16>, %w: tensor<8xbf16>, %h: tensor<4x8xf16>) -> (tensor<4x8xbf16>, tensor<4x8xf16>) {
  %0 = stablehlo.convert %x : (tensor<4x8xbf16>) -> tensor<4x8xf32>
  %c = stablehlo.constant dense<2.000000e+00> : tensor<4x8xf32>
  %1 = stablehlo.multiply %0, %c : tensor<4x8xf32>
  %2 = stablehlo.convert %1 : (tensor<4x8xf32>) -> tensor<4x8xbf16>
  %3 = stablehlo.convert %2 : (tensor<4x8xbf16>) -> tensor<4x8xf32>
  %4 = stablehlo.convert %w : (tensor<8xbf16>) -> tensor<8xf32>
  %5 = stablehlo.broadcast_in_dim %4, dims = [1] : (tensor<8xf32>) -> tensor<4x8xf32>
  %6 = stablehlo.multiply %3, %5 : tensor<4x8xf32>
  %7 = stablehlo.convert %6 : (tensor<4x8xf32>) -> tensor<4x8xbf16>
  %8 = stablehlo.convert %h : (tensor<4x8xf16>) -> tensor<4x8xf32>
  %9 = stablehlo.subtract %8, %8 : tensor<4x8xf32>
  %10 = stablehlo.convert %9 : (tensor<4x8xf32>) -> tensor<4x8xf16>
  return %7, %10 : tensor<4x8xbf16>, tensor<4x8xf16>
}

// -----

// Left in float32: a constant bfloat16 cannot hold (0.1: the op would compute with another
// number); a transcendental op (a backend may evaluate it in 16 bits, less accurately than
// PyTorch's float32 kernels); an operand that is a float32 result rounded by a lowering
// (SiLU's: torchtpu-elide-roundings reads it unrounded); a result also read in float32.
// CHECK-LABEL: func.func @kept_in_float32
// CHECK:         stablehlo.multiply %{{.*}}, %{{.*}} : tensor<8xf32>
// CHECK:         stablehlo.exponential %{{.*}} : tensor<8xf32>
// CHECK:         stablehlo.multiply %{{.*}}, %{{.*}} : tensor<8xf32>
// CHECK:         stablehlo.add %{{.*}}, %{{.*}} : tensor<8xf32>
// CHECK-NOT:     : tensor<8xbf16>{{$}}
// PIPELINE-LABEL: func.func @kept_in_float32
// PIPELINE-NOT:   (tensor<8xf32>) -> tensor<8xbf16>
// PIPELINE:       stablehlo.multiply %{{.*}}, %{{.*}} : tensor<8xf32>
func.func @kept_in_float32(%x: tensor<8xbf16>, %u: tensor<8xbf16>) -> (tensor<8xbf16>, tensor<8xbf16>, tensor<8xbf16>, tensor<8xbf16>, tensor<8xf32>) {
  %0 = stablehlo.convert %x : (tensor<8xbf16>) -> tensor<8xf32>
  %c = stablehlo.constant dense<1.000000e-01> : tensor<8xf32>
  %1 = stablehlo.multiply %0, %c : tensor<8xf32>
  %2 = stablehlo.convert %1 : (tensor<8xf32>) -> tensor<8xbf16>
  %3 = stablehlo.exponential %0 : tensor<8xf32>
  %4 = stablehlo.convert %3 : (tensor<8xf32>) -> tensor<8xbf16>
  %5 = stablehlo.logistic %0 : tensor<8xf32>
  %6 = stablehlo.multiply %0, %5 : tensor<8xf32>
  %7 = stablehlo.convert %6 : (tensor<8xf32>) -> tensor<8xbf16>
  %8 = stablehlo.convert %7 : (tensor<8xbf16>) -> tensor<8xf32>
  %9 = stablehlo.convert %u : (tensor<8xbf16>) -> tensor<8xf32>
  %10 = stablehlo.multiply %8, %9 : tensor<8xf32>
  %11 = stablehlo.convert %10 : (tensor<8xf32>) -> tensor<8xbf16>
  %12 = stablehlo.add %0, %9 : tensor<8xf32>
  %13 = stablehlo.convert %12 : (tensor<8xf32>) -> tensor<8xbf16>
  return %2, %4, %11, %13, %12 : tensor<8xbf16>, tensor<8xbf16>, tensor<8xbf16>, tensor<8xbf16>, tensor<8xf32>
}

// -----

// Roundings kept as torchtpu-elide-roundings keeps them: a cast the user wrote
// (`(a.float() + b.float()).bfloat16()`: the rounding is the program's meaning, and XLA may
// skip a 16-bit op's rounding inside a fused kernel) and a sum whose rounding reaches a
// comparison (an unrounded value can fall on the other side of a tie).
// CHECK-LABEL: func.func @explicit_cast_and_comparison
// CHECK-COUNT-2: stablehlo.add %{{.*}}, %{{.*}} : tensor<8xf32>
// CHECK:         stablehlo.compare
func.func @explicit_cast_and_comparison(%a: tensor<8xbf16>, %b: tensor<8xbf16>) -> (tensor<8xbf16>, tensor<8xi1>) {
  %0 = stablehlo.convert %a : (tensor<8xbf16>) -> tensor<8xf32>
  %1 = stablehlo.convert %b : (tensor<8xbf16>) -> tensor<8xf32>
  %2 = stablehlo.add %0, %1 : tensor<8xf32>
  %3 = stablehlo.convert %2 : (tensor<8xf32>) -> tensor<8xbf16> loc("aten._to_copy.default"("model.py":3:9))
  %4 = stablehlo.add %0, %1 : tensor<8xf32>
  %5 = stablehlo.convert %4 : (tensor<8xf32>) -> tensor<8xbf16>
  %6 = stablehlo.convert %5 : (tensor<8xbf16>) -> tensor<8xf32>
  %c = stablehlo.constant dense<5.000000e-01> : tensor<8xf32>
  %7 = stablehlo.compare GT, %6, %c : (tensor<8xf32>, tensor<8xf32>) -> tensor<8xi1>
  return %3, %7 : tensor<8xbf16>, tensor<8xi1>
}

// -----

// A constant of several values stays float32 (only a splat is rebuilt in 16 bits), as does an
// op on two widened values of different 16-bit types.
// CHECK-LABEL: func.func @kept_constants_and_mixed_types
// CHECK:         stablehlo.multiply %{{.*}}, %{{.*}} : tensor<2xf32>
// CHECK:         stablehlo.add %{{.*}}, %{{.*}} : tensor<2xf32>
func.func @kept_constants_and_mixed_types(%x: tensor<2xbf16>, %h: tensor<2xf16>) -> (tensor<2xbf16>, tensor<2xbf16>) {
  %0 = stablehlo.convert %x : (tensor<2xbf16>) -> tensor<2xf32>
  %c = stablehlo.constant dense<[1.000000e+00, 2.000000e+00]> : tensor<2xf32>
  %1 = stablehlo.multiply %0, %c : tensor<2xf32>
  %2 = stablehlo.convert %1 : (tensor<2xf32>) -> tensor<2xbf16>
  %3 = stablehlo.convert %h : (tensor<2xf16>) -> tensor<2xf32>
  %4 = stablehlo.add %0, %3 : tensor<2xf32>
  %5 = stablehlo.convert %4 : (tensor<2xf32>) -> tensor<2xbf16>
  return %2, %5 : tensor<2xbf16>, tensor<2xbf16>
}
