// RUN: torchtpu-opt %s --split-input-file --verify-diagnostics --torchtpu-inline

// Direct recursion cannot be inlined.
func.func @main(%x: tensor<f32>) -> tensor<f32> {
  %0 = func.call @self(%x) : (tensor<f32>) -> tensor<f32>
  return %0 : tensor<f32>
}
func.func private @self(%a: tensor<f32>) -> tensor<f32> {
  // expected-error @below {{torchtpu-inline: recursive call cannot be inlined: @self -> @self; rewrite the recursion as a loop (stablehlo.while)}}
  %0 = func.call @self(%a) : (tensor<f32>) -> tensor<f32>
  return %0 : tensor<f32>
}

// -----

// Mutual recursion names the whole cycle.
func.func @main(%x: tensor<f32>) -> tensor<f32> {
  %0 = func.call @ping(%x) : (tensor<f32>) -> tensor<f32>
  return %0 : tensor<f32>
}
func.func private @ping(%a: tensor<f32>) -> tensor<f32> {
  %0 = func.call @pong(%a) : (tensor<f32>) -> tensor<f32>
  return %0 : tensor<f32>
}
func.func private @pong(%a: tensor<f32>) -> tensor<f32> {
  // expected-error @below {{torchtpu-inline: recursive call cannot be inlined: @ping -> @pong -> @ping}}
  %0 = func.call @ping(%a) : (tensor<f32>) -> tensor<f32>
  return %0 : tensor<f32>
}

// -----

// A callee with several blocks is not inlined.
func.func @main(%x: tensor<f32>) -> tensor<f32> {
  // expected-error @below {{torchtpu-inline: cannot inline @branchy: it has 2 blocks}}
  %0 = func.call @branchy(%x) : (tensor<f32>) -> tensor<f32>
  return %0 : tensor<f32>
}
func.func private @branchy(%a: tensor<f32>) -> tensor<f32> {
  cf.br ^next(%a : tensor<f32>)
^next(%b: tensor<f32>):
  return %b : tensor<f32>
}
