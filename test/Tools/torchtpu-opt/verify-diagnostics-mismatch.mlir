// RUN: not torchtpu-opt %s --split-input-file --verify-diagnostics --torchtpu-verify 2> %t.err
// RUN: FileCheck %s --input-file %t.err

// --verify-diagnostics must fail, and say why, whenever the diagnostics and the
// annotations disagree. Each chunk is one kind of mismatch.

func.func @wrong_message(%t: tensor<2xf32>) {
  // CHECK: verify-diagnostics-mismatch.mlir:[[# @LINE + 2]]:8: error: unexpected error: torchtpu-verify: 'torchtpu.load' op operand 'ref' must be
  // CHECK: verify-diagnostics-mismatch.mlir:[[# @LINE + 2]]:6: error: expected error "this text is not in the message" was not produced
  %0 = "torchtpu.load"(%t) : (tensor<2xf32>) -> tensor<2xf32>
  // expected-error @above {{this text is not in the message}}
  return
}

// -----

func.func @unannotated(%t: tensor<2xf32>) {
  // CHECK: verify-diagnostics-mismatch.mlir:[[# @LINE + 1]]:8: error: unexpected error: {{.*}}operand 'ref' must be
  %0 = "torchtpu.load"(%t) : (tensor<2xf32>) -> tensor<2xf32>
  return
}

// -----

func.func @wrong_line(%t: tensor<2xf32>) {
  // CHECK: verify-diagnostics-mismatch.mlir:[[# @LINE + 2]]:8: error: unexpected error: {{.*}}operand 'ref' must be
  // CHECK: verify-diagnostics-mismatch.mlir:[[# @LINE + 2]]:6: error: expected error "operand 'ref' must be" was not produced
  %0 = "torchtpu.load"(%t) : (tensor<2xf32>) -> tensor<2xf32>
  // expected-error @+1 {{operand 'ref' must be}}
  return
}

// -----

func.func @wrong_severity(%t: tensor<2xf32>) {
  // CHECK: verify-diagnostics-mismatch.mlir:[[# @LINE + 2]]:8: error: unexpected error: {{.*}}operand 'ref' must be
  // CHECK: verify-diagnostics-mismatch.mlir:[[# @LINE + 1]]:66: error: expected warning "operand 'ref' must be" was not produced
  %0 = "torchtpu.load"(%t) : (tensor<2xf32>) -> tensor<2xf32> // expected-warning {{operand 'ref' must be}}
  return
}

// -----

func.func @located_but_expected_unknown(%t: tensor<2xf32>) {
  // CHECK: verify-diagnostics-mismatch.mlir:[[# @LINE + 2]]:8: error: unexpected error: {{.*}}operand 'ref' must be
  // CHECK: verify-diagnostics-mismatch.mlir:[[# @LINE + 2]]:6: error: expected error "operand 'ref' must be" was not produced
  %0 = "torchtpu.load"(%t) : (tensor<2xf32>) -> tensor<2xf32>
  // expected-error @unknown {{operand 'ref' must be}}
  return
}

// -----

// An annotation with nothing below it is itself an error.
// CHECK: verify-diagnostics-mismatch.mlir:[[# @LINE + 1]]:4: error: malformed diagnostic annotation: expected-error@below has no line below it
// expected-error @below {{nothing follows}}
