"""Shared builders for lowering rules: constants, conversions, broadcasting and
PyTorch's type promotion, in one place (CONVENTIONS.md). They spell what needs a torch
dtype or PyTorch's semantics; everything else is compiler.ir's, used qualified
(`from torch_tpu.compiler import ir as hlo`, `hlo.add(...)`): nothing here re-exports it.

All helpers build at the current insertion point and location (the importer sets both
around each rule), so they take only what they compute with.
"""

from __future__ import annotations

import functools
from typing import Sequence, Union

import numpy as np
import torch

from ..context import ir, stablehlo
from ..dtypes import dtype_of, element_type, is_unsigned, tensor_type
from .. import ir as hlo
from .symsize import SymSize, static_layout

Scalar = Union[bool, int, float, complex]
ValueOrScalar = Union[ir.Value, Scalar]

_NUMPY_DTYPES = {
    torch.float32: np.float32,
    torch.float64: np.float64,
    torch.float16: np.float16,
    torch.int8: np.int8,
    torch.int16: np.int16,
    torch.int32: np.int32,
    torch.int64: np.int64,
    torch.uint8: np.uint8,
    torch.bool: np.bool_,
    torch.complex64: np.complex64,
    torch.complex128: np.complex128,
}


# -- inspecting values -----------------------------------------------------------------
def shape_of(value: ir.Value) -> list[int]:
    return list(ir.RankedTensorType(value.type).shape)


def rank_of(value: ir.Value) -> int:
    return ir.RankedTensorType(value.type).rank


def dtype(value: ir.Value) -> torch.dtype:
    return dtype_of(value.type)


def is_value(x) -> bool:
    return isinstance(x, ir.Value)


# -- constants ---------------------------------------------------------------------------
def constant(value, dtype_: torch.dtype, shape: Sequence[int] = ()) -> ir.Value:
    """A constant tensor of `dtype_` and `shape` filled with the scalar `value` (splat),
    or holding `value` when it is an array/tensor of that shape. A symbolic size
    (`SymSize`) is its run-time value, not its bound."""
    if isinstance(value, SymSize):
        return broadcast_to(convert(value.value, dtype_), shape)
    result_type = tensor_type(shape, dtype_)
    if isinstance(value, (np.ndarray, torch.Tensor)) and np.ndim(value) > 0:
        return array_constant(value, dtype_)
    scalar = _scalar_attr(value, dtype_)
    attr = ir.DenseElementsAttr.get_splat(result_type, scalar)
    return stablehlo.ConstantOp(attr).result


def _scalar_attr(value, dtype_: torch.dtype) -> ir.Attribute:
    et = element_type(dtype_)
    if dtype_ is torch.bool:
        return ir.IntegerAttr.get(et, 1 if value else 0)
    if dtype_.is_complex:
        # Complex splats go through a dense array (no complex scalar attribute in Python).
        raise _ComplexSplat()
    if dtype_.is_floating_point:
        return ir.FloatAttr.get(et, float(value))
    v = int(value)
    if is_unsigned(dtype_):
        bits = torch.iinfo(dtype_).bits
        v &= (1 << bits) - 1
    return ir.IntegerAttr.get(et, v)


class _ComplexSplat(Exception):
    pass


def array_constant(array, dtype_: torch.dtype) -> ir.Value:
    """A dense constant from a numpy array or torch tensor (converted to `dtype_`)."""
    if isinstance(array, torch.Tensor):
        t = array.detach().to("cpu")
        if t.dtype != dtype_:
            t = t.to(dtype_)
        shape = list(t.shape)
        if dtype_ in (torch.bfloat16,) or dtype_ not in _NUMPY_DTYPES:
            # numpy has no bf16/f8: hand MLIR the raw little-endian bytes.
            raw = t.contiguous().view(torch.uint8 if t.element_size() == 1 else torch.int16 if t.element_size() == 2 else torch.int32 if t.element_size() == 4 else torch.int64).numpy()
            attr = ir.DenseElementsAttr.get(np.ascontiguousarray(raw).view(np.uint8), type=element_type(dtype_), shape=shape)
            return stablehlo.ConstantOp(attr).result
        array = t.contiguous().numpy()
    np_dtype = _NUMPY_DTYPES.get(dtype_)
    # (np.ascontiguousarray would turn a 0-d array into a 1-d one.)
    array = np.asarray(array, dtype=np_dtype).copy(order="C")
    shape = list(array.shape)
    if dtype_ is torch.bool:
        # This jaxlib takes i1 elements one per byte (packed bits decode wrongly).
        attr = ir.DenseElementsAttr.get(
            np.ascontiguousarray(array, dtype=np.bool_), type=ir.IntegerType.get_signless(1), shape=shape
        )
    else:
        attr = ir.DenseElementsAttr.get(array, type=element_type(dtype_), shape=shape)
    return stablehlo.ConstantOp(attr).result


