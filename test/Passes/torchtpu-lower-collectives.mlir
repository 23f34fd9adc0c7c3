// RUN: torchtpu-opt %s --split-input-file --torchtpu-lower-collectives | FileCheck %s
// RUN: torchtpu-opt %s --split-input-file --torchtpu-lower-collectives="global-device-ids=true broadcast=all_gather bitwise=bytes" | FileCheck %s --check-prefix=GLOBAL

// The complete partition (every subgroup, also those rank 0 is not in) becomes the
// replica groups; a sum is an add region.
// CHECK-LABEL: func.func @all_reduce_sum
// CHECK:       "stablehlo.all_reduce"(%arg0)
// CHECK-SAME:  replica_groups = dense<{{\[\[}}4, 0, 1, 3], [5, 2, 6, 7]]> : tensor<2x4xi64>
// CHECK-NOT:   channel_handle
// CHECK:       stablehlo.add
// CHECK-NOT:   torchtpu.collective
// GLOBAL-LABEL: func.func @all_reduce_sum
// GLOBAL:       "stablehlo.all_reduce"(%arg0) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, replica_groups = {{.*}}, use_global_device_ids}>
func.func @all_reduce_sum(%a: tensor<4xf32>) -> tensor<4xf32> {
  %0 = "torchtpu.collective"(%a) {kind = "all_reduce", reduce_op = "sum", replica_groups = dense<[[4, 0, 1, 3], [5, 2, 6, 7]]> : tensor<2x4xi64>, group_ranks = array<i64: 4, 0, 1, 3>} : (tensor<4xf32>) -> tensor<4xf32>
  return %0 : tensor<4xf32>
}

// -----

// Each reduce op picks its combiner; avg divides the sum by the group size.
// CHECK-LABEL: func.func @reduce_ops
// CHECK:       "stablehlo.all_reduce"
// CHECK:       stablehlo.multiply
// CHECK:       "stablehlo.all_reduce"
// CHECK:       stablehlo.minimum
// CHECK:       "stablehlo.all_reduce"
// CHECK:       stablehlo.maximum
// CHECK:       "stablehlo.all_reduce"
// CHECK:       stablehlo.add
// CHECK:       %[[TWO:.*]] = stablehlo.constant dense<2.000000e+00> : tensor<4xf32>
// CHECK:       stablehlo.divide %{{.*}}, %[[TWO]]
// CHECK:       "stablehlo.all_reduce"
// CHECK:       stablehlo.xor
// GLOBAL-LABEL: func.func @reduce_ops
// integers' bitwise ops go through one byte per bit (bitwise=bytes)
// GLOBAL:       stablehlo.shift_right_logical
// GLOBAL:       "stablehlo.all_reduce"
// GLOBAL:       }) : (tensor<4x32xui8>) -> tensor<4x32xui8>
// GLOBAL:       stablehlo.shift_left
func.func @reduce_ops(%a: tensor<4xf32>, %b: tensor<4xi32>) -> (tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xi32>) {
  %0 = "torchtpu.collective"(%a) {kind = "all_reduce", reduce_op = "product", replica_groups = dense<[[0, 1], [2, 3]]> : tensor<2x2xi64>, group_ranks = array<i64: 0, 1>} : (tensor<4xf32>) -> tensor<4xf32>
  %1 = "torchtpu.collective"(%a) {kind = "all_reduce", reduce_op = "min", replica_groups = dense<[[0, 1], [2, 3]]> : tensor<2x2xi64>, group_ranks = array<i64: 0, 1>} : (tensor<4xf32>) -> tensor<4xf32>
  %2 = "torchtpu.collective"(%a) {kind = "all_reduce", reduce_op = "max", replica_groups = dense<[[0, 1], [2, 3]]> : tensor<2x2xi64>, group_ranks = array<i64: 0, 1>} : (tensor<4xf32>) -> tensor<4xf32>
  %3 = "torchtpu.collective"(%a) {kind = "all_reduce", reduce_op = "avg", replica_groups = dense<[[0, 1], [2, 3]]> : tensor<2x2xi64>, group_ranks = array<i64: 0, 1>} : (tensor<4xf32>) -> tensor<4xf32>
  %4 = "torchtpu.collective"(%b) {kind = "all_reduce", reduce_op = "bxor", replica_groups = dense<[[0, 1], [2, 3]]> : tensor<2x2xi64>, group_ranks = array<i64: 0, 1>} : (tensor<4xi32>) -> tensor<4xi32>
  return %0, %1, %2, %3, %4 : tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xi32>
}

// -----

// Uneven groups (padded with -1): avg looks the divisor up by rank.
// CHECK-LABEL: func.func @uneven_avg
// CHECK:       "stablehlo.all_reduce"{{.*}}replica_groups = dense<{{\[\[}}0, 2, 3], [1, -1, -1]]>
// CHECK:       stablehlo.constant dense<[3, 1, 3, 3]> : tensor<4xi32>
// CHECK:       stablehlo.replica_id
// CHECK:       stablehlo.dynamic_slice
// CHECK:       stablehlo.divide
// GLOBAL-LABEL: func.func @uneven_avg
// GLOBAL:       stablehlo.partition_id
func.func @uneven_avg(%a: tensor<4xf32>) -> tensor<4xf32> {
  %0 = "torchtpu.collective"(%a) {kind = "all_reduce", reduce_op = "avg", replica_groups = dense<[[0, 2, 3], [1, -1, -1]]> : tensor<2x3xi64>, group_ranks = array<i64: 0, 2, 3>} : (tensor<4xf32>) -> tensor<4xf32>
  return %0 : tensor<4xf32>
}

