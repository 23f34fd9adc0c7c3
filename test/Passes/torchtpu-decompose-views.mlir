// RUN: torchtpu-opt %s --split-input-file --torchtpu-decompose-views | FileCheck %s
// RUN: torchtpu-opt %s --split-input-file --torchtpu-decompose-views --torchtpu-inverse-views --torchtpu-verify | FileCheck %s --check-prefix=PURE

// Complex views become the canonical set (slice, select, permute, reshape, expand,
// view_dtype, gather_view); chains fold. After torchtpu-inverse-views nothing of
// the torchtpu dialect is left.
// PURE-NOT: torchtpu.

// diagonal(offset 1) of a 3x4 matrix: elements 1, 6, 11 of the flat storage.
// CHECK-LABEL: func.func @diagonal
// CHECK-NOT:     torchtpu.diagonal
// CHECK:         %[[F:.*]] = "torchtpu.reshape"(%arg0) : (!torchtpu.ref<tensor<3x4xf32>>) -> !torchtpu.ref<tensor<12xf32>>
// CHECK:         "torchtpu.slice"(%[[F]]) {dim = 0 : i64, limit = 12 : i64, start = 1 : i64, step = 5 : i64}
func.func @diagonal(%r: !torchtpu.ref<tensor<3x4xf32>>, %x: tensor<3xf32>) {
  %d = "torchtpu.diagonal"(%r) {offset = 1 : i64, dim1 = 0 : i64, dim2 = 1 : i64} : (!torchtpu.ref<tensor<3x4xf32>>) -> !torchtpu.ref<tensor<3xf32>>
  "torchtpu.store"(%d, %x) : (!torchtpu.ref<tensor<3xf32>>, tensor<3xf32>) -> ()
  return
}

// -----

// diagonal of dims (2, 0) of a 3-d tensor: the other dim moves first.
// CHECK-LABEL: func.func @diagonal_permuted
// CHECK:         "torchtpu.permute"(%arg0) {permutation = array<i64: 1, 2, 0>}
// CHECK:         "torchtpu.reshape"
// CHECK-SAME:      -> !torchtpu.ref<tensor<4x6xf32>>
// CHECK:         "torchtpu.slice"({{.*}}) {dim = 1 : i64, limit = 4 : i64, start = 0 : i64, step = 3 : i64}
func.func @diagonal_permuted(%r: !torchtpu.ref<tensor<2x4x3xf32>>) -> tensor<4x2xf32> {
  %d = "torchtpu.diagonal"(%r) {offset = 0 : i64, dim1 = 2 : i64, dim2 = 0 : i64} : (!torchtpu.ref<tensor<2x4x3xf32>>) -> !torchtpu.ref<tensor<4x2xf32>>
  %0 = "torchtpu.load"(%d) : (!torchtpu.ref<tensor<4x2xf32>>) -> tensor<4x2xf32>
  return %0 : tensor<4x2xf32>
}

// -----

// unfold with step == size: slice + reshape + permute; overlapping windows: gather_view.
// CHECK-LABEL: func.func @unfold
// CHECK-NOT:     torchtpu.unfold
// CHECK:         "torchtpu.slice"(%arg0) {dim = 0 : i64, limit = 6 : i64, start = 0 : i64, step = 1 : i64}
// CHECK:         "torchtpu.reshape"({{.*}}) : (!torchtpu.ref<tensor<6x2xf32>>) -> !torchtpu.ref<tensor<3x2x2xf32>>
// CHECK:         "torchtpu.permute"({{.*}}) {permutation = array<i64: 0, 2, 1>}
// CHECK:         "torchtpu.gather_view"(%arg0) {indices = dense<{{\[\[\[}}0, 2, 4], [1, 3, 5]], {{\[\[}}2, 4, 6], [3, 5, 7]]]> : tensor<2x2x3xi64>}
func.func @unfold(%r: !torchtpu.ref<tensor<7x2xf32>>) -> (tensor<3x2x2xf32>, tensor<2x2x3xf32>) {
  %u = "torchtpu.unfold"(%r) {dimension = 0 : i64, size = 2 : i64, step = 2 : i64} : (!torchtpu.ref<tensor<7x2xf32>>) -> !torchtpu.ref<tensor<3x2x2xf32>>
  %o = "torchtpu.unfold"(%r) {dimension = 0 : i64, size = 3 : i64, step = 1 : i64} : (!torchtpu.ref<tensor<7x2xf32>>) -> !torchtpu.ref<tensor<5x2x3xf32>>
  %s = "torchtpu.slice"(%o) {dim = 0 : i64, start = 0 : i64, limit = 2 : i64, step = 1 : i64} : (!torchtpu.ref<tensor<5x2x3xf32>>) -> !torchtpu.ref<tensor<2x2x3xf32>>
  %0 = "torchtpu.load"(%u) : (!torchtpu.ref<tensor<3x2x2xf32>>) -> tensor<3x2x2xf32>
  %1 = "torchtpu.load"(%s) : (!torchtpu.ref<tensor<2x2x3xf32>>) -> tensor<2x2x3xf32>
  return %0, %1 : tensor<3x2x2xf32>, tensor<2x2x3xf32>
}

// -----

