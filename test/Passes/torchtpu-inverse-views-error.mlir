// RUN: torchtpu-opt %s --split-input-file --verify-diagnostics --torchtpu-inverse-views

// Writes without a defined result and references the pass cannot follow are located
// errors naming the pass.

func.func @write_through_expand(%r: !torchtpu.ref<tensor<3xf32>>, %x: tensor<2x3xf32>) {
  // expected-note @below {{through this view}}
  %e = "torchtpu.expand"(%r) : (!torchtpu.ref<tensor<3xf32>>) -> !torchtpu.ref<tensor<2x3xf32>>
  // expected-error @below {{torchtpu-inverse-views: cannot write through 'torchtpu.expand': an expanded view (broadcast [3] -> [2, 3], stride 0) maps several elements to one memory location}}
  "torchtpu.store"(%e, %x) : (!torchtpu.ref<tensor<2x3xf32>>, tensor<2x3xf32>) -> ()
  return
}

// -----

func.func @write_through_repeated_indices(%r: !torchtpu.ref<tensor<4xf32>>, %x: tensor<2xf32>) {
  // expected-note @below {{through this view}}
  %g = "torchtpu.gather_view"(%r) {indices = dense<[1, 1]> : tensor<2xi64>} : (!torchtpu.ref<tensor<4xf32>>) -> !torchtpu.ref<tensor<2xf32>>
  // expected-error @below {{addresses some storage element more than once}}
  "torchtpu.store"(%g, %x) : (!torchtpu.ref<tensor<2xf32>>, tensor<2xf32>) -> ()
  return
}

// -----

func.func @not_decomposed(%r: !torchtpu.ref<tensor<3x3xf32>>) -> tensor<3xf32> {
  // expected-error @below {{torchtpu-inverse-views: 'torchtpu.diagonal' must be decomposed first; run torchtpu-decompose-views before this pass}}
  %d = "torchtpu.diagonal"(%r) {offset = 0 : i64, dim1 = 0 : i64, dim2 = 1 : i64} : (!torchtpu.ref<tensor<3x3xf32>>) -> !torchtpu.ref<tensor<3xf32>>
  %0 = "torchtpu.load"(%d) : (!torchtpu.ref<tensor<3xf32>>) -> tensor<3xf32>
  return %0 : tensor<3xf32>
}

// -----

func.func private @consume(!torchtpu.ref<tensor<2xf32>>)

func.func @escaping_reference(%x: tensor<2xf32>) {
  %r = "torchtpu.alloc"(%x) : (tensor<2xf32>) -> !torchtpu.ref<tensor<2xf32>>
  // expected-error @below {{torchtpu-inverse-views: 'func.call' uses a reference (operand #0); only torchtpu view ops, load and store may use references}}
  func.call @consume(%r) : (!torchtpu.ref<tensor<2xf32>>) -> ()
  return
}