// -----

// CHECK-LABEL: func.func @gather_scatter_all_to_all
// CHECK:       "stablehlo.all_gather"(%arg0) <{all_gather_dim = 1 : i64, replica_groups = dense<{{\[\[}}0, 4], [1, 5], [2, 6], [3, 7]]> : tensor<4x2xi64>}> : (tensor<4x6xf32>) -> tensor<4x12xf32>
// CHECK:       "stablehlo.reduce_scatter"(%arg0) <{replica_groups = {{.*}}, scatter_dimension = 0 : i64}>
// CHECK:       stablehlo.add
// CHECK:       -> tensor<2x6xf32>
// CHECK:       "stablehlo.all_to_all"(%arg0) <{concat_dimension = 0 : i64, replica_groups = {{.*}}, split_count = 2 : i64, split_dimension = 0 : i64}>
// GLOBAL-LABEL: func.func @gather_scatter_all_to_all
// GLOBAL:       "stablehlo.all_gather"{{.*}}channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>{{.*}}use_global_device_ids
// GLOBAL:       "stablehlo.reduce_scatter"{{.*}}channel_handle = #stablehlo.channel_handle<handle = 2, type = 1>{{.*}}use_global_device_ids
// GLOBAL:       "stablehlo.all_to_all"{{.*}}channel_handle = #stablehlo.channel_handle<handle = 3, type = 1>
func.func @gather_scatter_all_to_all(%a: tensor<4x6xf32>) -> (tensor<4x12xf32>, tensor<2x6xf32>, tensor<4x6xf32>) {
  %0 = "torchtpu.collective"(%a) {kind = "all_gather", dim = 1 : i64, replica_groups = dense<[[0, 4], [1, 5], [2, 6], [3, 7]]> : tensor<4x2xi64>, group_ranks = array<i64: 0, 4>} : (tensor<4x6xf32>) -> tensor<4x12xf32>
  %1 = "torchtpu.collective"(%a) {kind = "reduce_scatter", reduce_op = "sum", dim = 0 : i64, replica_groups = dense<[[0, 4], [1, 5], [2, 6], [3, 7]]> : tensor<4x2xi64>, group_ranks = array<i64: 0, 4>} : (tensor<4x6xf32>) -> tensor<2x6xf32>
  %2 = "torchtpu.collective"(%a) {kind = "all_to_all", dim = 0 : i64, replica_groups = dense<[[0, 4], [1, 5], [2, 6], [3, 7]]> : tensor<4x2xi64>, group_ranks = array<i64: 0, 4>} : (tensor<4x6xf32>) -> tensor<4x6xf32>
  return %0, %1, %2 : tensor<4x12xf32>, tensor<2x6xf32>, tensor<4x6xf32>
}

// -----

// broadcast: StableHLO's source is each group's first member, so the source index is
// rotated to the front of every group; permute keeps its pairs.
// CHECK-LABEL: func.func @broadcast_permute
// CHECK:       "stablehlo.collective_broadcast"(%arg0) <{replica_groups = dense<{{\[\[}}2, 0, 1, 3], [6, 4, 5, 7]]> : tensor<2x4xi64>}>
// CHECK:       "stablehlo.collective_permute"(%arg0) <{source_target_pairs = dense<{{\[\[}}0, 1], [1, 0]]> : tensor<2x2xi64>}>
// GLOBAL-LABEL: func.func @broadcast_permute
// GLOBAL:       "stablehlo.all_gather"{{.*}} -> tensor<4x3xi32>
// GLOBAL:       stablehlo.slice %{{.*}} [2:3, 0:3]
// GLOBAL-NOT:   collective_broadcast
func.func @broadcast_permute(%a: tensor<3xi32>) -> (tensor<3xi32>, tensor<3xi32>) {
  %0 = "torchtpu.collective"(%a) {kind = "broadcast", src = 2 : i64, replica_groups = dense<[[0, 1, 2, 3], [4, 5, 6, 7]]> : tensor<2x4xi64>, group_ranks = array<i64: 0, 1, 2, 3>} : (tensor<3xi32>) -> tensor<3xi32>
  %1 = "torchtpu.collective"(%a) {kind = "permute", source_target_pairs = dense<[[0, 1], [1, 0]]> : tensor<2x2xi64>} : (tensor<3xi32>) -> tensor<3xi32>
  return %0, %1 : tensor<3xi32>, tensor<3xi32>
}

// -----

// bool reductions are or/and/xor of bytes on every backend.
// CHECK-LABEL: func.func @bool_sum
// CHECK:       stablehlo.convert %arg0 : (tensor<4xi1>) -> tensor<4xui8>
// CHECK:       "stablehlo.all_reduce"
// CHECK:       stablehlo.maximum
// CHECK:       stablehlo.convert {{.*}} : (tensor<4xui8>) -> tensor<4xi1>
func.func @bool_sum(%a: tensor<4xi1>) -> tensor<4xi1> {
  %0 = "torchtpu.collective"(%a) {kind = "all_reduce", reduce_op = "sum", replica_groups = dense<[[0, 1]]> : tensor<1x2xi64>, group_ranks = array<i64: 0, 1>} : (tensor<4xi1>) -> tensor<4xi1>
  return %0 : tensor<4xi1>
}
