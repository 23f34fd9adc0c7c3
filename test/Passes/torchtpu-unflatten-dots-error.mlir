// The pass has no options: one given is reported by the tool, naming the pass, before
// any input is read.

// RUN: not torchtpu-opt %s --torchtpu-unflatten-dots=rows=2 2>&1 | FileCheck %s --check-prefix=OPTION
// OPTION: torchtpu-opt: error: invalid pass pipeline 'torchtpu-unflatten-dots{rows=2}': torchtpu-unflatten-dots: unknown option 'rows'; available: none (at column 1)

// RUN: not torchtpu-opt %s --pass-pipeline='builtin.module(canonicalize,torchtpu-unflatten-dots{rows})' 2>&1 | FileCheck %s --check-prefix=NESTED
// NESTED: torchtpu-unflatten-dots: unknown option 'rows'; available: none (at column 29)

// A product whose flattened operand does not match the other operand is rejected where
// it stands, before the pass could rewrite it into something that verifies.

// RUN: torchtpu-opt %s --split-input-file --verify-diagnostics --torchtpu-unflatten-dots

func.func @contracting_sizes_differ(%x: tensor<4x8x16xf32>, %w: tensor<8x32xf32>) -> tensor<32x32xf32> {
  %0 = stablehlo.reshape %x : (tensor<4x8x16xf32>) -> tensor<32x16xf32>
  // expected-error @below {{contracting dimension sizes must match}}
  %1 = stablehlo.dot_general %0, %w, contracting_dims = [1] x [0] : (tensor<32x16xf32>, tensor<8x32xf32>) -> tensor<32x32xf32>
  return %1 : tensor<32x32xf32>
}

// -----

func.func @merged_rows_do_not_cover_the_operand(%x: tensor<4x8x16xf32>) -> tensor<30x16xf32> {
  // expected-error @below {{number of output elements (480) doesn't match expected number of elements (512)}}
  %0 = stablehlo.reshape %x : (tensor<4x8x16xf32>) -> tensor<30x16xf32>
  return %0 : tensor<30x16xf32>
}
