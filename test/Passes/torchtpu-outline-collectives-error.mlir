// RUN: torchtpu-opt %s --split-input-file --verify-diagnostics --torchtpu-outline-collectives

// A collective inside a region (a loop body) cannot be outlined on its own.

func.func @in_loop(%x: tensor<4xf32>, %n: tensor<i32>) -> tensor<4xf32> {
  %zero = stablehlo.constant dense<0> : tensor<i32>
  %r:2 = stablehlo.while(%i = %zero, %v = %x) : tensor<i32>, tensor<4xf32>
  cond {
    %c = stablehlo.compare LT, %i, %n : (tensor<i32>, tensor<i32>) -> tensor<i1>
    stablehlo.return %c : tensor<i1>
  } do {
    // expected-error @below {{torchtpu-outline-collectives: 'stablehlo.all_reduce' inside a region cannot be outlined; mark the code torch_tpu.spmd_safe}}
    %s = "stablehlo.all_reduce"(%v) ({
    ^bb0(%a: tensor<f32>, %b: tensor<f32>):
      %t = stablehlo.add %a, %b : tensor<f32>
      stablehlo.return %t : tensor<f32>
    }) {replica_groups = dense<[[0, 1]]> : tensor<1x2xi64>} : (tensor<4xf32>) -> tensor<4xf32>
    %one = stablehlo.constant dense<1> : tensor<i32>
    %j = stablehlo.add %i, %one : tensor<i32>
    stablehlo.return %j, %s : tensor<i32>, tensor<4xf32>
  }
  return %r#1 : tensor<4xf32>
}
