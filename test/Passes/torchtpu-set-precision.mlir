// RUN: torchtpu-opt %s --split-input-file --torchtpu-set-precision | FileCheck %s --check-prefix=MEDIUM
// RUN: torchtpu-opt %s --split-input-file --torchtpu-set-precision=mode=medium | FileCheck %s --check-prefix=MEDIUM
// RUN: torchtpu-opt %s --split-input-file --torchtpu-set-precision=mode=high | FileCheck %s --check-prefix=HIGH
// RUN: torchtpu-opt %s --split-input-file --pass-pipeline='builtin.module(torchtpu-set-precision{mode=highest})' | FileCheck %s --check-prefix=HIGHEST
// RUN: torchtpu-opt %s --split-input-file --torchtpu-set-precision="mode=highest override=true" | FileCheck %s --check-prefix=OVERRIDE

// MEDIUM-LABEL:  func.func @dot_general
// MEDIUM:        stablehlo.dot_general {{.*}} precision = [DEFAULT, DEFAULT]
// HIGH-LABEL:    func.func @dot_general
// HIGH:          stablehlo.dot_general {{.*}} precision = [HIGH, HIGH]
// HIGHEST-LABEL: func.func @dot_general
// HIGHEST:       stablehlo.dot_general {{.*}} precision = [HIGHEST, HIGHEST]
func.func @dot_general(%a: tensor<2x3xf32>, %b: tensor<3x4xf32>) -> tensor<2x4xf32> {
  %0 = stablehlo.dot_general %a, %b, contracting_dims = [1] x [0] : (tensor<2x3xf32>, tensor<3x4xf32>) -> tensor<2x4xf32>
  return %0 : tensor<2x4xf32>
}

// -----

// MEDIUM-LABEL:  func.func @dot
// MEDIUM:        stablehlo.dot {{.*}} precision = [DEFAULT, DEFAULT]
// HIGH-LABEL:    func.func @dot
// HIGH:          stablehlo.dot {{.*}} precision = [HIGH, HIGH]
// HIGHEST-LABEL: func.func @dot
// HIGHEST:       stablehlo.dot {{.*}} precision = [HIGHEST, HIGHEST]
func.func @dot(%a: tensor<2x3xf32>, %b: tensor<3xf32>) -> tensor<2xf32> {
  %0 = stablehlo.dot %a, %b : (tensor<2x3xf32>, tensor<3xf32>) -> tensor<2xf32>
  return %0 : tensor<2xf32>
}

// -----

// MEDIUM-LABEL:  func.func @convolution
// MEDIUM:        stablehlo.convolution
// MEDIUM-SAME:   precision_config = [#stablehlo<precision DEFAULT>, #stablehlo<precision DEFAULT>]
// HIGH-LABEL:    func.func @convolution
// HIGH:          precision_config = [#stablehlo<precision HIGH>, #stablehlo<precision HIGH>]
// HIGHEST-LABEL: func.func @convolution
// HIGHEST:       precision_config = [#stablehlo<precision HIGHEST>, #stablehlo<precision HIGHEST>]
func.func @convolution(%x: tensor<1x8x8x3xf32>, %w: tensor<3x3x3x16xf32>) -> tensor<1x6x6x16xf32> {
  %0 = stablehlo.convolution(%x, %w) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {stride = [1, 1]} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<1x8x8x3xf32>, tensor<3x3x3x16xf32>) -> tensor<1x6x6x16xf32>
  return %0 : tensor<1x6x6x16xf32>
}

// -----

// A precision already chosen (e.g. by the importer for one matmul) is kept, unless
// override=true.
// MEDIUM-LABEL:   func.func @existing_precision
// MEDIUM:         precision = [HIGH, DEFAULT]
// HIGHEST-LABEL:  func.func @existing_precision
// HIGHEST:        precision = [HIGH, DEFAULT]
// OVERRIDE-LABEL: func.func @existing_precision
// OVERRIDE:       precision = [HIGHEST, HIGHEST]
// OVERRIDE-NOT:   DEFAULT
func.func @existing_precision(%a: tensor<2x3xf32>, %b: tensor<3x4xf32>) -> tensor<2x4xf32> {
  %0 = stablehlo.dot_general %a, %b, contracting_dims = [1] x [0], precision = [HIGH, DEFAULT] : (tensor<2x3xf32>, tensor<3x4xf32>) -> tensor<2x4xf32>
  return %0 : tensor<2x4xf32>
}