def full(value: Scalar, dtype_: torch.dtype, shape: Sequence[int]) -> ir.Value:
    """`value` broadcast to `shape` (a splat constant)."""
    try:
        return constant(value, dtype_, shape)
    except _ComplexSplat:
        c = complex(value)
        scalar = array_constant(np.array(c, dtype=_NUMPY_DTYPES[dtype_]), dtype_)
        return broadcast_to(scalar, shape)


# -- conversions and broadcasting ----------------------------------------------------------
def convert(value: ir.Value, to: torch.dtype) -> ir.Value:
    """Element type conversion with PyTorch's semantics: to bool is `!= 0`; complex to
    real keeps the real part."""
    src = dtype(value)
    if src == to:
        return value
    shape = shape_of(value)
    if to is torch.bool:
        return compare(value, full(0, src, shape), "NE")
    if src.is_complex and not to.is_complex:
        value = stablehlo.RealOp(value).result
        src = dtype(value)
        if src == to:
            return value
    return stablehlo.ConvertOp(tensor_type(shape, to), value).result


def broadcast_shapes(*shapes: Sequence[int]) -> list[int]:
    return list(torch.broadcast_shapes(*[tuple(s) for s in shapes]))


def broadcast_to(value: ir.Value, shape: Sequence[int]) -> ir.Value:
    """NumPy-style broadcast of `value` to `shape`."""
    src = shape_of(value)
    shape = list(shape)
    if src == shape:
        return value
    offset = len(shape) - len(src)
    if offset < 0:
        raise ValueError(f"cannot broadcast shape {src} to {shape}")
    dims = list(range(offset, len(shape)))
    # Size-1 dims that broadcast need to be squeezed out first? No: broadcast_in_dim
    # allows operand dim 1 -> any size.
    result = tensor_type(shape, dtype(value))
    return stablehlo.BroadcastInDimOp(result, value, dims).result


def coerce(x: ValueOrScalar, to: torch.dtype, shape: Sequence[int] | None = None) -> ir.Value:
    """A Python scalar or a value as a tensor of dtype `to`, broadcast to `shape` when
    given."""
    if is_value(x):
        v = convert(x, to)
        return broadcast_to(v, shape) if shape is not None else v
    return full(x, to, list(shape) if shape is not None else [])


# -- PyTorch type promotion -----------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def _probe(dtype_: torch.dtype, zero_dim: bool) -> torch.Tensor:
    return torch.empty((), dtype=dtype_) if zero_dim else torch.empty((1,), dtype=dtype_)


def promote_dtypes(*args: ValueOrScalar) -> torch.dtype:
    """The dtype eager PyTorch gives an elementwise op over `args`: values (rank 0 counts
    as a zero-dim tensor, which promotes like a scalar) and Python scalars."""
    from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND, elementwise_dtypes

    operands = [_probe(dtype(a), rank_of(a) == 0) if is_value(a) else a for a in args if a is not None]
    _, result = elementwise_dtypes(
        *operands, type_promotion_kind=ELEMENTWISE_TYPE_PROMOTION_KIND.DEFAULT
    )
    return result


def promote(*args: ValueOrScalar, to: torch.dtype | None = None) -> list[ir.Value]:
    """Converts all arguments to their promoted dtype (or `to`) and broadcasts them to
    their common shape."""
    target = to if to is not None else promote_dtypes(*args)
    shapes = [shape_of(a) for a in args if is_value(a)]
    shape = broadcast_shapes(*shapes) if shapes else []
    return [coerce(a, target, shape) for a in args]


# -- small op builders ------------------------------------------------------------------------
def compare(lhs: ir.Value, rhs: ir.Value, direction: str) -> ir.Value:
    """stablehlo.compare with the compare type PyTorch's dtype implies (compiler.ir)."""
    return hlo.compare(lhs, rhs, direction)


def is_nan(x: ir.Value) -> ir.Value:
    """Elementwise x != x: true exactly at NaNs."""
    return compare(x, x, "NE")


