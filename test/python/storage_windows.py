"""Strided windows of a 24-element storage, shared by the compiler-path and eager-device
tests of compiler/lowering/storage_layout.py: (size, stride, storage_offset), covering
every path of its builders -- a dense window (read by a slice, written by
dynamic_update_slice), a transposed dense one, boxes of a block array (slices of a dense
block, transposed, with an inner gap, short of the storage's end, broadcast: read by a
reshape and a slice, written by dynamic_update_slice), overlapping and odd strides (read
and written by gathers), size-1 dims, zero-size and 0-d windows."""

WINDOWS = {
    "whole_storage": ((4, 6), (6, 1), 0),
    "dense_at_an_offset": ((2, 3), (3, 1), 10),
    "transposed_dense_at_an_offset": ((3, 4), (1, 3), 5),
    "permuted_dense_3d": ((2, 3, 2), (1, 4, 2), 3),  # memory order [1, 2, 0]: its inverse differs
    "overlapping": ((3, 4), (1, 2), 0),
    "overlapping_zero_stride": ((2, 3), (0, 1), 4),
    "odd_strides": ((3, 2), (5, 3), 1),
    "odd_strides_3d": ((2, 3, 2), (7, 3, 5), 2),
    "gapped_rows": ((2, 2), (12, 1), 3),
    "box_of_rows_and_cols": ((2, 3), (6, 1), 8),
    "transposed_box": ((3, 2), (1, 6), 7),
    "box_with_inner_gap": ((2, 3), (12, 4), 1),
    "box_short_of_the_end": ((3,), (7,), 2),
    "broadcast_box": ((2, 3, 2), (6, 0, 1), 1),
    "broadcast_element": ((3, 2), (0, 0), 5),
    "size_one_dims": ((1, 4, 1), (9, 2, 3), 6),
    "zero_size": ((0, 3), (2, 5), 4),
    "zero_size_last_dim": ((3, 0), (1, 1), 0),
    "zero_d": ((), (), 17),
}

# PyTorch refuses to write a window with a zero stride ("more than one element of the
# written-to tensor refers to a single memory location").
WRITABLE = sorted(
    name for name, (size, stride, _) in WINDOWS.items() if not any(s == 0 and n > 1 for n, s in zip(size, stride))
)
# Windows no two elements of which share a position: in-place ops may write them.
DISJOINT = sorted(name for name in WRITABLE if not name.startswith("overlapping"))
