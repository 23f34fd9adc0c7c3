// The pass has no options: one given is reported by the tool, naming the pass, before any
// input is read; so is a wrong value of the compile pipeline's option that runs it.

// RUN: not torchtpu-opt %s --torchtpu-elide-roundings=dtype=bf16 2>&1 | FileCheck %s --check-prefix=OPTION
// OPTION: torchtpu-opt: error: invalid pass pipeline 'torchtpu-elide-roundings{dtype=bf16}': torchtpu-elide-roundings: unknown option 'dtype'; available: none (at column 1)

// RUN: not torchtpu-opt %s --pass-pipeline='builtin.module(torchtpu-compile-pipeline{elide-roundings=maybe})' 2>&1 | FileCheck %s --check-prefix=PIPELINE
// PIPELINE: torchtpu-compile-pipeline: option 'elide-roundings' expects true or false, got 'maybe'

// An invalid round trip is rejected where it stands, before the pass runs.

// RUN: torchtpu-opt %s --split-input-file --verify-diagnostics --torchtpu-elide-roundings

func.func @shapes_differ(%x: tensor<4xf32>) -> tensor<8xf32> {
  %0 = stablehlo.convert %x : (tensor<4xf32>) -> tensor<4xbf16>
  // expected-error @below {{requires the same shape for all operands and results}}
  // expected-note @below {{see current operation}}
  %1 = stablehlo.convert %0 : (tensor<4xbf16>) -> tensor<8xf32>
  return %1 : tensor<8xf32>
}