def iota(shape: Sequence[int], dim: int, dtype_: torch.dtype) -> ir.Value:
    """Each element's index along `dim`, as `dtype_`."""
    return hlo.iota(shape, dim, element_type(dtype_))


def bitcast(value: ir.Value, to: torch.dtype, shape: Sequence[int] | None = None) -> ir.Value:
    """The same bits read as `to` (`shape` defaults to the operand's: equal widths)."""
    return hlo.bitcast(value, element_type(to), shape)


def reshape(value: ir.Value, shape: Sequence[int]) -> ir.Value:
    shape = [int(s) for s in shape]
    if shape_of(value) == shape:
        return value
    if [d for d in shape_of(value) if d != 1] != [d for d in shape if d != 1]:
        value = static_layout(value)  # bounded dynamism: reshape the padded buffer as is
    return hlo.reshape(value, shape)


def transpose(value: ir.Value, permutation: Sequence[int]) -> ir.Value:
    return hlo.transpose(value, permutation)


def select(pred: ir.Value, on_true: ir.Value, on_false: ir.Value) -> ir.Value:
    shape = broadcast_shapes(shape_of(pred), shape_of(on_true), shape_of(on_false))
    return stablehlo.SelectOp(
        broadcast_to(pred, shape), broadcast_to(on_true, shape), broadcast_to(on_false, shape)
    ).result


def normalize_dim(dim: int, rank: int) -> int:
    """PyTorch's negative-dim wrapping (rank 0 accepts dims 0 and -1)."""
    r = max(rank, 1)
    if not -r <= dim < r:
        raise IndexError(f"dimension {dim} out of range for a tensor of rank {rank}")
    return dim % r


def normalize_dims(dims, rank: int) -> list[int]:
    if dims is None:
        return list(range(rank))
    if isinstance(dims, int):
        dims = [dims]
    return sorted({normalize_dim(d, rank) for d in dims})


def reduce(
    values: Sequence[ir.Value],
    inits: Sequence[ir.Value],
    dims: Sequence[int],
    body,
) -> list[ir.Value]:
    """stablehlo.reduce over `dims`. `body(acc_args, new_args) -> list[ir.Value]` builds
    the reduction region from 0-d block arguments."""
    dims = [int(d) for d in dims]
    result_types = []
    for v in values:
        shape = [s for i, s in enumerate(shape_of(v)) if i not in dims]
        result_types.append(tensor_type(shape, dtype(v)))
    op = stablehlo.ReduceOp(result_types, list(values), list(inits), dims)
    scalar_types = [tensor_type([], dtype(v)) for v in values]
    block = op.body.blocks.append(*(scalar_types + scalar_types))
    with ir.InsertionPoint(block):
        n = len(values)
        outs = body(list(block.arguments)[:n], list(block.arguments)[n:])
        stablehlo.ReturnOp(list(outs))
    return list(op.results)


def scalar_region(region: ir.Region, dtypes: Sequence[torch.dtype], body) -> None:
    """Fills `region` (of reduce_window, scatter, sort, ...) with one block of 0-d
    arguments of `dtypes` whose terminator returns `body(args)`."""
    block = region.blocks.append(*[tensor_type([], d) for d in dtypes])
    with ir.InsertionPoint(block):
        stablehlo.ReturnOp(list(body(list(block.arguments))))


def min_value(dtype_: torch.dtype):
    if dtype_ is torch.bool:
        return False
    if dtype_.is_floating_point:
        return float("-inf")
    return torch.iinfo(dtype_).min


def max_value(dtype_: torch.dtype):
    if dtype_ is torch.bool:
        return True
    if dtype_.is_floating_point:
        return float("inf")
    return torch.iinfo(dtype_).max


# -- values shaped like others ------------------------------------------------------------------
def constant_like(value: Scalar, x: ir.Value) -> ir.Value:
    """A splat constant of `value` with the dtype and shape of `x` (formulas combine it
    with `x` through compiler.ir's builders, which want operands of one type)."""
    return full(value, dtype(x), shape_of(x))


def conj(x: ir.Value) -> ir.Value:
    """The complex conjugate of `x`; `x` itself when it is real."""
    if not dtype(x).is_complex:
        return x
    return stablehlo.ComplexOp(stablehlo.RealOp(x).result, stablehlo.NegOp(stablehlo.ImagOp(x).result).result).result
