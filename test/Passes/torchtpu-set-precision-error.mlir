// Invalid options are reported by the tool, naming the pass, the option and the
// accepted values, before any input is read.

// RUN: not torchtpu-opt %s --torchtpu-set-precision=mode=fast 2>&1 | FileCheck %s --check-prefix=MODE
// MODE: torchtpu-opt: error: invalid pass pipeline 'torchtpu-set-precision{mode=fast}': torchtpu-set-precision: option 'mode' must be one of medium, high, highest; got 'fast' (at column 1)

// RUN: not torchtpu-opt %s --pass-pipeline='builtin.module(canonicalize,torchtpu-set-precision{override=maybe})' 2>&1 | FileCheck %s --check-prefix=BOOL
// BOOL: torchtpu-set-precision: option 'override' expects true or false, got 'maybe' (at column 29)

// RUN: not torchtpu-opt %s --torchtpu-set-precision=precision=high 2>&1 | FileCheck %s --check-prefix=UNKNOWN
// UNKNOWN: torchtpu-set-precision: unknown option 'precision'; available: mode, override

// RUN: not torchtpu-opt %s --torchtpu-set-precision=mode 2>&1 | FileCheck %s --check-prefix=NOVALUE
// NOVALUE: torchtpu-set-precision: option 'mode' needs a value (mode=<medium|high|highest> (default: medium))

// The input is valid: only the options are wrong.
func.func @f(%a: tensor<2x2xf32>) -> tensor<2x2xf32> {
  %0 = stablehlo.dot %a, %a : (tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<2x2xf32>
  return %0 : tensor<2x2xf32>
}
