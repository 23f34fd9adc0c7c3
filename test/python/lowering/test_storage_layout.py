"""Strided windows of a flat storage (compiler/lowering/storage_layout.py) through the
compiler path: `as_strided` / `as_strided_scatter` graphs, imported, compiled and run on
XLA:CPU, against eager on CPU. The eager device reads and writes its storages with the
same builders: test/python/device/test_device_storage_layout.py runs the same windows there.

The windows (`storage_windows.py`, shared with the device test) cover every path of the
builders."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from harness import check, lower_and_run
from storage_windows import WINDOWS, WRITABLE

from torch_tpu.compiler.lowering import LoweringError
from torch_tpu.compiler.context import func, ir, make_context
from torch_tpu.compiler.dtypes import tensor_type
from torch_tpu.compiler.lowering.storage_layout import (
    box_of,
    dense_order,
    read_strided,
    strided_positions,
    window_span,
    write_order,
    write_strided,
)

aten = torch.ops.aten

# Inputs of 24 elements whose storage the windows address: contiguous, and a transposed
# (dense, non-contiguous) layout -- as_strided addresses the storage, not the value.
BASES = {
    "contiguous": lambda t: t,
    "transposed": lambda t: t.t(),
}


@pytest.fixture
def base() -> torch.Tensor:
    return torch.randn(4, 6, generator=torch.Generator().manual_seed(0))


def _source(size) -> torch.Tensor:
    return torch.arange(1, 1 + int(np.prod(size, dtype=np.int64)), dtype=torch.float32).reshape(size) * 10


@pytest.mark.parametrize("layout", sorted(BASES))
@pytest.mark.parametrize("window", sorted(WINDOWS))
def test_as_strided_reads_the_window(base, window, layout):
    size, stride, offset = WINDOWS[window]
    view = BASES[layout]
    check(lambda t: view(t).as_strided(size, stride, offset) * 1, base, ops=[aten.as_strided.default])


@pytest.mark.parametrize("layout", sorted(BASES))
@pytest.mark.parametrize("window", WRITABLE)
def test_as_strided_scatter_writes_the_window(base, window, layout):
    size, stride, offset = WINDOWS[window]
    view = BASES[layout]
    check(lambda t, s: torch.as_strided_scatter(view(t), s, size, stride, offset), base, _source(size),
          ops=[aten.as_strided_scatter.default])


def test_a_zero_stride_write_is_refused(base):
    size, stride, offset = WINDOWS["overlapping_zero_stride"]
    with pytest.raises(RuntimeError, match="more than one element of the written-to tensor"):
        torch.as_strided_scatter(base, _source(size), size, stride, offset)
    # The compiled graph leaves it to eager, which raises that error.
    with pytest.raises(LoweringError, match=r"as_strided_scatter\(size=\[2, 3\], stride=\[0, 1\]\) writes a window "
                       "with a zero stride"):
        lower_and_run(lambda t, s: torch.as_strided_scatter(t, s, size, stride, offset), base, _source(size))


@pytest.mark.parametrize(
    "size, stride, kept",
    [
        # Positions i + 2j: CPU's copy_ visits j outermost (the larger stride), so position 2
        # keeps (0, 1) = 20, not (2, 0) = 90, the later one in logical order.
        ((3, 4), (1, 2), [10, 50, 20, 60, 30, 70, 40, 80, 120]),
        # Equal strides: the source's (contiguous) strides order the dims, logical order.
        ((2, 2), (1, 1), [10, 30, 40]),
    ],
)
def test_an_overlapping_write_keeps_what_cpu_copy_writes_last(size, stride, kept):
    storage = torch.zeros(4, 6)
    expected = torch.as_strided_scatter(storage, _source(size), size, stride, 0)
    assert expected.reshape(-1)[: len(kept)].tolist() == kept
    assert write_order(size, stride) == ([1, 0] if stride == (1, 2) else [0, 1])
    check(lambda t, s: torch.as_strided_scatter(t, s, size, stride, 0), storage, _source(size))


def test_integer_and_bool_storages():
    ints = torch.arange(24, dtype=torch.int32).reshape(4, 6)
    flags = ints % 3 == 0
    size, stride, offset = WINDOWS["odd_strides"]
    check(lambda t: t.as_strided(size, stride, offset) + 0, ints)
    check(lambda t: t.as_strided(size, stride, offset).logical_not(), flags)
    check(lambda t, s: torch.as_strided_scatter(t, s, size, stride, offset), flags, torch.ones(size, dtype=torch.bool))


BOXES = sorted(name for name in WINDOWS if name.startswith(("box", "transposed_box", "broadcast", "gapped")))


def _built(build) -> str:
    """The text of a function of a flat float32 storage of 24 elements built by `build`."""
    with make_context(), ir.Location.unknown():
        module = ir.Module.create()
        with ir.InsertionPoint(module.body):
            storage_type = tensor_type([24], torch.float32)
            fn = func.FuncOp("main", ir.FunctionType.get([storage_type], []))
            with ir.InsertionPoint(fn.add_entry_block()):
                result = build(fn.arguments[0])
                func.ReturnOp([result])
            fn.attributes["function_type"] = ir.TypeAttr.get(ir.FunctionType.get([storage_type], [result.type]))
        assert module.operation.verify()
        return str(module)


@pytest.mark.parametrize("window", BOXES)
def test_a_box_is_read_and_written_without_a_gather(window):
    """A slice of a dense block (a chunk of a transposed head view, a column range) is a
    reshape and a slice, not a gather of single elements at positions held in a constant
    as large as the window (on a TPU, one such gather per view operand made the FUSED
    training step 10x slower than compiled)."""
    size, stride, offset = WINDOWS[window]
    assert box_of(size, stride, offset, 24) is not None
    read = _built(lambda storage: read_strided(storage, size, stride, offset))
    assert "gather" not in read and "stablehlo.slice" in read
    if window in WRITABLE:
        written = _built(lambda storage: write_strided(storage, _iota(size), size, stride, offset))
        assert "gather" not in written and "dynamic_update_slice" in written


def _iota(size):
    from torch_tpu.compiler import ir as build

    return build.iota([int(n) for n in size], 0, ir.F32Type.get())


@pytest.mark.parametrize("window", ["overlapping", "odd_strides", "odd_strides_3d"])
def test_windows_that_are_no_box_are_gathered(window):
    size, stride, offset = WINDOWS[window]
    assert box_of(size, stride, offset, 24) is None


# -- the layout arithmetic, against PyTorch's own addressing ------------------------------------------
@pytest.mark.parametrize("window", sorted(WINDOWS))
def test_positions_and_span_are_pytorchs(window):
    size, stride, offset = WINDOWS[window]
    storage = torch.arange(24)
    expected = storage.as_strided(size, stride, offset)
    positions = strided_positions(size, stride, offset)
    assert positions.tolist() == expected.tolist()
    span = window_span(size, stride, offset)
    if expected.numel() == 0:
        assert span is None
    else:
        assert span == (int(expected.min()), int(expected.max()))


@pytest.mark.parametrize(
    "size, stride, order",
    [
        ((4, 6), (6, 1), [0, 1]),
        ((4, 6), (1, 4), [1, 0]),  # transposed
        ((2, 3, 4, 5), (60, 1, 15, 3), [0, 2, 3, 1]),  # channels-last
        ((1, 4, 1), (9, 1, 3), [1, 0, 2]),  # size-1 dims go last, whatever their strides
        ((), (), []),
        ((3, 4), (1, 2), None),  # overlapping
        ((2, 2), (12, 1), None),  # gapped
        ((0, 3), (2, 5), None),  # empty with strides no dense tensor has
    ],
)
def test_dense_order(size, stride, order):
    assert dense_order(size, stride) == order
    if order is not None and size:
        t = torch.empty_strided(size, stride)
        # The claim the builders rely on: the storage is the value permuted by `order`, flattened.
        values = torch.arange(t.numel(), dtype=torch.float32)
        t.as_strided((t.numel(),), (1,), 0).copy_(values)
        assert torch.equal(t.permute(order).reshape(-1), values)


def test_write_order_is_cpu_copys_on_random_overlapping_windows():
    """Which element each position keeps, by `write_order`, against eager on 400 random
    windows (most of them overlapping); zero-stride windows, which eager refuses, are skipped."""
    rng = np.random.default_rng(0)
    for _ in range(400):
        rank = int(rng.integers(1, 4))
        size = [int(n) for n in rng.integers(1, 5, rank)]
        stride = [int(s) for s in rng.integers(1, 5, rank)]
        offset = int(rng.integers(0, 4))
        storage = torch.zeros(window_span(size, stride, offset)[1] + 1)
        source = _source(size)
        expected = torch.as_strided_scatter(storage, source, size, stride, offset)
        order = write_order(size, stride)
        kept = storage.clone()
        positions = strided_positions(size, stride, offset).transpose(order).reshape(-1)
        for position, value in zip(positions, source.permute(order).reshape(-1)):
            kept[int(position)] = value
        assert torch.equal(kept, expected), (size, stride, offset, order)
