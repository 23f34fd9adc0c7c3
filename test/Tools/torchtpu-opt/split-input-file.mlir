// RUN: torchtpu-opt %s --split-input-file | FileCheck %s
// RUN: not torchtpu-opt %s 2>&1 | FileCheck %s --check-prefix=WHOLE

// Each chunk is parsed and processed on its own; the outputs are joined with the
// marker, and line numbers stay those of the whole file.

// CHECK-LABEL: func.func @first
// CHECK:       // -----
// CHECK-LABEL: func.func @second
// CHECK:       // -----
// CHECK-LABEL: func.func @first
func.func @first() {
  return
}

// -----

func.func @second() {
  return
}

// -----

// The same symbol again: fine in a separate chunk, an error in the whole file.
// WHOLE: split-input-file.mlir:[[# @LINE + 1]]:1: error: redefinition of symbol named 'first'
func.func @first() {
  return
}
