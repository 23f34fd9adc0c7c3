// Pipelines that do not parse or name unknown passes: one located error (the column
// in the pipeline text), exit status 1, no traceback.

// RUN: not torchtpu-opt %s --pass-pipeline='builtin.module(canonicalize' 2>&1 | FileCheck %s --check-prefix=UNCLOSED
// UNCLOSED: torchtpu-opt: error: invalid pass pipeline 'builtin.module(canonicalize': expected ')' to close 'builtin.module(' (at column 28)

// RUN: not torchtpu-opt %s --pass-pipeline='builtin.module(cse,,canonicalize)' 2>&1 | FileCheck %s --check-prefix=EMPTY
// EMPTY: error: invalid pass pipeline {{.*}}: expected a pass or operation name, found ',' (at column 20)

// RUN: not torchtpu-opt %s --pass-pipeline='cse)' 2>&1 | FileCheck %s --check-prefix=TRAILING
// TRAILING: error: invalid pass pipeline 'cse)': unexpected ')' in pass pipeline (at column 4)

// RUN: not torchtpu-opt %s --pass-pipeline='torchtpu-set-precision{mode=high' 2>&1 | FileCheck %s --check-prefix=BRACE
// BRACE: error: invalid pass pipeline {{.*}}: unbalanced '{' in the options of 'torchtpu-set-precision' (at column 23)

// RUN: not torchtpu-opt %s --pass-pipeline='builtin.module(cse,torchtpu-frobnicate)' 2>&1 | FileCheck %s --check-prefix=UNKNOWN
// UNKNOWN: torchtpu-opt: error: invalid pass pipeline {{.*}}: unknown pass or invalid pass options in 'torchtpu-frobnicate': 'torchtpu-frobnicate' does not refer to a registered pass or pass pipeline; run torchtpu-opt --list-passes for the available passes (at column 20)

// RUN: not torchtpu-opt %s --no-such-pass 2>&1 | FileCheck %s --check-prefix=FLAG
// FLAG: error: invalid pass pipeline 'no-such-pass': unknown pass or invalid pass options in 'no-such-pass'

// RUN: not torchtpu-opt %s --pass-pipeline='func.func(canonicalize{max-iterations=abc})' 2>&1 | FileCheck %s --check-prefix=UPSTREAM-OPTION
// UPSTREAM-OPTION: error: invalid pass pipeline {{.*}}: unknown pass or invalid pass options in 'func.func(canonicalize{max-iterations=abc})'{{.*}}(at column 11)

// RUN: not torchtpu-opt %s --pass-pipeline='cse' --canonicalize 2>&1 | FileCheck %s --check-prefix=BOTH
// BOTH: torchtpu-opt: error: give passes either as --pass-pipeline or as pass flags, not both

// RUN: not torchtpu-opt %s extra.mlir 2>&1 | FileCheck %s --check-prefix=POSITIONAL
// POSITIONAL: torchtpu-opt: error: unexpected argument 'extra.mlir'

// The pipeline is checked even when the input does not parse.
// RUN: not torchtpu-opt %S/Inputs/parse-error.mlir --no-such-pass 2>&1 | FileCheck %s --check-prefix=FIRST
// FIRST: torchtpu-opt: error: invalid pass pipeline
// FIRST-NOT: frobnicate

// RUN: not torchtpu-opt %s --pass-pipeline='builtin.module(canonicalize' 2>&1 | FileCheck %s --check-prefix=NO-TRACEBACK
// NO-TRACEBACK-NOT: Traceback

func.func @f() {
  return
}
