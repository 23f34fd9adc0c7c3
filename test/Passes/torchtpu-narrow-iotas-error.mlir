// The pass has no options: one given is reported by the tool, naming the pass, before any
// input is read.

// RUN: not torchtpu-opt %s --torchtpu-narrow-iotas=width=16 2>&1 | FileCheck %s --check-prefix=OPTION
// OPTION: torchtpu-opt: error: invalid pass pipeline 'torchtpu-narrow-iotas{width=16}': torchtpu-narrow-iotas: unknown option 'width'; available: none (at column 1)

// An iota whose dimension is outside its type is rejected where it stands, before the pass
// runs (never rewritten into a 32-bit iota of the same mistake).

// RUN: torchtpu-opt %s --split-input-file --verify-diagnostics --torchtpu-narrow-iotas

func.func @dimension_out_of_range() -> tensor<4xi64> {
  // expected-error @below {{iota dimension cannot go beyond the output rank}}
  %0 = stablehlo.iota dim = 3 : tensor<4xi64>
  return %0 : tensor<4xi64>
}
