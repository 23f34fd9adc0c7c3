// RUN: torchtpu-opt %s --split-input-file --torchtpu-inverse-views | FileCheck %s

// References become values: loads read the current value, stores replace it through
// the inverse of each view, written arguments come back as aliased results.

// CHECK-LABEL: func.func @root_load_store
// CHECK-SAME:    (%[[R:.*]]: tensor<4xf32> {tf.aliasing_output = 1 : i32}, %[[X:.*]]: tensor<4xf32>)
// CHECK-SAME:    -> (tensor<4xf32>, tensor<4xf32>)
// CHECK:         %[[NEW:.*]] = stablehlo.add %[[R]], %[[X]]
// CHECK:         return %[[NEW]], %[[NEW]]
// CHECK-NOT:     torchtpu
func.func @root_load_store(%r: !torchtpu.ref<tensor<4xf32>>, %x: tensor<4xf32>) -> tensor<4xf32> {
  %0 = "torchtpu.load"(%r) : (!torchtpu.ref<tensor<4xf32>>) -> tensor<4xf32>
  %1 = stablehlo.add %0, %x : tensor<4xf32>
  "torchtpu.store"(%r, %1) : (!torchtpu.ref<tensor<4xf32>>, tensor<4xf32>) -> ()
  %2 = "torchtpu.load"(%r) : (!torchtpu.ref<tensor<4xf32>>) -> tensor<4xf32>
  return %2 : tensor<4xf32>
}

// -----

// A reference only read stays an argument without an aliased result.
// CHECK-LABEL: func.func @read_only
// CHECK-SAME:    (%[[R:.*]]: tensor<2x3xf32>) -> tensor<3x2xf32>
// CHECK-NOT:     tf.aliasing_output
// CHECK:         %[[T:.*]] = stablehlo.transpose %[[R]], dims = [1, 0]
// CHECK:         return %[[T]]
func.func @read_only(%r: !torchtpu.ref<tensor<2x3xf32>>) -> tensor<3x2xf32> {
  %v = "torchtpu.permute"(%r) {permutation = array<i64: 1, 0>} : (!torchtpu.ref<tensor<2x3xf32>>) -> !torchtpu.ref<tensor<3x2xf32>>
  %0 = "torchtpu.load"(%v) : (!torchtpu.ref<tensor<3x2xf32>>) -> tensor<3x2xf32>
  return %0 : tensor<3x2xf32>
}

// -----

// KV-cache update: cache[:, :, 1] = k is a store through a select.
// CHECK-LABEL: func.func @select_store
// CHECK-SAME:    (%[[C:.*]]: tensor<2x4x3xf32> {tf.aliasing_output = 0 : i32}, %[[K:.*]]: tensor<2x3xf32>)
// CHECK:         %[[K3:.*]] = stablehlo.reshape %[[K]] : (tensor<2x3xf32>) -> tensor<2x1x3xf32>
// CHECK:         %[[NEW:.*]] = stablehlo.dynamic_update_slice %[[C]], %[[K3]]
// CHECK:         return %[[NEW]]
func.func @select_store(%c: !torchtpu.ref<tensor<2x4x3xf32>>, %k: tensor<2x3xf32>) {
  %v = "torchtpu.select"(%c) {dim = 1 : i64, index = 1 : i64} : (!torchtpu.ref<tensor<2x4x3xf32>>) -> !torchtpu.ref<tensor<2x3xf32>>
  "torchtpu.store"(%v, %k) : (!torchtpu.ref<tensor<2x3xf32>>, tensor<2x3xf32>) -> ()
  return
}

// -----

// Slices: step 1 updates in place, a strided slice scatters.
// CHECK-LABEL: func.func @slices
// CHECK:         stablehlo.slice %{{.*}} [2:6]
// CHECK:         stablehlo.dynamic_update_slice
// CHECK:         stablehlo.slice %{{.*}} [0:8:3]
// CHECK:         "stablehlo.scatter"
// CHECK:         return
func.func @slices(%r: !torchtpu.ref<tensor<8xf32>>, %x: tensor<4xf32>) {
  %a = "torchtpu.slice"(%r) {dim = 0 : i64, start = 2 : i64, limit = 6 : i64, step = 1 : i64} : (!torchtpu.ref<tensor<8xf32>>) -> !torchtpu.ref<tensor<4xf32>>
  %0 = "torchtpu.load"(%a) : (!torchtpu.ref<tensor<4xf32>>) -> tensor<4xf32>
  %1 = stablehlo.add %0, %x : tensor<4xf32>
  "torchtpu.store"(%a, %1) : (!torchtpu.ref<tensor<4xf32>>, tensor<4xf32>) -> ()
  %b = "torchtpu.slice"(%r) {dim = 0 : i64, start = 0 : i64, limit = 8 : i64, step = 3 : i64} : (!torchtpu.ref<tensor<8xf32>>) -> !torchtpu.ref<tensor<3xf32>>
  %2 = "torchtpu.load"(%b) : (!torchtpu.ref<tensor<3xf32>>) -> tensor<3xf32>
  %3 = stablehlo.multiply %2, %2 : tensor<3xf32>
  "torchtpu.store"(%b, %3) : (!torchtpu.ref<tensor<3xf32>>, tensor<3xf32>) -> ()
  return
}

