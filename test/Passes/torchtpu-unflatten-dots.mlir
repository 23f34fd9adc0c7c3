// RUN: torchtpu-opt %s --split-input-file --torchtpu-unflatten-dots | FileCheck %s

// nn.Linear on a (batch, seq, features) input: PyTorch's mm of the flattened rows,
// viewed back. The product keeps batch and seq apart; both reshapes go.
// CHECK-LABEL: func.func @linear_forward
// CHECK-SAME:    (%[[X:.*]]: tensor<4x8x16xf32>, %[[W:.*]]: tensor<16x32xf32>)
// CHECK-NEXT:    %[[P:.*]] = stablehlo.dot_general %[[X]], %[[W]], contracting_dims = [2] x [0], precision = [HIGH, HIGH] : (tensor<4x8x16xf32>, tensor<16x32xf32>) -> tensor<4x8x32xf32>
// CHECK-NEXT:    return %[[P]]
func.func @linear_forward(%x: tensor<4x8x16xf32>, %w: tensor<16x32xf32>) -> tensor<4x8x32xf32> {
  %0 = stablehlo.reshape %x : (tensor<4x8x16xf32>) -> tensor<32x16xf32>
  %1 = stablehlo.dot_general %0, %w, contracting_dims = [1] x [0], precision = [HIGH, HIGH] : (tensor<32x16xf32>, tensor<16x32xf32>) -> tensor<32x32xf32>
  %2 = stablehlo.reshape %1 : (tensor<32x32xf32>) -> tensor<4x8x32xf32>
  return %2 : tensor<4x8x32xf32>
}

// -----

// The product keeps every attribute of the one it replaces: a lowering's
// `torchtpu.fixed_precision` marker survives for torchtpu-set-precision.
// CHECK-LABEL: func.func @attributes_kept
// CHECK-NEXT:    stablehlo.dot_general %arg0, %arg1, contracting_dims = [2] x [0], precision = [HIGHEST, HIGHEST] {torchtpu.fixed_precision}
func.func @attributes_kept(%x: tensor<4x8x16xf32>, %w: tensor<16x32xf32>) -> tensor<4x8x32xf32> {
  %0 = stablehlo.reshape %x : (tensor<4x8x16xf32>) -> tensor<32x16xf32>
  %1 = stablehlo.dot_general %0, %w, contracting_dims = [1] x [0], precision = [HIGHEST, HIGHEST] {torchtpu.fixed_precision} : (tensor<32x16xf32>, tensor<16x32xf32>) -> tensor<32x32xf32>
  %2 = stablehlo.reshape %1 : (tensor<32x32xf32>) -> tensor<4x8x32xf32>
  return %2 : tensor<4x8x32xf32>
}

// -----

// A 2-D reader of the product still gets the 2-D result.
// CHECK-LABEL: func.func @flat_result_read
// CHECK:         %[[P:.*]] = stablehlo.dot_general %arg0, %arg1, contracting_dims = [2] x [0] : (tensor<4x8x16xf32>, tensor<16x32xf32>) -> tensor<4x8x32xf32>
// CHECK-NEXT:    %[[F:.*]] = stablehlo.reshape %[[P]] : (tensor<4x8x32xf32>) -> tensor<32x32xf32>
// CHECK-NEXT:    %[[T:.*]] = stablehlo.tanh %[[F]]
// CHECK-NEXT:    return %[[T]], %[[P]]
func.func @flat_result_read(%x: tensor<4x8x16xf32>, %w: tensor<16x32xf32>) -> (tensor<32x32xf32>, tensor<4x8x32xf32>) {
  %0 = stablehlo.reshape %x : (tensor<4x8x16xf32>) -> tensor<32x16xf32>
  %1 = stablehlo.dot_general %0, %w, contracting_dims = [1] x [0] : (tensor<32x16xf32>, tensor<16x32xf32>) -> tensor<32x32xf32>
  %2 = stablehlo.tanh %1 : tensor<32x32xf32>
  %3 = stablehlo.reshape %1 : (tensor<32x32xf32>) -> tensor<4x8x32xf32>
  return %2, %3 : tensor<32x32xf32>, tensor<4x8x32xf32>
}

