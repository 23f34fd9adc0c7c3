// RUN: torchtpu-opt %s --split-input-file --verify-diagnostics --torchtpu-verify

// The view ops' verifiers check result shapes, attribute ranges and strides.

func.func @slice_out_of_range(%r: !torchtpu.ref<tensor<4xf32>>) {
  // expected-error @below {{'torchtpu.slice' op slice [2:6] is outside dim 0 of size 4}}
  %0 = "torchtpu.slice"(%r) {dim = 0 : i64, start = 2 : i64, limit = 6 : i64, step = 1 : i64} : (!torchtpu.ref<tensor<4xf32>>) -> !torchtpu.ref<tensor<4xf32>>
  return
}

// -----

func.func @slice_wrong_shape(%r: !torchtpu.ref<tensor<8xf32>>) {
  // expected-error @below {{'torchtpu.slice' op result shape [4] does not match the expected view shape [3]}}
  %0 = "torchtpu.slice"(%r) {dim = 0 : i64, start = 0 : i64, limit = 8 : i64, step = 3 : i64} : (!torchtpu.ref<tensor<8xf32>>) -> !torchtpu.ref<tensor<4xf32>>
  return
}

// -----

func.func @select_bad_index(%r: !torchtpu.ref<tensor<2x3xf32>>) {
  // expected-error @below {{'torchtpu.select' op index 3 is outside dim 1 of size 3}}
  %0 = "torchtpu.select"(%r) {dim = 1 : i64, index = 3 : i64} : (!torchtpu.ref<tensor<2x3xf32>>) -> !torchtpu.ref<tensor<2xf32>>
  return
}

// -----

func.func @permute_not_a_permutation(%r: !torchtpu.ref<tensor<2x3xf32>>) {
  // expected-error @below {{'torchtpu.permute' op permutation [0, 0] is not a permutation of 0..1}}
  %0 = "torchtpu.permute"(%r) {permutation = array<i64: 0, 0>} : (!torchtpu.ref<tensor<2x3xf32>>) -> !torchtpu.ref<tensor<2x3xf32>>
  return
}

// -----

func.func @reshape_element_count(%r: !torchtpu.ref<tensor<2x3xf32>>) {
  // expected-error @below {{'torchtpu.reshape' op cannot view [2, 3] (6 elements) as [5] (5 elements)}}
  %0 = "torchtpu.reshape"(%r) : (!torchtpu.ref<tensor<2x3xf32>>) -> !torchtpu.ref<tensor<5xf32>>
  return
}

// -----

func.func @expand_non_unit(%r: !torchtpu.ref<tensor<2xf32>>) {
  // expected-error @below {{'torchtpu.expand' op source dim 0 of size 2 cannot be expanded to 3 (only size-1 dims expand)}}
  %0 = "torchtpu.expand"(%r) : (!torchtpu.ref<tensor<2xf32>>) -> !torchtpu.ref<tensor<3xf32>>
  return
}

// -----

func.func @squeeze_non_unit(%r: !torchtpu.ref<tensor<2x1xf32>>) {
  // expected-error @below {{'torchtpu.squeeze' op cannot squeeze dim 0 of size 2}}
  %0 = "torchtpu.squeeze"(%r) {dims = array<i64: 0>} : (!torchtpu.ref<tensor<2x1xf32>>) -> !torchtpu.ref<tensor<1xf32>>
  return
}

// -----

func.func @diagonal_same_dims(%r: !torchtpu.ref<tensor<3x3xf32>>) {
  // expected-error @below {{'torchtpu.diagonal' op dim1 and dim2 are both 1}}
  %0 = "torchtpu.diagonal"(%r) {offset = 0 : i64, dim1 = 1 : i64, dim2 = 1 : i64} : (!torchtpu.ref<tensor<3x3xf32>>) -> !torchtpu.ref<tensor<3xf32>>
  return
}

// -----

func.func @unfold_window_too_big(%r: !torchtpu.ref<tensor<3xf32>>) {
  // expected-error @below {{'torchtpu.unfold' op window size 4 / step 1 do not fit dim 0 of size 3}}
  %0 = "torchtpu.unfold"(%r) {dimension = 0 : i64, size = 4 : i64, step = 1 : i64} : (!torchtpu.ref<tensor<3xf32>>) -> !torchtpu.ref<tensor<0x4xf32>>
  return
}

// -----

func.func @as_strided_out_of_bounds(%r: !torchtpu.ref<tensor<6xf32>>) {
  // expected-error @below {{'torchtpu.as_strided' op addresses storage element 7, but the source has only 6 elements}}
  %0 = "torchtpu.as_strided"(%r) {strides = array<i64: 3, 1>, storage_offset = 3 : i64} : (!torchtpu.ref<tensor<6xf32>>) -> !torchtpu.ref<tensor<2x2xf32>>
  return
}

// -----

func.func @as_strided_stride_count(%r: !torchtpu.ref<tensor<6xf32>>) {
  // expected-error @below {{'torchtpu.as_strided' op 1 strides for a rank-2 result}}
  %0 = "torchtpu.as_strided"(%r) {strides = array<i64: 3>, storage_offset = 0 : i64} : (!torchtpu.ref<tensor<6xf32>>) -> !torchtpu.ref<tensor<2x2xf32>>
  return
}

// -----

func.func @view_dtype_bad_width(%r: !torchtpu.ref<tensor<3xi8>>) {
  // expected-error @below {{'torchtpu.view_dtype' op last dim 3 is not divisible by the element size ratio 4}}
  %0 = "torchtpu.view_dtype"(%r) : (!torchtpu.ref<tensor<3xi8>>) -> !torchtpu.ref<tensor<1xf32>>
  return
}

// -----

func.func @gather_view_out_of_range(%r: !torchtpu.ref<tensor<4xf32>>) {
  // expected-error @below {{'torchtpu.gather_view' op indices must lie in [0, 4); got [0, 4]}}
  %0 = "torchtpu.gather_view"(%r) {indices = dense<[0, 4]> : tensor<2xi64>} : (!torchtpu.ref<tensor<4xf32>>) -> !torchtpu.ref<tensor<2xf32>>
  return
}

// -----

func.func @view_changes_dtype(%r: !torchtpu.ref<tensor<4xf32>>) {
  // expected-error @below {{'torchtpu.alias' op result type tensor<4xi32> differs from the source type tensor<4xf32>}}
  %0 = "torchtpu.alias"(%r) : (!torchtpu.ref<tensor<4xf32>>) -> !torchtpu.ref<tensor<4xi32>>
  return
}

// -----

func.func @view_of_value(%v: tensor<4xf32>) {
  // expected-error @below {{'torchtpu.reshape' op operand 'source' must be !torchtpu.ref<tensor<...>>, but got tensor<4xf32>}}
  %0 = "torchtpu.reshape"(%v) : (tensor<4xf32>) -> !torchtpu.ref<tensor<2x2xf32>>
  return
}

// -----

func.func @alloc_type_mismatch(%v: tensor<4xf32>) {
  // expected-error @below {{'torchtpu.alloc' op result references tensor<4xf16>, but the initial value has type tensor<4xf32>}}
  %0 = "torchtpu.alloc"(%v) : (tensor<4xf32>) -> !torchtpu.ref<tensor<4xf16>>
  return
}

// -----

func.func @dynamic_view(%r: !torchtpu.ref<tensor<?xf32>>) {
  // expected-error @below {{'torchtpu.reshape' op view ops need static shapes}}
  %0 = "torchtpu.reshape"(%r) : (!torchtpu.ref<tensor<?xf32>>) -> !torchtpu.ref<tensor<?x1xf32>>
  return
}
