// RUN: torchtpu-opt %s --split-input-file --verify-diagnostics --torchtpu-verify

// Every designator of MLIR's expected-* annotations. This file passes only if each
// expectation is met by exactly the diagnostic it describes, and nothing else is
// reported.

func.func @same_line(%t: tensor<2xf32>) {
  %0 = "torchtpu.load"(%t) : (tensor<2xf32>) -> tensor<2xf32> // expected-error {{operand 'ref' must be}}
  return
}

// -----

func.func @below(%t: tensor<2xf32>) {
  // expected-error @below {{operand 'ref' must be}}
  %0 = "torchtpu.load"(%t) : (tensor<2xf32>) -> tensor<2xf32>
  return
}

// -----

func.func @above(%t: tensor<2xf32>) {
  %0 = "torchtpu.load"(%t) : (tensor<2xf32>) -> tensor<2xf32>
  // expected-error @above {{operand 'ref' must be}}
  return
}

// -----

func.func @plus_n(%t: tensor<2xf32>) {
  // expected-error @+3 {{operand 'ref' must be}}
  // (two lines between the annotation
  //  and the op)
  %0 = "torchtpu.load"(%t) : (tensor<2xf32>) -> tensor<2xf32>
  return
}

// -----

func.func @minus_n(%t: tensor<2xf32>) {
  %0 = "torchtpu.load"(%t) : (tensor<2xf32>) -> tensor<2xf32>
  %1 = stablehlo.add %t, %t : tensor<2xf32>
  // expected-error @-2 {{operand 'ref' must be}}
  return
}

// -----

// Several annotations for one line: consecutive @below ones all target the next line
// that holds no annotation.
func.func @two_below(%r: !torchtpu.ref<tensor<2xf32>>) {
  // expected-error @below {{unknown op 'torchtpu.bogus'}}
  // expected-error @below {{unknown op 'torchtpu.bogus'}}
  "torchtpu.bogus"(%r) : (!torchtpu.ref<tensor<2xf32>>) -> () "torchtpu.bogus"(%r) : (!torchtpu.ref<tensor<2xf32>>) -> ()
  return
}

// -----

// An op whose location is unknown: its diagnostic matches @unknown.
func.func @unknown(%r: !torchtpu.ref<tensor<2xf32>>) {
  // expected-error @unknown {{unknown op 'torchtpu.bogus'}}
  "torchtpu.bogus"(%r) : (!torchtpu.ref<tensor<2xf32>>) -> () loc(unknown)
  return
}

// -----

// Notes attached to MLIR's own diagnostics are matched like errors.
func.func @notes(%a: tensor<2xf32>) -> tensor<2xf32> {
  // expected-error @below {{operand #0 does not dominate this use}}
  // expected-note @below {{see current operation}}
  %1 = stablehlo.add %0, %0 : tensor<2xf32>
  // expected-note @below {{operand defined here}}
  %0 = stablehlo.add %a, %a : tensor<2xf32>
  return %1 : tensor<2xf32>
}

// -----

// Parser errors are checked the same way.
func.func @parse_error() {
  // expected-error @below {{custom op 'stablehlo.frobnicate' is unknown}}
  stablehlo.frobnicate
}

// -----

// A chunk without diagnostics and without annotations passes.
func.func @clean(%r: !torchtpu.ref<tensor<2xf32>>) -> tensor<2xf32> {
  %0 = "torchtpu.load"(%r) : (!torchtpu.ref<tensor<2xf32>>) -> tensor<2xf32>
  return %0 : tensor<2xf32>
}