// -----

// The weight gradient grad.t() @ input, the input saved flat by the forward (a 2-D
// argument): both contract over (batch, seq), the argument split row-major.
// CHECK-LABEL: func.func @weight_gradient_saved_flat
// CHECK-SAME:    (%[[G:.*]]: tensor<4x8x32xbf16>, %[[X:.*]]: tensor<32x16xbf16>)
// CHECK-NEXT:    %[[S:.*]] = stablehlo.reshape %[[X]] : (tensor<32x16xbf16>) -> tensor<4x8x16xbf16>
// CHECK-NEXT:    %[[P:.*]] = stablehlo.dot_general %[[G]], %[[S]], contracting_dims = [0, 1] x [0, 1] : (tensor<4x8x32xbf16>, tensor<4x8x16xbf16>) -> tensor<32x16xf32>
// CHECK-NEXT:    return %[[P]]
func.func @weight_gradient_saved_flat(%g: tensor<4x8x32xbf16>, %x: tensor<32x16xbf16>) -> tensor<32x16xf32> {
  %0 = stablehlo.reshape %g : (tensor<4x8x32xbf16>) -> tensor<32x32xbf16>
  %1 = stablehlo.transpose %0, dims = [1, 0] : (tensor<32x32xbf16>) -> tensor<32x32xbf16>
  %2 = stablehlo.dot_general %1, %x, contracting_dims = [1] x [0] : (tensor<32x32xbf16>, tensor<32x16xbf16>) -> tensor<32x16xf32>
  return %2 : tensor<32x16xf32>
}

// -----

// Both operands flattened from the same three leading dims: no reshape is left.
// CHECK-LABEL: func.func @weight_gradient_both_flattened
// CHECK-NEXT:    %[[P:.*]] = stablehlo.dot_general %arg0, %arg1, contracting_dims = [0, 1, 2] x [0, 1, 2] : (tensor<2x3x5x7xf32>, tensor<2x3x5x4xf32>) -> tensor<7x4xf32>
// CHECK-NEXT:    return %[[P]]
func.func @weight_gradient_both_flattened(%g: tensor<2x3x5x7xf32>, %x: tensor<2x3x5x4xf32>) -> tensor<7x4xf32> {
  %0 = stablehlo.reshape %g : (tensor<2x3x5x7xf32>) -> tensor<30x7xf32>
  %1 = stablehlo.transpose %0, dims = [1, 0] : (tensor<30x7xf32>) -> tensor<7x30xf32>
  %2 = stablehlo.reshape %x : (tensor<2x3x5x4xf32>) -> tensor<30x4xf32>
  %3 = stablehlo.dot_general %1, %2, contracting_dims = [1] x [0] : (tensor<7x30xf32>, tensor<30x4xf32>) -> tensor<7x4xf32>
  return %3 : tensor<7x4xf32>
}

// -----

// The other operand contracts its dim 1: transposed, then split.
// CHECK-LABEL: func.func @other_operand_contracts_dim_1
// CHECK-NEXT:    %[[T:.*]] = stablehlo.transpose %arg0, dims = [1, 0] : (tensor<6x32xf32>) -> tensor<32x6xf32>
// CHECK-NEXT:    %[[S:.*]] = stablehlo.reshape %[[T]] : (tensor<32x6xf32>) -> tensor<4x8x6xf32>
// CHECK-NEXT:    %[[P:.*]] = stablehlo.dot_general %[[S]], %arg1, contracting_dims = [0, 1] x [0, 1] : (tensor<4x8x6xf32>, tensor<4x8x16xf32>) -> tensor<6x16xf32>
// CHECK-NEXT:    return %[[P]]
func.func @other_operand_contracts_dim_1(%a: tensor<6x32xf32>, %x: tensor<4x8x16xf32>) -> tensor<6x16xf32> {
  %0 = stablehlo.reshape %x : (tensor<4x8x16xf32>) -> tensor<32x16xf32>
  %1 = stablehlo.dot_general %a, %0, contracting_dims = [1] x [0] : (tensor<6x32xf32>, tensor<32x16xf32>) -> tensor<6x16xf32>
  return %1 : tensor<6x16xf32>
}

