// RUN: torchtpu-opt %s --split-input-file --verify-diagnostics --torchtpu-verify

// Every violation of the torchtpu dialect table is a located error naming the pass
// and the op.

func.func @load_without_operand() {
  // expected-error @below {{torchtpu-verify: 'torchtpu.load' op expects 1 operands, but got 0}}
  %0 = "torchtpu.load"() : () -> tensor<2xf32>
  return
}

// -----

func.func @store_with_one_operand(%r: !torchtpu.ref<tensor<2xf32>>) {
  // expected-error @below {{'torchtpu.store' op expects 2 operands, but got 1}}
  "torchtpu.store"(%r) : (!torchtpu.ref<tensor<2xf32>>) -> ()
  return
}

// -----

func.func @load_two_results(%r: !torchtpu.ref<tensor<2xf32>>) {
  // expected-error @below {{'torchtpu.load' op expects 1 results, but got 2}}
  %0:2 = "torchtpu.load"(%r) : (!torchtpu.ref<tensor<2xf32>>) -> (tensor<2xf32>, tensor<2xf32>)
  return
}

// -----

func.func @store_with_result(%r: !torchtpu.ref<tensor<2xf32>>, %v: tensor<2xf32>) {
  // expected-error @below {{'torchtpu.store' op expects 0 results, but got 1}}
  %0 = "torchtpu.store"(%r, %v) : (!torchtpu.ref<tensor<2xf32>>, tensor<2xf32>) -> i1
  return
}

// -----

func.func @load_from_tensor(%t: tensor<2xf32>) {
  // expected-error @below {{operand 'ref' must be !torchtpu.ref<tensor<...>>, but got tensor<2xf32>}}
  %0 = "torchtpu.load"(%t) : (tensor<2xf32>) -> tensor<2xf32>
  return
}

// -----

func.func @load_to_scalar(%r: !torchtpu.ref<tensor<2xf32>>) {
  // expected-error @below {{result 'value' must be ranked tensor, but got f32}}
  %0 = "torchtpu.load"(%r) : (!torchtpu.ref<tensor<2xf32>>) -> f32
  return
}

// -----

func.func @store_ref_into_ref(%r: !torchtpu.ref<tensor<2xf32>>) {
  // expected-error @below {{operand 'value' must be ranked tensor, but got !torchtpu.ref<tensor<2xf32>>}}
  "torchtpu.store"(%r, %r) : (!torchtpu.ref<tensor<2xf32>>, !torchtpu.ref<tensor<2xf32>>) -> ()
  return
}

// -----

func.func @load_wrong_shape(%r: !torchtpu.ref<tensor<2xf32>>) {
  // expected-error @below {{'torchtpu.load' op result type tensor<3xf32> does not match the referenced type tensor<2xf32>}}
  %0 = "torchtpu.load"(%r) : (!torchtpu.ref<tensor<2xf32>>) -> tensor<3xf32>
  return
}

// -----

func.func @store_wrong_element_type(%r: !torchtpu.ref<tensor<2xf32>>, %v: tensor<2xf16>) {
  // expected-error @below {{'torchtpu.store' op stored value type tensor<2xf16> does not match the referenced type tensor<2xf32>}}
  "torchtpu.store"(%r, %v) : (!torchtpu.ref<tensor<2xf32>>, tensor<2xf16>) -> ()
  return
}

// -----

func.func @unknown_op(%r: !torchtpu.ref<tensor<2xf32>>) {
  // expected-error @below {{torchtpu-verify: unknown op 'torchtpu.frobnicate' in the torchtpu dialect; known ops: }}
  "torchtpu.frobnicate"(%r) : (!torchtpu.ref<tensor<2xf32>>) -> ()
  return
}

// -----

func.func @unknown_attribute(%r: !torchtpu.ref<tensor<2xf32>>) {
  // expected-error @below {{'torchtpu.load' op unknown attribute 'volatile'; declared attributes: none}}
  %0 = "torchtpu.load"(%r) {volatile} : (!torchtpu.ref<tensor<2xf32>>) -> tensor<2xf32>
  return
}

// -----

func.func @load_with_region(%r: !torchtpu.ref<tensor<2xf32>>) {
  // expected-error @below {{'torchtpu.load' op expects 0 regions, but got 1}}
  %0 = "torchtpu.load"(%r) ({
  }) : (!torchtpu.ref<tensor<2xf32>>) -> tensor<2xf32>
  return
}

// -----

// The malformed type is reported at the block argument that declares it.
func.func @ref_of_scalar(
    // expected-error @below {{'func.func' op block argument #0: malformed reference type !torchtpu.ref<i32>; expected !torchtpu.ref<tensor<...>> around a ranked tensor type}}
    %r: !torchtpu.ref<i32>) {
  return
}

// -----

func.func @ref_of_unranked(
    // expected-error @below {{malformed reference type !torchtpu.ref<tensor<*xf32>>}}
    %r: !torchtpu.ref<tensor<*xf32>>) {
  return
}

// -----

func.func @ref_without_parameter(
    // expected-error @below {{malformed reference type !torchtpu.ref}}
    %r: !torchtpu.ref) {
  return
}

// -----

func.func @ref_of_garbage(
    // expected-error @below {{malformed reference type !torchtpu.ref<not a type>}}
    %r: !torchtpu.ref<not a type>) {
  return
}

// -----

func.func @unknown_type(
    // expected-error @below {{'func.func' op block argument #0: unknown type !torchtpu.box; known torchtpu types: ref}}
    %r: !torchtpu.box<tensor<2xf32>>) {
  return
}

// -----

// Types defined by op results and external declarations are checked too.
func.func @bad_result_type() {
  // expected-error @below {{'test.make' op result #0: malformed reference type !torchtpu.ref<f32>}}
  %0 = "test.make"() : () -> !torchtpu.ref<f32>
  return
}

// -----

// expected-error @below {{'func.func' op argument #0: malformed reference type !torchtpu.ref<index>}}
func.func private @external(!torchtpu.ref<index>)

// -----

// Several violations in one function are all reported.
func.func @two_errors(%r: !torchtpu.ref<tensor<2xf32>>, %v: tensor<3xf32>) {
  // expected-error @below {{'torchtpu.store' op stored value type tensor<3xf32>}}
  "torchtpu.store"(%r, %v) : (!torchtpu.ref<tensor<2xf32>>, tensor<3xf32>) -> ()
  // expected-error @below {{unknown op 'torchtpu.copy'}}
  "torchtpu.copy"(%r, %r) : (!torchtpu.ref<tensor<2xf32>>, !torchtpu.ref<tensor<2xf32>>) -> ()
  return
}