// as_strided: a transpose-like stride pattern is simple views; an irregular one a gather.
// CHECK-LABEL: func.func @as_strided
// CHECK-NOT:     torchtpu.as_strided
// CHECK:         "torchtpu.permute"(%arg0) {permutation = array<i64: 1, 0>}
// CHECK:         "torchtpu.gather_view"(%arg0) {indices = dense<[1, 4]> : tensor<2xi64>}
// A gather_view over a slice of the flat storage stays on that slice.
// CHECK:         %[[S:.*]] = "torchtpu.slice"({{.*}}) {dim = 0 : i64, limit = 4 : i64, start = 1 : i64, step = 1 : i64}
// CHECK:         "torchtpu.gather_view"(%[[S]]) {indices = dense<[0, 2, 1]> : tensor<3xi64>}
func.func @as_strided(%r: !torchtpu.ref<tensor<2x3xf32>>) -> (tensor<3x2xf32>, tensor<3xf32>, tensor<2xf32>) {
  %t = "torchtpu.as_strided"(%r) {strides = array<i64: 1, 3>, storage_offset = 0 : i64} : (!torchtpu.ref<tensor<2x3xf32>>) -> !torchtpu.ref<tensor<3x2xf32>>
  %g = "torchtpu.as_strided"(%r) {strides = array<i64: 3>, storage_offset = 1 : i64} : (!torchtpu.ref<tensor<2x3xf32>>) -> !torchtpu.ref<tensor<2xf32>>
  %h = "torchtpu.as_strided"(%r) {strides = array<i64: 1>, storage_offset = 1 : i64} : (!torchtpu.ref<tensor<2x3xf32>>) -> !torchtpu.ref<tensor<3xf32>>
  %0 = "torchtpu.load"(%t) : (!torchtpu.ref<tensor<3x2xf32>>) -> tensor<3x2xf32>
  %i = "torchtpu.gather_view"(%h) {indices = dense<[0, 2, 1]> : tensor<3xi64>} : (!torchtpu.ref<tensor<3xf32>>) -> !torchtpu.ref<tensor<3xf32>>
  %1 = "torchtpu.load"(%i) : (!torchtpu.ref<tensor<3xf32>>) -> tensor<3xf32>
  %2 = "torchtpu.load"(%g) : (!torchtpu.ref<tensor<2xf32>>) -> tensor<2xf32>
  return %0, %1, %2 : tensor<3x2xf32>, tensor<3xf32>, tensor<2xf32>
}

// -----

// Chains: squeeze/unsqueeze become reshape, reshape-of-reshape and
// permute-of-permute compose, alias disappears.
// CHECK-LABEL: func.func @chains
// CHECK-NOT:     torchtpu.alias
// CHECK-NOT:     torchtpu.unsqueeze
// CHECK:         %[[R:.*]] = "torchtpu.reshape"(%arg0) : (!torchtpu.ref<tensor<2x3x4xf32>>) -> !torchtpu.ref<tensor<6x4xf32>>
// CHECK:         "torchtpu.load"(%[[R]])
// CHECK:         %[[P:.*]] = "torchtpu.permute"(%arg0) {permutation = array<i64: 2, 0, 1>}
// CHECK:         "torchtpu.load"(%[[P]])
func.func @chains(%r: !torchtpu.ref<tensor<2x3x4xf32>>) -> (tensor<6x4xf32>, tensor<4x2x3xf32>) {
  %a = "torchtpu.alias"(%r) : (!torchtpu.ref<tensor<2x3x4xf32>>) -> !torchtpu.ref<tensor<2x3x4xf32>>
  %u = "torchtpu.unsqueeze"(%a) {dim = 0 : i64} : (!torchtpu.ref<tensor<2x3x4xf32>>) -> !torchtpu.ref<tensor<1x2x3x4xf32>>
  %v = "torchtpu.reshape"(%u) : (!torchtpu.ref<tensor<1x2x3x4xf32>>) -> !torchtpu.ref<tensor<6x4xf32>>
  %0 = "torchtpu.load"(%v) : (!torchtpu.ref<tensor<6x4xf32>>) -> tensor<6x4xf32>
  %p = "torchtpu.permute"(%r) {permutation = array<i64: 0, 2, 1>} : (!torchtpu.ref<tensor<2x3x4xf32>>) -> !torchtpu.ref<tensor<2x4x3xf32>>
  %q = "torchtpu.permute"(%p) {permutation = array<i64: 1, 0, 2>} : (!torchtpu.ref<tensor<2x4x3xf32>>) -> !torchtpu.ref<tensor<4x2x3xf32>>
  %1 = "torchtpu.load"(%q) : (!torchtpu.ref<tensor<4x2x3xf32>>) -> tensor<4x2x3xf32>
  return %0, %1 : tensor<6x4xf32>, tensor<4x2x3xf32>
}

// -----

// A write through an expanded view is defined when the views above the expand pick
// distinct elements: x.expand(2, 3)[1] = v writes x itself, through one gather_view.
// CHECK-LABEL: func.func @select_of_expand_is_writable
// CHECK:         %[[G:.*]] = "torchtpu.gather_view"(%arg0) {indices = dense<[0, 1, 2]> : tensor<3xi64>}
// CHECK:         "torchtpu.store"(%[[G]], %arg1)
func.func @select_of_expand_is_writable(%r: !torchtpu.ref<tensor<3xf32>>, %v: tensor<3xf32>) {
  %e = "torchtpu.expand"(%r) : (!torchtpu.ref<tensor<3xf32>>) -> !torchtpu.ref<tensor<2x3xf32>>
  %s = "torchtpu.select"(%e) {dim = 0 : i64, index = 1 : i64} : (!torchtpu.ref<tensor<2x3xf32>>) -> !torchtpu.ref<tensor<3xf32>>
  "torchtpu.store"(%s, %v) : (!torchtpu.ref<tensor<3xf32>>, tensor<3xf32>) -> ()
  return
}