// -----

// In place on a transposed view: the inverse permutation of the new value.
// CHECK-LABEL: func.func @transposed_write
// CHECK:         %[[T:.*]] = stablehlo.transpose %arg0, dims = [1, 0]
// CHECK:         %[[M:.*]] = stablehlo.multiply %[[T]], %[[T]]
// CHECK:         %[[BACK:.*]] = stablehlo.transpose %[[M]], dims = [1, 0]
// CHECK:         return %[[BACK]]
func.func @transposed_write(%r: !torchtpu.ref<tensor<2x3xf32>>) {
  %t = "torchtpu.permute"(%r) {permutation = array<i64: 1, 0>} : (!torchtpu.ref<tensor<2x3xf32>>) -> !torchtpu.ref<tensor<3x2xf32>>
  %0 = "torchtpu.load"(%t) : (!torchtpu.ref<tensor<3x2xf32>>) -> tensor<3x2xf32>
  %1 = stablehlo.multiply %0, %0 : tensor<3x2xf32>
  "torchtpu.store"(%t, %1) : (!torchtpu.ref<tensor<3x2xf32>>, tensor<3x2xf32>) -> ()
  return
}

// -----

// A write through a view of a view updates the root through both inverses; a later
// load of a *different* view of the same root sees it (aliasing between two views).
// CHECK-LABEL: func.func @view_of_view_and_alias
// CHECK:         %[[ROW:.*]] = stablehlo.reshape %arg1 : (tensor<3xf32>) -> tensor<1x3xf32>
// CHECK:         %[[ROWS:.*]] = stablehlo.dynamic_update_slice %{{.*}}, %[[ROW]]
// CHECK:         %[[ROOT:.*]] = stablehlo.dynamic_update_slice %arg0, %[[ROWS]]
// CHECK:         %[[COL:.*]] = stablehlo.transpose %[[ROOT]], dims = [1, 0]
// CHECK:         return %[[COL]], %[[ROOT]]
func.func @view_of_view_and_alias(%r: !torchtpu.ref<tensor<4x3xf32>>, %x: tensor<3xf32>) -> tensor<3x4xf32> {
  %rows = "torchtpu.slice"(%r) {dim = 0 : i64, start = 1 : i64, limit = 3 : i64, step = 1 : i64} : (!torchtpu.ref<tensor<4x3xf32>>) -> !torchtpu.ref<tensor<2x3xf32>>
  %row = "torchtpu.select"(%rows) {dim = 0 : i64, index = 1 : i64} : (!torchtpu.ref<tensor<2x3xf32>>) -> !torchtpu.ref<tensor<3xf32>>
  "torchtpu.store"(%row, %x) : (!torchtpu.ref<tensor<3xf32>>, tensor<3xf32>) -> ()
  %t = "torchtpu.permute"(%r) {permutation = array<i64: 1, 0>} : (!torchtpu.ref<tensor<4x3xf32>>) -> !torchtpu.ref<tensor<3x4xf32>>
  %0 = "torchtpu.load"(%t) : (!torchtpu.ref<tensor<3x4xf32>>) -> tensor<3x4xf32>
  return %0 : tensor<3x4xf32>
}

// -----

