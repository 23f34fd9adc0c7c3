"""View ops on references, and `alloc` (docs/explanation/views.md).

A view op takes a reference (`!torchtpu.ref<tensor<...>>`) and yields a reference to
(part of) the same storage; a `torchtpu.store` through the result is visible in the
source and in every other view of the same root. The value seen through a view is a
pure function of the source's value (its *forward*); the passes
`torchtpu-decompose-views` and `torchtpu-inverse-views` give every view its inverse.

Every op's result type is the view's type; the verifiers check that it is the one
PyTorch would compute from the source type and the attributes (and, for the
storage-addressing ops, that every addressed element lies inside the source).
"""

from __future__ import annotations

from math import prod

from ..context import ir
from .spec import (
    I64,
    TORCHTPU,
    AnyRankedTensor,
    Attr,
    DenseIndexArray,
    I64Array,
    Operand,
    OpSpec,
    Ref,
    Result,
    VerifyError,
    ref_tensor_type,
)


# -- shared checks ----------------------------------------------------------------------
def view_types(op: ir.Operation) -> tuple[ir.RankedTensorType, ir.RankedTensorType]:
    """(source tensor type, result tensor type) of a view op on references."""
    return ref_tensor_type(op.operands[0].type), ref_tensor_type(op.results[0].type)


def _shape(t: ir.RankedTensorType) -> list[int]:
    return list(t.shape)


def _expect_shape(result: ir.RankedTensorType, expected: list[int]) -> None:
    if _shape(result) != list(expected):
        raise VerifyError(f"result shape {_shape(result)} does not match the expected view shape {list(expected)}")


def _same_element(source: ir.RankedTensorType, result: ir.RankedTensorType) -> None:
    if source.element_type != result.element_type:
        raise VerifyError(
            f"result element type {result.element_type} differs from the source's {source.element_type}; "
            "only torchtpu.view_dtype changes the element type"
        )


def _dim(value: int, rank: int, what: str = "dim") -> int:
    if not 0 <= value < rank:
        raise VerifyError(f"{what} {value} is out of range for a rank-{rank} source (expected 0..{rank - 1})")
    return value


def _shape_only(check):
    """Wraps a shape check that needs the source/result tensor types."""

    def verify(op: ir.Operation, attrs: dict) -> None:
        source, result = view_types(op)
        _static(source, result)
        check(source, result, attrs)

    verify.__doc__ = check.__doc__
    return verify


def _static(source, result) -> None:
    if not (source.has_static_shape and result.has_static_shape):
        raise VerifyError("view ops need static shapes (bounded dynamic views are not supported yet)")