// -----

// Matrix ops inside regions and in every function are reached; other ops are left alone.
// HIGHEST-LABEL: func.func @nested_and_other_ops
// HIGHEST:       stablehlo.while
// HIGHEST:       stablehlo.dot_general {{.*}} precision = [HIGHEST, HIGHEST]
// HIGHEST:       stablehlo.add
// HIGHEST-NOT:   precision
// HIGHEST-LABEL: func.func @second_function
// HIGHEST:       stablehlo.dot {{.*}} precision = [HIGHEST, HIGHEST]
func.func @nested_and_other_ops(%a: tensor<2x2xf32>, %n: tensor<i32>) -> tensor<2x2xf32> {
  %0:2 = stablehlo.while(%i = %n, %x = %a) : tensor<i32>, tensor<2x2xf32>
   cond {
    %c0 = stablehlo.constant dense<0> : tensor<i32>
    %p = stablehlo.compare GT, %i, %c0 : (tensor<i32>, tensor<i32>) -> tensor<i1>
    stablehlo.return %p : tensor<i1>
  } do {
    %y = stablehlo.dot_general %x, %x, contracting_dims = [1] x [0] : (tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<2x2xf32>
    %c1 = stablehlo.constant dense<1> : tensor<i32>
    %j = stablehlo.subtract %i, %c1 : tensor<i32>
    stablehlo.return %j, %y : tensor<i32>, tensor<2x2xf32>
  }
  %1 = stablehlo.add %0#1, %a : tensor<2x2xf32>
  return %1 : tensor<2x2xf32>
}
func.func @second_function(%a: tensor<2x3xf32>, %b: tensor<3xf32>) -> tensor<2xf32> {
  %0 = stablehlo.dot %a, %b : (tensor<2x3xf32>, tensor<3xf32>) -> tensor<2xf32>
  return %0 : tensor<2xf32>
}

// -----

// A lowering that needs its own precision marks the op: the marker wins even over
// override=true, and the pass removes it.
// MEDIUM-LABEL:   func.func @fixed_precision
// MEDIUM:         stablehlo.dot_general {{.*}} precision = [HIGHEST, HIGHEST]
// MEDIUM-NOT:     torchtpu.fixed_precision
// OVERRIDE-LABEL: func.func @fixed_precision
// OVERRIDE:       stablehlo.dot_general {{.*}} precision = [HIGHEST, HIGHEST]
// OVERRIDE-NOT:   torchtpu.fixed_precision
// OVERRIDE:       stablehlo.dot_general {{.*}} precision = [HIGHEST, HIGHEST]
func.func @fixed_precision(%a: tensor<2x2xf32>) -> tensor<2x2xf32> {
  %0 = stablehlo.dot_general %a, %a, contracting_dims = [1] x [0], precision = [HIGHEST, HIGHEST] {torchtpu.fixed_precision} : (tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<2x2xf32>
  %1 = stablehlo.dot_general %0, %a, contracting_dims = [1] x [0] : (tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<2x2xf32>
  return %1 : tensor<2x2xf32>
}

// -----

// DEFAULT means "the backend's choice" (JAX writes it on every dot and convolution): a
// config of DEFAULTs counts as unset and takes the mode, even without override.
// HIGHEST-LABEL: func.func @jax_default_is_unset
// HIGHEST:       stablehlo.dot_general {{.*}} precision = [HIGHEST, HIGHEST]
// HIGHEST:       stablehlo.convolution
// HIGHEST-SAME:  precision_config = [#stablehlo<precision HIGHEST>, #stablehlo<precision HIGHEST>]
// HIGH-LABEL:    func.func @jax_default_is_unset
// HIGH:          stablehlo.dot_general {{.*}} precision = [HIGH, HIGH]
// MEDIUM-LABEL:  func.func @jax_default_is_unset
// MEDIUM:        stablehlo.dot_general {{.*}} precision = [DEFAULT, DEFAULT]
func.func @jax_default_is_unset(%a: tensor<2x3xf32>, %b: tensor<3x4xf32>, %x: tensor<1x8x8x3xf32>, %w: tensor<3x3x3x16xf32>) -> (tensor<2x4xf32>, tensor<1x6x6x16xf32>) {
  %0 = stablehlo.dot_general %a, %b, contracting_dims = [1] x [0], precision = [DEFAULT, DEFAULT] : (tensor<2x3xf32>, tensor<3x4xf32>) -> tensor<2x4xf32>
  %1 = stablehlo.convolution(%x, %w) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {stride = [1, 1]} {batch_group_count = 1 : i64, feature_group_count = 1 : i64, precision_config = [#stablehlo<precision DEFAULT>, #stablehlo<precision DEFAULT>]} : (tensor<1x8x8x3xf32>, tensor<3x3x3x16xf32>) -> tensor<1x6x6x16xf32>
  return %0, %1 : tensor<2x4xf32>, tensor<1x6x6x16xf32>
}

// -----

// Explicit HIGH stays without override (here: one operand HIGH, one DEFAULT).
// HIGHEST-LABEL:  func.func @explicit_high_kept
// HIGHEST:        precision = [HIGHEST, HIGHEST]
// HIGHEST:        precision = [HIGH, HIGH]
// OVERRIDE-LABEL: func.func @explicit_high_kept
// OVERRIDE-COUNT-2: precision = [HIGHEST, HIGHEST]
func.func @explicit_high_kept(%a: tensor<2x2xf32>) -> tensor<2x2xf32> {
  %0 = stablehlo.dot_general %a, %a, contracting_dims = [1] x [0], precision = [DEFAULT, DEFAULT] : (tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<2x2xf32>
  %1 = stablehlo.dot_general %0, %a, contracting_dims = [1] x [0], precision = [HIGH, HIGH] : (tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<2x2xf32>
  return %1 : tensor<2x2xf32>
}

// -----

// The mode is the float32 matmul precision: bf16, f16 and integer products are left as
// they are, even with override=true; one f32 operand is enough to take the mode.
// HIGHEST-LABEL:  func.func @only_float32_products
// HIGHEST:        stablehlo.dot_general %arg0, %arg0,{{.*}} precision = [HIGH, DEFAULT]
// HIGHEST:        stablehlo.dot_general %arg1, %arg1,
// HIGHEST-NOT:    precision
// HIGHEST-SAME:   -> tensor<2x2xf16>
// HIGHEST:        stablehlo.dot_general %arg2, %arg2,
// HIGHEST-NOT:    precision
// HIGHEST-SAME:   -> tensor<2x2xi32>
// HIGHEST:        stablehlo.dot_general %arg3, %arg4,{{.*}} precision = [HIGHEST, HIGHEST]
// HIGHEST:        stablehlo.dot_general %arg5, %arg5,{{.*}} precision = [HIGHEST, HIGHEST]
// OVERRIDE-LABEL: func.func @only_float32_products
// OVERRIDE:       stablehlo.dot_general %arg0, %arg0,{{.*}} precision = [HIGH, DEFAULT]
// OVERRIDE-COUNT-2: precision = [HIGHEST, HIGHEST]
func.func @only_float32_products(%b: tensor<2x2xbf16>, %h: tensor<2x2xf16>, %i: tensor<2x2xi32>, %f: tensor<2x2xf32>, %fb: tensor<2x2xbf16>, %c: tensor<2x2xcomplex<f32>>) -> (tensor<2x2xbf16>, tensor<2x2xf16>, tensor<2x2xi32>, tensor<2x2xf32>, tensor<2x2xcomplex<f32>>) {
  %0 = stablehlo.dot_general %b, %b, contracting_dims = [1] x [0], precision = [HIGH, DEFAULT] : (tensor<2x2xbf16>, tensor<2x2xbf16>) -> tensor<2x2xbf16>
  %1 = stablehlo.dot_general %h, %h, contracting_dims = [1] x [0] : (tensor<2x2xf16>, tensor<2x2xf16>) -> tensor<2x2xf16>
  %2 = stablehlo.dot_general %i, %i, contracting_dims = [1] x [0] : (tensor<2x2xi32>, tensor<2x2xi32>) -> tensor<2x2xi32>
  %3 = stablehlo.dot_general %f, %fb, contracting_dims = [1] x [0] : (tensor<2x2xf32>, tensor<2x2xbf16>) -> tensor<2x2xf32>
  %4 = stablehlo.dot_general %c, %c, contracting_dims = [1] x [0] : (tensor<2x2xcomplex<f32>>, tensor<2x2xcomplex<f32>>) -> tensor<2x2xcomplex<f32>>
  return %0, %1, %2, %3, %4 : tensor<2x2xbf16>, tensor<2x2xf16>, tensor<2x2xi32>, tensor<2x2xf32>, tensor<2x2xcomplex<f32>>
}
