// Command-line mistakes: a one-line error, exit status 1, never a usage dump with
// status 2 or a traceback. --help lists the passes too.

// RUN: not torchtpu-opt %s --verify-each=maybe 2>&1 | FileCheck %s --check-prefix=CHOICE
// CHOICE: torchtpu-opt: error: argument --verify-each: invalid choice: 'maybe' (choose from 'true', 'false'); see --help

// RUN: not torchtpu-opt %s -o 2>&1 | FileCheck %s --check-prefix=MISSING
// MISSING: torchtpu-opt: error: argument -o: expected one argument; see --help

// RUN: not torchtpu-opt %s -x 2>&1 | FileCheck %s --check-prefix=SHORT
// SHORT: torchtpu-opt: error: unexpected argument '-x'; see --help

// RUN: torchtpu-opt --help | FileCheck %s --check-prefix=HELP
// HELP:      usage: torchtpu-opt
// HELP:      --pass-pipeline
// HELP:      torch_tpu passes:
// HELP:        --torchtpu-set-precision
// HELP:        --torchtpu-verify

func.func @f() {
  return
}
