// RUN: torchtpu-opt %s --split-input-file --verify-diagnostics --torchtpu-materialize-bounds

// Without a bound there is no padded buffer to allocate.
// expected-error @below {{torchtpu-materialize-bounds: argument #0 (tensor<?x4xf32>) has dynamic dims [0] without a bound; run torchtpu-annotate-bounds first}}
func.func @unbounded_arg(%x: tensor<?x4xf32>) -> tensor<4xf32> {
  %c = stablehlo.constant dense<1.0> : tensor<4xf32>
  return %c : tensor<4xf32>
}

// -----

func.func @unbounded_result(%x: tensor<8xf32>, %n: tensor<i32>) -> tensor<?xf32> {
  %d = stablehlo.set_dimension_size %x, %n, dim = 0 : (tensor<8xf32>, tensor<i32>) -> tensor<?xf32>
  // expected-error @below {{torchtpu-materialize-bounds: result #0 (tensor<?xf32>) has dynamic dims [0] without a bound; run torchtpu-annotate-bounds first}}
  return %d : tensor<?xf32>
}