// -----

// The rhs's free dim is the merged rows (w @ x_flat.t()): kept apart after the lhs's
// free dim, then reshaped for the 2-D reader.
// CHECK-LABEL: func.func @rhs_free_rows
// CHECK-NEXT:    %[[P:.*]] = stablehlo.dot_general %arg0, %arg1, contracting_dims = [1] x [2] : (tensor<6x16xf32>, tensor<4x8x16xf32>) -> tensor<6x4x8xf32>
// CHECK-NEXT:    %[[F:.*]] = stablehlo.reshape %[[P]] : (tensor<6x4x8xf32>) -> tensor<6x32xf32>
// CHECK-NEXT:    return %[[F]]
func.func @rhs_free_rows(%w: tensor<6x16xf32>, %x: tensor<4x8x16xf32>) -> tensor<6x32xf32> {
  %0 = stablehlo.reshape %x : (tensor<4x8x16xf32>) -> tensor<32x16xf32>
  %1 = stablehlo.transpose %0, dims = [1, 0] : (tensor<32x16xf32>) -> tensor<16x32xf32>
  %2 = stablehlo.dot_general %w, %1, contracting_dims = [1] x [0] : (tensor<6x16xf32>, tensor<16x32xf32>) -> tensor<6x32xf32>
  return %2 : tensor<6x32xf32>
}

// -----

// Both operands read the same flattening (x.t() @ x, a Gram matrix): it goes once.
// CHECK-LABEL: func.func @gram
// CHECK-NEXT:    %[[P:.*]] = stablehlo.dot_general %arg0, %arg0, contracting_dims = [0, 1] x [0, 1] : (tensor<4x8x16xf32>, tensor<4x8x16xf32>) -> tensor<16x16xf32>
// CHECK-NEXT:    return %[[P]]
func.func @gram(%x: tensor<4x8x16xf32>) -> tensor<16x16xf32> {
  %0 = stablehlo.reshape %x : (tensor<4x8x16xf32>) -> tensor<32x16xf32>
  %1 = stablehlo.transpose %0, dims = [1, 0] : (tensor<32x16xf32>) -> tensor<16x32xf32>
  %2 = stablehlo.dot_general %1, %0, contracting_dims = [1] x [0] : (tensor<16x32xf32>, tensor<32x16xf32>) -> tensor<16x16xf32>
  return %2 : tensor<16x16xf32>
}

// The same product with the rows contracted on the lhs and the transpose on the rhs: the
// transpose goes first, then the reshape it read.
// CHECK-LABEL: func.func @gram_transposed_rhs
// CHECK-NEXT:    %[[P:.*]] = stablehlo.dot_general %arg0, %arg0, contracting_dims = [0, 1] x [0, 1] : (tensor<4x8x16xf32>, tensor<4x8x16xf32>) -> tensor<16x16xf32>
// CHECK-NEXT:    return %[[P]]
func.func @gram_transposed_rhs(%x: tensor<4x8x16xf32>) -> tensor<16x16xf32> {
  %0 = stablehlo.reshape %x : (tensor<4x8x16xf32>) -> tensor<32x16xf32>
  %1 = stablehlo.transpose %0, dims = [1, 0] : (tensor<32x16xf32>) -> tensor<16x32xf32>
  %2 = stablehlo.dot_general %0, %1, contracting_dims = [0] x [1] : (tensor<32x16xf32>, tensor<16x32xf32>) -> tensor<16x16xf32>
  return %2 : tensor<16x16xf32>
}

// -----

