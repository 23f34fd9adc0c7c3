// RUN: torchtpu-opt %s --split-input-file --verify-diagnostics --torchtpu-annotate-bounds

// A dynamic argument needs a bound.
// expected-error @below {{torchtpu-annotate-bounds: argument #0 of type tensor<?x4xf32> has dynamic dims [0] without a bound; give it a torchtpu.bounds argument attribute}}
func.func @no_bound(%x: tensor<?x4xf32>) -> tensor<?x4xf32> {
  return %x : tensor<?x4xf32>
}

// -----

// expected-error @below {{torchtpu-annotate-bounds: argument #0: torchtpu.bounds has 1 entries for a rank-2 tensor tensor<?x4xf32>}}
func.func @wrong_rank(%x: tensor<?x4xf32> {torchtpu.bounds = array<i64: 8>}) -> tensor<?x4xf32> {
  return %x : tensor<?x4xf32>
}

// -----

// expected-error @below {{torchtpu-annotate-bounds: argument #0: static dim 1 of tensor<?x4xf32> has size 4 but torchtpu.bounds says 5; use -1 for static dims}}
func.func @static_mismatch(%x: tensor<?x4xf32> {torchtpu.bounds = array<i64: 8, 5>}) -> tensor<?x4xf32> {
  return %x : tensor<?x4xf32>
}

// -----

// expected-error @below {{torchtpu-annotate-bounds: argument #0: dynamic dim 0 of tensor<?x4xf32> has no bound in torchtpu.bounds (got -1); give a positive bound}}
func.func @negative_bound(%x: tensor<?x4xf32> {torchtpu.bounds = array<i64: -1, -1>}) -> tensor<?x4xf32> {
  return %x : tensor<?x4xf32>
}

// -----

// A dimension whose bound no rule derives (a dynamic_reshape to run-time sizes).
func.func @underivable(%x: tensor<?x4xf32> {torchtpu.bounds = array<i64: 8, -1>}, %shape: tensor<2xi64>) -> tensor<?x?xf32> {
  // expected-error @below {{torchtpu-annotate-bounds: cannot derive a bound for dynamic dim(s) [0, 1] of result #0 (tensor<?x?xf32>) of 'stablehlo.dynamic_reshape'}}
  %r = stablehlo.dynamic_reshape %x, %shape : (tensor<?x4xf32>, tensor<2xi64>) -> tensor<?x?xf32>
  return %r : tensor<?x?xf32>
}
