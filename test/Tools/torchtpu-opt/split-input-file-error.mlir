// RUN: not torchtpu-opt %s --split-input-file -o %t.mlir 2>&1 | FileCheck %s --check-prefix=ERR
// RUN: FileCheck %s --input-file %t.mlir --check-prefix=OUT

// A chunk that fails does not stop the others: the error names the line in the whole
// file, the exit status is 1, and the valid chunks are still written.

// OUT-LABEL: func.func @before
// OUT-NOT:   @broken
// OUT-LABEL: func.func @after
func.func @before() {
  return
}

// -----

func.func @broken(%a: tensor<2xf32>) -> tensor<3xf32> {
  // ERR: split-input-file-error.mlir:[[# @LINE + 1]]:3: error: type of return operand 0 ('tensor<2xf32>') doesn't match function result type ('tensor<3xf32>') in function @broken
  return %a : tensor<2xf32>
}

// -----

func.func @after() {
  return
}
