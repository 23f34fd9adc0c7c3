// RUN: torchtpu-opt %s --split-input-file --verify-diagnostics --torchtpu-verify --torchtpu-lower-collectives
// Without torchtpu-verify first, a malformed op is still a located error, not a crash:
// RUN: torchtpu-opt %s --split-input-file --verify-diagnostics --torchtpu-lower-collectives

// What StableHLO cannot express is a located error naming the collective.

func.func @premul_sum(%a: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error @below {{torchtpu-lower-collectives: torchtpu.collective 'all_reduce' (premul_sum) on group 'g': reduce op 'premul_sum' is not supported; multiply by the factor before a 'sum' collective}}
  %0 = "torchtpu.collective"(%a) {kind = "all_reduce", reduce_op = "premul_sum", group_name = "g", replica_groups = dense<[[0, 1]]> : tensor<1x2xi64>, group_ranks = array<i64: 0, 1>} : (tensor<4xf32>) -> tensor<4xf32>
  return %0 : tensor<4xf32>
}

// -----

func.func @bitwise_on_floats(%a: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error @below {{reduce op 'bor' is not defined for float elements (f32); it applies to bool, int tensors}}
  %0 = "torchtpu.collective"(%a) {kind = "all_reduce", reduce_op = "bor", replica_groups = dense<[[0, 1]]> : tensor<1x2xi64>, group_ranks = array<i64: 0, 1>} : (tensor<4xf32>) -> tensor<4xf32>
  return %0 : tensor<4xf32>
}

// -----

func.func @max_of_complex(%a: tensor<4xcomplex<f32>>) -> tensor<4xcomplex<f32>> {
  // expected-error @below {{reduce op 'max' is not defined for complex elements}}
  %0 = "torchtpu.collective"(%a) {kind = "all_reduce", reduce_op = "max", replica_groups = dense<[[0, 1]]> : tensor<1x2xi64>, group_ranks = array<i64: 0, 1>} : (tensor<4xcomplex<f32>>) -> tensor<4xcomplex<f32>>
  return %0 : tensor<4xcomplex<f32>>
}

// -----

func.func @uneven_all_gather(%a: tensor<4xf32>) -> tensor<12xf32> {
  // expected-error @below {{all_gather over groups of different sizes ([[0, 2, 3], [1]]) gives each rank a different shape}}
  %0 = "torchtpu.collective"(%a) {kind = "all_gather", dim = 0 : i64, replica_groups = dense<[[0, 2, 3], [1, -1, -1]]> : tensor<2x3xi64>, group_ranks = array<i64: 0, 2, 3>} : (tensor<4xf32>) -> tensor<12xf32>
  return %0 : tensor<12xf32>
}

// -----

func.func @not_a_partition(%a: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error @below {{'torchtpu.collective' op 'replica_groups' [[0, 1], [1, 2]] is not a partition: a rank appears twice}}
  %0 = "torchtpu.collective"(%a) {kind = "all_reduce", reduce_op = "sum", replica_groups = dense<[[0, 1], [1, 2]]> : tensor<2x2xi64>, group_ranks = array<i64: 0, 1>} : (tensor<4xf32>) -> tensor<4xf32>
  return %0 : tensor<4xf32>
}

// -----

func.func @group_not_in_partition(%a: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error @below {{'group_ranks' [0, 2] is not one of the groups of 'replica_groups' [[0, 1], [2, 3]]}}
  %0 = "torchtpu.collective"(%a) {kind = "all_reduce", reduce_op = "sum", replica_groups = dense<[[0, 1], [2, 3]]> : tensor<2x2xi64>, group_ranks = array<i64: 0, 2>} : (tensor<4xf32>) -> tensor<4xf32>
  return %0 : tensor<4xf32>
}

// -----

func.func @wrong_gather_shape(%a: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error @below {{result shape [4] must be [8] for kind 'all_gather' over 2 ranks}}
  %0 = "torchtpu.collective"(%a) {kind = "all_gather", replica_groups = dense<[[0, 1], [2, 3]]> : tensor<2x2xi64>, group_ranks = array<i64: 0, 1>} : (tensor<4xf32>) -> tensor<4xf32>
  return %0 : tensor<4xf32>
}

// -----

func.func @unknown_reduce_op(%a: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error @below {{attribute 'reduce_op' must be one of "sum", "avg", "product", "min", "max", "band", "bor", "bxor", "premul_sum"}}
  %0 = "torchtpu.collective"(%a) {kind = "all_reduce", reduce_op = "mean", replica_groups = dense<[[0, 1]]> : tensor<1x2xi64>, group_ranks = array<i64: 0, 1>} : (tensor<4xf32>) -> tensor<4xf32>
  return %0 : tensor<4xf32>
}

// -----

func.func @broadcast_without_src(%a: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error @below {{kind 'broadcast' requires 'src'}}
  %0 = "torchtpu.collective"(%a) {kind = "broadcast", replica_groups = dense<[[0, 1]]> : tensor<1x2xi64>, group_ranks = array<i64: 0, 1>} : (tensor<4xf32>) -> tensor<4xf32>
  return %0 : tensor<4xf32>
}

// -----

func.func @missing_kind(%a: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error @below {{'torchtpu.collective' op requires attribute 'kind'}}
  %0 = "torchtpu.collective"(%a) {replica_groups = dense<[[0, 1]]> : tensor<1x2xi64>, group_ranks = array<i64: 0, 1>} : (tensor<4xf32>) -> tensor<4xf32>
  return %0 : tensor<4xf32>
}
