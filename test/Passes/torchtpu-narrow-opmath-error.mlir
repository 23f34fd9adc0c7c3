// The pass has no options: one given is reported by the tool, naming the pass, before any
// input is read.

// RUN: not torchtpu-opt %s --torchtpu-narrow-opmath=ops=add 2>&1 | FileCheck %s --check-prefix=OPTION
// OPTION: torchtpu-opt: error: invalid pass pipeline 'torchtpu-narrow-opmath{ops=add}': torchtpu-narrow-opmath: unknown option 'ops'; available: none (at column 1)

// An op whose operand and result types disagree is rejected where it stands, before the
// pass runs.

// RUN: torchtpu-opt %s --split-input-file --verify-diagnostics --torchtpu-narrow-opmath

func.func @types_differ(%x: tensor<4xbf16>) -> tensor<4xbf16> {
  %0 = stablehlo.convert %x : (tensor<4xbf16>) -> tensor<4xf32>
  // expected-error @below {{requires the same element type for all operands and results}}
  %1 = "stablehlo.add"(%0, %x) : (tensor<4xf32>, tensor<4xbf16>) -> tensor<4xf32>
  %2 = stablehlo.convert %1 : (tensor<4xf32>) -> tensor<4xbf16>
  return %2 : tensor<4xbf16>
}