// A flattening read by something else stays for that reader.
// CHECK-LABEL: func.func @flattening_read_elsewhere
// CHECK-NEXT:    %[[F:.*]] = stablehlo.reshape %arg0 : (tensor<4x8x16xf32>) -> tensor<32x16xf32>
// CHECK-NEXT:    %[[P:.*]] = stablehlo.dot_general %arg0, %arg1, contracting_dims = [2] x [0] : (tensor<4x8x16xf32>, tensor<16x32xf32>) -> tensor<4x8x32xf32>
// CHECK-NEXT:    return %[[P]], %[[F]]
func.func @flattening_read_elsewhere(%x: tensor<4x8x16xf32>, %w: tensor<16x32xf32>) -> (tensor<4x8x32xf32>, tensor<32x16xf32>) {
  %0 = stablehlo.reshape %x : (tensor<4x8x16xf32>) -> tensor<32x16xf32>
  %1 = stablehlo.dot_general %0, %w, contracting_dims = [1] x [0] : (tensor<32x16xf32>, tensor<16x32xf32>) -> tensor<32x32xf32>
  %2 = stablehlo.reshape %1 : (tensor<32x32xf32>) -> tensor<4x8x32xf32>
  return %2, %0 : tensor<4x8x32xf32>, tensor<32x16xf32>
}

// -----

// Left alone: a batched product (bmm), a reshape that merges trailing dims, a 2-D
// operand with no flattening, a dynamic dim.
// CHECK-LABEL: func.func @left_alone
// CHECK:         stablehlo.reshape %arg0 : (tensor<2x4x8x16xf32>) -> tensor<8x8x16xf32>
// CHECK:         stablehlo.dot_general {{.*}} batching_dims = [0] x [0], contracting_dims = [2] x [1]
// CHECK:         stablehlo.reshape %arg2 : (tensor<4x8x4xf32>) -> tensor<4x32xf32>
// CHECK:         stablehlo.dot_general {{.*}} contracting_dims = [1] x [0] : (tensor<4x32xf32>, tensor<32x5xf32>)
// CHECK:         stablehlo.dot_general %arg4, %arg5, contracting_dims = [1] x [0] : (tensor<7x3xf32>, tensor<3x5xf32>)
// CHECK:         stablehlo.dot_general {{.*}} : (tensor<?x16xf32>, tensor<16x32xf32>)
func.func @left_alone(%a: tensor<2x4x8x16xf32>, %b: tensor<8x16x3xf32>, %c: tensor<4x8x4xf32>, %d: tensor<32x5xf32>,
                      %e: tensor<7x3xf32>, %f: tensor<3x5xf32>, %g: tensor<?x4x16xf32>, %w: tensor<16x32xf32>,
                      %shape: tensor<2xi64>)
    -> (tensor<8x8x3xf32>, tensor<4x5xf32>, tensor<7x5xf32>, tensor<?x32xf32>) {
  %0 = stablehlo.reshape %a : (tensor<2x4x8x16xf32>) -> tensor<8x8x16xf32>
  %1 = stablehlo.dot_general %0, %b, batching_dims = [0] x [0], contracting_dims = [2] x [1] : (tensor<8x8x16xf32>, tensor<8x16x3xf32>) -> tensor<8x8x3xf32>
  %2 = stablehlo.reshape %c : (tensor<4x8x4xf32>) -> tensor<4x32xf32>
  %3 = stablehlo.dot_general %2, %d, contracting_dims = [1] x [0] : (tensor<4x32xf32>, tensor<32x5xf32>) -> tensor<4x5xf32>
  %4 = stablehlo.dot_general %e, %f, contracting_dims = [1] x [0] : (tensor<7x3xf32>, tensor<3x5xf32>) -> tensor<7x5xf32>
  %5 = stablehlo.dynamic_reshape %g, %shape : (tensor<?x4x16xf32>, tensor<2xi64>) -> tensor<?x16xf32>
  %6 = stablehlo.dot_general %5, %w, contracting_dims = [1] x [0] : (tensor<?x16xf32>, tensor<16x32xf32>) -> tensor<?x32xf32>
  return %1, %3, %4, %6 : tensor<8x8x3xf32>, tensor<4x5xf32>, tensor<7x5xf32>, tensor<?x32xf32>
}
