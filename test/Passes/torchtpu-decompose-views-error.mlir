// RUN: torchtpu-opt %s --split-input-file --verify-diagnostics --torchtpu-decompose-views

// A store through a view that maps two elements to one storage location has no
// defined result: a located error at the store, with a note at the view.

func.func @overlapping_unfold(%r: !torchtpu.ref<tensor<5xf32>>, %x: tensor<3x3xf32>) {
  // expected-note @below {{through this view}}
  %u = "torchtpu.unfold"(%r) {dimension = 0 : i64, size = 3 : i64, step = 1 : i64} : (!torchtpu.ref<tensor<5xf32>>) -> !torchtpu.ref<tensor<3x3xf32>>
  // expected-error @below {{torchtpu-decompose-views: unsupported overlapping write: the view addresses some storage element more than once (overlapping windows or strides); clone() the view before writing to it}}
  "torchtpu.store"(%u, %x) : (!torchtpu.ref<tensor<3x3xf32>>, tensor<3x3xf32>) -> ()
  return
}

// -----

func.func @overlapping_as_strided(%r: !torchtpu.ref<tensor<4xf32>>, %x: tensor<2x2xf32>) {
  // expected-note @below {{through this view}}
  %v = "torchtpu.as_strided"(%r) {strides = array<i64: 1, 1>, storage_offset = 0 : i64} : (!torchtpu.ref<tensor<4xf32>>) -> !torchtpu.ref<tensor<2x2xf32>>
  // expected-error @below {{unsupported overlapping write}}
  "torchtpu.store"(%v, %x) : (!torchtpu.ref<tensor<2x2xf32>>, tensor<2x2xf32>) -> ()
  return
}

// -----

// In place on an expanded view of a view.
func.func @expanded_view_of_view(%r: !torchtpu.ref<tensor<2x3xf32>>, %x: tensor<4x3xf32>) {
  %row = "torchtpu.select"(%r) {dim = 0 : i64, index = 0 : i64} : (!torchtpu.ref<tensor<2x3xf32>>) -> !torchtpu.ref<tensor<3xf32>>
  // expected-note @below {{through this view}}
  %e = "torchtpu.expand"(%row) : (!torchtpu.ref<tensor<3xf32>>) -> !torchtpu.ref<tensor<4x3xf32>>
  // expected-error @below {{unsupported overlapping write: an expanded view (broadcast [3] -> [4, 3], stride 0) maps several elements to one memory location}}
  "torchtpu.store"(%e, %x) : (!torchtpu.ref<tensor<4x3xf32>>, tensor<4x3xf32>) -> ()
  return
}

// -----

// A slice of an expanded view that still repeats elements cannot be written.
func.func @slice_of_expand_still_overlaps(%r: !torchtpu.ref<tensor<3xf32>>, %v: tensor<2x2xf32>) {
  // expected-note @below {{through this view}}
  %e = "torchtpu.expand"(%r) : (!torchtpu.ref<tensor<3xf32>>) -> !torchtpu.ref<tensor<4x3xf32>>
  %s = "torchtpu.slice"(%e) {dim = 0 : i64, start = 0 : i64, limit = 2 : i64, step = 1 : i64} : (!torchtpu.ref<tensor<4x3xf32>>) -> !torchtpu.ref<tensor<2x3xf32>>
  %t = "torchtpu.slice"(%s) {dim = 1 : i64, start = 0 : i64, limit = 2 : i64, step = 1 : i64} : (!torchtpu.ref<tensor<2x3xf32>>) -> !torchtpu.ref<tensor<2x2xf32>>
  // expected-error @below {{unsupported overlapping write: an expanded view (broadcast [3] -> [4, 3], stride 0)}}
  "torchtpu.store"(%t, %v) : (!torchtpu.ref<tensor<2x2xf32>>, tensor<2x2xf32>) -> ()
  return
}