def slice_length(start: int, limit: int, step: int) -> int:
    return max(0, (limit - start + step - 1) // step)


# -- verifiers ------------------------------------------------------------------------------
def _verify_slice(source, result, attrs) -> None:
    """0 <= start <= limit <= size along `dim`, step >= 1; the result has
    ceil((limit - start) / step) elements along `dim`"""
    _same_element(source, result)
    shape = _shape(source)
    dim = _dim(attrs["dim"], len(shape))
    start, limit, step = attrs["start"], attrs["limit"], attrs["step"]
    if step < 1:
        raise VerifyError(f"step must be >= 1, got {step}")
    if not 0 <= start <= limit <= shape[dim]:
        raise VerifyError(f"slice [{start}:{limit}] is outside dim {dim} of size {shape[dim]}")
    expected = list(shape)
    expected[dim] = slice_length(start, limit, step)
    _expect_shape(result, expected)


def _verify_select(source, result, attrs) -> None:
    """`index` lies inside `dim`; the result drops `dim`"""
    _same_element(source, result)
    shape = _shape(source)
    dim = _dim(attrs["dim"], len(shape))
    if not 0 <= attrs["index"] < shape[dim]:
        raise VerifyError(f"index {attrs['index']} is outside dim {dim} of size {shape[dim]}")
    _expect_shape(result, shape[:dim] + shape[dim + 1 :])


def _verify_permute(source, result, attrs) -> None:
    """`permutation` is a permutation of the source's dims; result dim i is source dim
    permutation[i]"""
    _same_element(source, result)
    shape, perm = _shape(source), attrs["permutation"]
    if sorted(perm) != list(range(len(shape))):
        raise VerifyError(f"permutation {perm} is not a permutation of 0..{len(shape) - 1}")
    _expect_shape(result, [shape[p] for p in perm])


def _verify_reshape(source, result, attrs) -> None:
    """same number of elements and element type"""
    _same_element(source, result)
    if prod(_shape(source)) != prod(_shape(result)):
        raise VerifyError(f"cannot view {_shape(source)} ({prod(_shape(source))} elements) as "
                          f"{_shape(result)} ({prod(_shape(result))} elements)")


def _verify_expand(source, result, attrs) -> None:
    """result rank >= source rank; aligned from the right, each source dim equals the
    result dim or is 1 (broadcast, stride 0)"""
    _same_element(source, result)
    src, dst = _shape(source), _shape(result)
    if len(dst) < len(src):
        raise VerifyError(f"cannot expand rank {len(src)} to the smaller rank {len(dst)}")
    for i, size in enumerate(src):
        target = dst[len(dst) - len(src) + i]
        if size != target and size != 1:
            raise VerifyError(f"source dim {i} of size {size} cannot be expanded to {target} (only size-1 dims expand)")


def _verify_squeeze(source, result, attrs) -> None:
    """each dim in `dims` has size 1 and is removed"""
    _same_element(source, result)
    shape, dims = _shape(source), attrs["dims"]
    for d in dims:
        _dim(d, len(shape))
        if shape[d] != 1:
            raise VerifyError(f"cannot squeeze dim {d} of size {shape[d]}")
    if len(set(dims)) != len(dims):
        raise VerifyError(f"dims {dims} repeat a dim")
    _expect_shape(result, [s for i, s in enumerate(shape) if i not in dims])


def _verify_unsqueeze(source, result, attrs) -> None:
    """a size-1 dim is inserted at `dim` (0 <= dim <= rank)"""
    _same_element(source, result)
    shape, dim = _shape(source), attrs["dim"]
    if not 0 <= dim <= len(shape):
        raise VerifyError(f"dim {dim} is out of range for unsqueeze of a rank-{len(shape)} source")
    _expect_shape(result, shape[:dim] + [1] + shape[dim:])


def diagonal_length(rows: int, cols: int, offset: int) -> int:
    if offset >= 0:
        return max(0, min(rows, cols - offset))
    return max(0, min(rows + offset, cols))


def _verify_diagonal(source, result, attrs) -> None:
    """dim1 != dim2; both dims are removed and the diagonal (of the given offset) is
    appended as the last dim"""
    _same_element(source, result)
    shape = _shape(source)
    d1, d2 = _dim(attrs["dim1"], len(shape), "dim1"), _dim(attrs["dim2"], len(shape), "dim2")
    if d1 == d2:
        raise VerifyError(f"dim1 and dim2 are both {d1}")
    rest = [s for i, s in enumerate(shape) if i not in (d1, d2)]
    _expect_shape(result, rest + [diagonal_length(shape[d1], shape[d2], attrs["offset"])])


def _verify_unfold(source, result, attrs) -> None:
    """size <= dim size, step >= 1; `dim` becomes (size - window) // step + 1 windows and a
    trailing dim of `size` elements is appended"""
    _same_element(source, result)
    shape = _shape(source)
    dim = _dim(attrs["dimension"], max(len(shape), 1), "dimension")
    length = shape[dim] if shape else 1
    size, step = attrs["size"], attrs["step"]
    if step < 1 or size < 0 or size > length:
        raise VerifyError(f"window size {size} / step {step} do not fit dim {dim} of size {length}")
    expected = list(shape) if shape else []
    if shape:
        expected[dim] = (length - size) // step + 1
    _expect_shape(result, expected + [size])


def _verify_as_strided(source, result, attrs) -> None:
    """one stride per result dim, all >= 0; every addressed element (storage_offset +
    sum(i_k * stride_k)) lies inside the source, whose elements in row-major order are the
    storage"""
    _same_element(source, result)
    strides, offset = attrs["strides"], attrs["storage_offset"]
    shape = _shape(result)
    if len(strides) != len(shape):
        raise VerifyError(f"{len(strides)} strides for a rank-{len(shape)} result")
    if offset < 0 or any(s < 0 for s in strides):
        raise VerifyError(f"storage_offset {offset} and strides {strides} must be >= 0")
    if prod(shape) == 0:
        return
    last = offset + sum((n - 1) * s for n, s in zip(shape, strides))
    size = prod(_shape(source))
    if last >= size:
        raise VerifyError(f"addresses storage element {last}, but the source has only {size} elements")


def _verify_alias(source, result, attrs) -> None:
    """the result type equals the source type"""
    if source != result:
        raise VerifyError(f"result type {result} differs from the source type {source}")


def _storage_bits(t) -> int:
    """Bits one element occupies in PyTorch storage (bool is a byte; complex is two of
    its parts). Read from the MLIR type, so the dialect needs no torch."""
    element = ir.ShapedType(t).element_type
    if isinstance(element, ir.ComplexType):
        return 2 * element.element_type.width
    width = getattr(element, "width", None)
    if not isinstance(width, int):
        raise ValueError(f"element type {element} has no fixed width")
    return 8 if width == 1 else width


def _verify_view_dtype(source, result, attrs) -> None:
    """same element size: same shape; otherwise the last dim scales by the size ratio"""
    try:
        src_bits, dst_bits = _storage_bits(source), _storage_bits(result)
    except ValueError as err:
        raise VerifyError(f"cannot reinterpret {source.element_type} as {result.element_type}: {err}") from None
    src = _shape(source)
    if src_bits == dst_bits:
        _expect_shape(result, src)
        return
    if not src:
        raise VerifyError("a 0-d source can only be viewed as a dtype of the same size")
    if src_bits > dst_bits:
        expected = src[:-1] + [src[-1] * (src_bits // dst_bits)]
    else:
        ratio = dst_bits // src_bits
        if src[-1] % ratio:
            raise VerifyError(f"last dim {src[-1]} is not divisible by the element size ratio {ratio}")
        expected = src[:-1] + [src[-1] // ratio]
    _expect_shape(result, expected)


def _verify_gather_view(op: ir.Operation, attrs: dict) -> None:
    """`indices` has the result's shape and holds row-major positions inside the source"""
    source, result = view_types(op)
    _static(source, result)
    _same_element(source, result)
    indices = attrs["indices"]
    if list(indices.shape) != _shape(result):
        raise VerifyError(f"indices of shape {list(indices.shape)} for a result of shape {_shape(result)}")
    size = prod(_shape(source))
    if indices.size and (indices.min() < 0 or indices.max() >= size):
        raise VerifyError(f"indices must lie in [0, {size}); got [{indices.min()}, {indices.max()}]")


def _verify_alloc(op: ir.Operation, attrs: dict) -> None:
    """the result references a tensor of the initial value's type"""
    value_type, ref = op.operands[0].type, ref_tensor_type(op.results[0].type)
    if ref != value_type:
        raise VerifyError(f"result references {ref}, but the initial value has type {value_type}")


# -- the table ------------------------------------------------------------------------------
_VIEW = frozenset({"view", "pure"})
_SOURCE = (Operand("source", Ref),)
_RESULT = (Result("view", Ref),)


def _view(name: str, summary: str, description: str, attributes=(), verify=None, raw=False) -> None:
    TORCHTPU.op(
        OpSpec(
            name,
            summary=summary,
            description=description,
            operands=_SOURCE,
            results=_RESULT,
            attributes=tuple(attributes),
            traits=_VIEW,
            verify=verify if raw else _shape_only(verify),
        )
    )


_view("slice", "A strided range of one dim (aten.slice).",
      "Elements `start, start+step, ...` below `limit` along `dim`. Inverse: "
      "`dynamic_update_slice` (step 1) or a scatter.",
      (Attr("dim", I64), Attr("start", I64), Attr("limit", I64), Attr("step", I64)), _verify_slice)
_view("select", "One index of one dim, which is dropped (aten.select).",
      "Inverse: `dynamic_update_slice` of the value with `dim` re-inserted.",
      (Attr("dim", I64), Attr("index", I64)), _verify_select)
_view("permute", "A permutation of the dims (aten.permute, transpose, t).",
      "Result dim i is source dim `permutation[i]`. Inverse: the inverse permutation.",
      (Attr("permutation", I64Array),), _verify_permute)
_view("reshape", "The same elements in row-major order under a new shape (aten.view, "
      "_unsafe_view, reshape when it aliases).",
      "The result shape is the result type's. Inverse: reshape back.", (), _verify_reshape)
_view("expand", "Broadcast size-1 dims and add leading dims (aten.expand; stride 0).",
      "Reading broadcasts; writing is only defined when no element is repeated "
      "(PyTorch rejects such writes too).", (), _verify_expand)
_view("squeeze", "Removes size-1 dims (aten.squeeze).", "Inverse: reshape back.",
      (Attr("dims", I64Array),), _verify_squeeze)
_view("unsqueeze", "Inserts a size-1 dim (aten.unsqueeze).", "Inverse: reshape back.",
      (Attr("dim", I64),), _verify_unsqueeze)
_view("diagonal", "A diagonal of two dims, appended as the last dim (aten.diagonal).",
      "`torchtpu-decompose-views` rewrites it into permute + reshape + strided slice.",
      (Attr("offset", I64), Attr("dim1", I64), Attr("dim2", I64)), _verify_diagonal)
_view("unfold", "Sliding windows along one dim (aten.unfold).",
      "Windows that do not overlap decompose into slice + reshape + permute; "
      "overlapping ones into a gather_view, which cannot be written.",
      (Attr("dimension", I64), Attr("size", I64), Attr("step", I64)), _verify_unfold)
_view("as_strided", "An arbitrary strided view of the source's storage (aten.as_strided).",
      "The source's elements in row-major order are the storage (the importer passes the "
      "root reference). Decomposes into simple views when the strides allow, else a gather_view.",
      (Attr("strides", I64Array), Attr("storage_offset", I64)), _verify_as_strided)
_view("alias", "The whole source (aten.alias, detach of a reference).", "Inverse: identity.",
      (), _verify_alias)
_view("view_dtype", "Reinterprets the bytes as another element type (aten.view.dtype).",
      "A different element size scales the last dim. Inverse: the bitcast back.", (),
      _verify_view_dtype)
_view("gather_view", "Elements at static row-major positions of the source.",
      "Result element i is source element `indices[i]` (row-major). Produced by "
      "`torchtpu-decompose-views` for views without a simple form; loads become a gather, "
      "stores a scatter, which needs distinct indices.",
      (Attr("indices", DenseIndexArray),), _verify_gather_view, raw=True)

TORCHTPU.op(
    OpSpec(
        "alloc",
        summary="New storage holding an initial value.",
        description=(
            "`%r = torchtpu.alloc %value` is a fresh reference (a tensor created inside the "
            "graph and later written in place) whose initial contents are `%value`."
        ),
        operands=(Operand("init", AnyRankedTensor),),
        results=(Result("ref", Ref),),
        verify=_verify_alloc,
    )
)

VIEW_OPS = frozenset(
    f"torchtpu.{n}" for n in (
        "slice", "select", "permute", "reshape", "expand", "squeeze", "unsqueeze", "diagonal",
        "unfold", "as_strided", "alias", "view_dtype", "gather_view",
    )
)


def build_view(name: str, source: ir.Value, result: ir.RankedTensorType, **attrs) -> ir.Value:
    """Builds `torchtpu.<name>` on the reference `source` at the current insertion point
    and location. Integer attributes become i64, lists `array<i64>`; numpy arrays
    (gather_view indices) dense i64 elements."""
    import numpy as np

    from .spec import make_ref_type

    converted: dict[str, ir.Attribute] = {}
    for key, value in attrs.items():
        if isinstance(value, np.ndarray):
            converted[key] = ir.DenseIntElementsAttr.get(np.array(value, dtype=np.int64, order="C"))
        elif isinstance(value, (list, tuple)):
            converted[key] = ir.DenseI64ArrayAttr.get([int(v) for v in value])
        elif isinstance(value, int):
            converted[key] = ir.IntegerAttr.get(ir.IntegerType.get_signless(64), int(value))
        else:
            converted[key] = value
    op = ir.Operation.create(f"{DIALECT_PREFIX}{name}", results=[make_ref_type(result)], operands=[source],
                             attributes=converted)
    return op.result


DIALECT_PREFIX = "torchtpu."