// reshape / squeeze / unsqueeze / alias: reshape back; a non-overlapping expand
// (only size-1 dims added) is a reshape too.
// CHECK-LABEL: func.func @reshapes
// CHECK-NOT:     torchtpu.
// CHECK:         stablehlo.reshape %{{.*}} : (tensor<6xf32>) -> tensor<2x3xf32>
// CHECK:         stablehlo.reshape %{{.*}} : (tensor<1x2x3xf32>) -> tensor<2x3xf32>
// CHECK:         stablehlo.reshape %{{.*}} : (tensor<2x3xf32>) -> tensor<2x1x3xf32>
// CHECK:         %[[Z:.*]] = stablehlo.reshape %arg3 : (tensor<2x3xf32>) -> tensor<2x1x3xf32>
// CHECK:         stablehlo.reshape %[[Z]] : (tensor<2x1x3xf32>) -> tensor<2x3xf32>
// CHECK:         return
func.func @reshapes(%r: !torchtpu.ref<tensor<2x3xf32>>, %x: tensor<6xf32>, %y: tensor<1x2x3xf32>, %z: tensor<2x3xf32>) {
  %a = "torchtpu.alias"(%r) : (!torchtpu.ref<tensor<2x3xf32>>) -> !torchtpu.ref<tensor<2x3xf32>>
  %f = "torchtpu.reshape"(%a) : (!torchtpu.ref<tensor<2x3xf32>>) -> !torchtpu.ref<tensor<6xf32>>
  "torchtpu.store"(%f, %x) : (!torchtpu.ref<tensor<6xf32>>, tensor<6xf32>) -> ()
  %u = "torchtpu.unsqueeze"(%r) {dim = 0 : i64} : (!torchtpu.ref<tensor<2x3xf32>>) -> !torchtpu.ref<tensor<1x2x3xf32>>
  %e = "torchtpu.expand"(%u) : (!torchtpu.ref<tensor<1x2x3xf32>>) -> !torchtpu.ref<tensor<1x2x3xf32>>
  "torchtpu.store"(%e, %y) : (!torchtpu.ref<tensor<1x2x3xf32>>, tensor<1x2x3xf32>) -> ()
  %m = "torchtpu.unsqueeze"(%r) {dim = 1 : i64} : (!torchtpu.ref<tensor<2x3xf32>>) -> !torchtpu.ref<tensor<2x1x3xf32>>
  %s = "torchtpu.squeeze"(%m) {dims = array<i64: 1>} : (!torchtpu.ref<tensor<2x1x3xf32>>) -> !torchtpu.ref<tensor<2x3xf32>>
  "torchtpu.store"(%s, %z) : (!torchtpu.ref<tensor<2x3xf32>>, tensor<2x3xf32>) -> ()
  return
}

// -----

// Reading through expand broadcasts; dtype views bitcast both ways.
// CHECK-LABEL: func.func @expand_read_and_dtype_view
// CHECK:         stablehlo.broadcast_in_dim %arg0, dims = [1]
// CHECK:         stablehlo.bitcast_convert %{{.*}} : (tensor<3xi32>) -> tensor<3xf32>
// CHECK:         return
func.func @expand_read_and_dtype_view(%r: !torchtpu.ref<tensor<3xf32>>, %bits: tensor<3xi32>) -> tensor<2x3xf32> {
  %e = "torchtpu.expand"(%r) : (!torchtpu.ref<tensor<3xf32>>) -> !torchtpu.ref<tensor<2x3xf32>>
  %0 = "torchtpu.load"(%e) : (!torchtpu.ref<tensor<2x3xf32>>) -> tensor<2x3xf32>
  %i = "torchtpu.view_dtype"(%r) : (!torchtpu.ref<tensor<3xf32>>) -> !torchtpu.ref<tensor<3xi32>>
  "torchtpu.store"(%i, %bits) : (!torchtpu.ref<tensor<3xi32>>, tensor<3xi32>) -> ()
  return %0 : tensor<2x3xf32>
}

// -----

// A tensor created in the graph and written in place (alloc) is a plain value after
// the pass; gather_view loads gather and stores scatter.
// CHECK-LABEL: func.func @alloc_and_gather_view
// CHECK-SAME:    -> tensor<4xf32>
// CHECK:         "stablehlo.gather"
// CHECK:         "stablehlo.scatter"
// CHECK-NOT:     torchtpu.
func.func @alloc_and_gather_view(%x: tensor<4xf32>) -> tensor<4xf32> {
  %r = "torchtpu.alloc"(%x) : (tensor<4xf32>) -> !torchtpu.ref<tensor<4xf32>>
  %g = "torchtpu.gather_view"(%r) {indices = dense<[3, 0]> : tensor<2xi64>} : (!torchtpu.ref<tensor<4xf32>>) -> !torchtpu.ref<tensor<2xf32>>
  %0 = "torchtpu.load"(%g) : (!torchtpu.ref<tensor<2xf32>>) -> tensor<2xf32>
  %1 = stablehlo.negate %0 : tensor<2xf32>
  "torchtpu.store"(%g, %1) : (!torchtpu.ref<tensor<2xf32>>, tensor<2xf32>) -> ()
  %2 = "torchtpu.load"(%r) : (!torchtpu.ref<tensor<4xf32>>) -> tensor<4xf32>
  return %2 : tensor<4xf32>
}

// -----

// Arguments keep their attributes; two written references get results in argument order.
// CHECK-LABEL: func.func @two_written
// CHECK-SAME:    (%{{.*}}: tensor<2xf32> {tf.aliasing_output = 0 : i32}, %{{.*}}: tensor<2xf32> {my.attr, tf.aliasing_output = 1 : i32})
func.func @two_written(%a: !torchtpu.ref<tensor<2xf32>>, %b: !torchtpu.ref<tensor<2xf32>> {my.attr}) {
  %0 = "torchtpu.load"(%a) : (!torchtpu.ref<tensor<2xf32>>) -> tensor<2xf32>
  "torchtpu.store"(%b, %0) : (!torchtpu.ref<tensor<2xf32>>, tensor<2xf32>) -> ()
  "torchtpu.store"(%a, %0) : (!torchtpu.ref<tensor<2xf32>>, tensor<2xf32>) -> ()
  return
}
