"""Builders of StableHLO collectives, shared by `torchtpu-lower-collectives` and
`torchtpu-insert-collectives`.

They build at the ambient insertion point and location. A request StableHLO cannot
express (a bitwise reduction of floats, an uneven all-gather) raises `CollectiveError`,
which the passes turn into a located diagnostic.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from ..context import ir, stablehlo


class CollectiveError(ValueError):
    """A collective StableHLO cannot express; the message says why and what to do."""


@dataclass
class ChannelAllocator:
    """Hands out channel handles, unique in the module (after any already present)."""

    next_handle: int = 1
    used: set[int] = field(default_factory=set)

    @classmethod
    def for_module(cls, module: ir.Operation) -> ChannelAllocator:
        highest = 0

        def visit(op: ir.Operation) -> ir.WalkResult:
            nonlocal highest
            attr = op.operation.attributes.get("channel_handle") if "channel_handle" in op.operation.attributes else None
            if attr is not None:
                text = str(attr)
                digits = text.split("handle =", 1)[1].split(",", 1)[0] if "handle =" in text else "0"
                highest = max(highest, int(digits.strip() or 0))
            return ir.WalkResult.ADVANCE

        module.walk(visit)
        return cls(highest + 1)

    def take(self) -> ir.Attribute:
        handle = self.next_handle
        self.next_handle += 1
        # type 1 = DEVICE_TO_DEVICE
        return ir.Attribute.parse(f"#stablehlo.channel_handle<handle = {handle}, type = 1>")


def element_kind(element: ir.Type) -> str:
    """'bool', 'int', 'float' or 'complex'."""
    if isinstance(element, ir.IntegerType):
        return "bool" if element.width == 1 else "int"
    if isinstance(element, ir.ComplexType):
        return "complex"
    return "float"


# reduce op -> StableHLO op by element kind (None: no such reduction on that kind).
_COMBINERS = {
    "sum": {"bool": "or", "int": "add", "float": "add", "complex": "add"},
    "avg": {"int": "add", "float": "add", "complex": "add"},
    "product": {"bool": "and", "int": "multiply", "float": "multiply", "complex": "multiply"},
    "min": {"bool": "and", "int": "minimum", "float": "minimum"},
    "max": {"bool": "or", "int": "maximum", "float": "maximum"},
    "band": {"bool": "and", "int": "and"},
    "bor": {"bool": "or", "int": "or"},
    "bxor": {"bool": "xor", "int": "xor"},
}
_BINARY = {
    "add": stablehlo.AddOp, "multiply": stablehlo.MulOp, "minimum": stablehlo.MinOp,
    "maximum": stablehlo.MaxOp, "and": stablehlo.AndOp, "or": stablehlo.OrOp, "xor": stablehlo.XorOp,
}


def combiner(reduce_op: str, element: ir.Type) -> str:
    """The StableHLO op that combines two values for PyTorch's `reduce_op`."""
    if reduce_op == "premul_sum":
        raise CollectiveError(
            "reduce op 'premul_sum' is not supported; multiply by the factor before a 'sum' collective"
        )
    table = _COMBINERS.get(reduce_op)
    if table is None:
        raise CollectiveError(f"unknown reduce op '{reduce_op}'; supported: {', '.join(_COMBINERS)}")
    kind = element_kind(element)
    name = table.get(kind)
    if name is None:
        raise CollectiveError(
            f"reduce op '{reduce_op}' is not defined for {kind} elements ({element}); "
            f"it applies to {', '.join(sorted(table))} tensors"
        )
    return name


def _i64_matrix(rows: Sequence[Sequence[int]]) -> ir.Attribute:
    return ir.DenseElementsAttr.get(np.array([list(r) for r in rows], dtype=np.int64).reshape(len(rows), -1))


def _group_attrs(groups: Sequence[Sequence[int]], channels: ChannelAllocator, global_ids: bool,
                 has_global_flag: bool = True) -> dict:
    """replica_groups, plus what selects XLA's collective mode: without a channel the
    groups are replica ids (cross-replica: replicated execution); with a channel and
    `use_global_device_ids` they are global device ids (SPMD partitions). all_to_all and
    collective_permute have no flag: a channel alone makes their ids partition ids."""
    attrs = {"replica_groups": _i64_matrix(groups)}
    if global_ids:
        attrs["channel_handle"] = channels.take()
        if has_global_flag:
            attrs["use_global_device_ids"] = ir.UnitAttr.get()
    return attrs


def _add_reduction_body(op: ir.Operation, name: str, element: ir.Type) -> None:
    scalar = ir.RankedTensorType.get([], element)
    block = op.regions[0].blocks.append(scalar, scalar)
    with ir.InsertionPoint(block):
        combined = _BINARY[name](block.arguments[0], block.arguments[1]).result
        stablehlo.ReturnOp([combined])


def _uneven(groups: Sequence[Sequence[int]]) -> bool:
    return len({len([r for r in g if r != -1]) for g in groups}) > 1


def rank_id(global_ids: bool) -> ir.Value:
    """This device's rank as a 0-d i32: the replica id (replicated execution) or the
    partition id (SPMD partitions, when device ids are global)."""
    op = stablehlo.PartitionIdOp() if global_ids else stablehlo.ReplicaIdOp()
    return stablehlo.ConvertOp(ir.RankedTensorType.get([], ir.IntegerType.get_signless(32)), op.result).result


def lookup_by_rank(table: Sequence[int], global_ids: bool) -> ir.Value:
    """`table[rank]` as a 0-d i32, for this device's rank (see `rank_id`)."""
    constant = stablehlo.ConstantOp(ir.DenseElementsAttr.get(np.array(list(table), dtype=np.int32))).result
    one = stablehlo.DynamicSliceOp(constant, [rank_id(global_ids)], ir.DenseI64ArrayAttr.get([1])).result
    return stablehlo.ReshapeOp(ir.RankedTensorType.get([], ir.IntegerType.get_signless(32)), one).result


def _divide_by_group_size(value: ir.Value, groups: Sequence[Sequence[int]], global_ids: bool) -> ir.Value:
    """`value / len(group of this rank)`; for uneven groups the size is looked up by rank."""
    t = ir.RankedTensorType(value.type)
    sizes = {r: len([m for m in g if m != -1]) for g in groups for r in g if r != -1}
    if len(set(sizes.values())) == 1:
        divisor = _splat(next(iter(sizes.values())), t)
    else:
        scalar = lookup_by_rank([sizes.get(r, 1) for r in range(max(sizes) + 1)], global_ids)
        scalar = stablehlo.ConvertOp(ir.RankedTensorType.get([], t.element_type), scalar).result
        divisor = stablehlo.BroadcastInDimOp(t, scalar, ir.DenseI64ArrayAttr.get([])).result
    return stablehlo.DivOp(value, divisor).result


def _splat(number: int, t: ir.RankedTensorType) -> ir.Value:
    element = t.element_type
    kind = element_kind(element)
    if kind == "complex":
        real = ir.ComplexType(element).element_type
        scalar = _splat(number, ir.RankedTensorType.get([], real))
        zero = _splat(0, ir.RankedTensorType.get([], real))
        value = stablehlo.ComplexOp(ir.RankedTensorType.get([], element), scalar, zero).result
        return stablehlo.BroadcastInDimOp(t, value, ir.DenseI64ArrayAttr.get([])).result
    attr = ir.IntegerAttr.get(element, number) if kind == "int" else ir.FloatAttr.get(element, float(number))
    return stablehlo.ConstantOp(ir.DenseElementsAttr.get_splat(t, attr)).result


def _u8_type(t: ir.RankedTensorType, extra: Sequence[int] = ()) -> ir.RankedTensorType:
    return ir.RankedTensorType.get([*t.shape, *extra], ir.IntegerType.get_unsigned(8))


# A bitwise reduction of bits is a min (and), max (or) or sum mod 2 (xor) of 0/1 bytes,
# which every backend's all-reduce has (XLA:CPU has no and/or/xor all-reduce).
_BIT_REDUCTION = {"and": "minimum", "or": "maximum", "xor": "add"}


def _reduce_bits_as_bytes(value: ir.Value, name: str, groups, channels, global_ids: bool,
                          scatter_dim: int | None = None) -> ir.Value:
    """and/or/xor all-reduce (or reduce-scatter along `scatter_dim`) of a bool or integer
    tensor through 0/1 bytes (bit planes for integers: one byte per bit)."""
    t = ir.RankedTensorType(value.type)
    if scatter_dim is not None:
        shape = list(t.shape)
        shape[scatter_dim] //= len([r for r in groups[0] if r != -1])
        out_t = ir.RankedTensorType.get(shape, t.element_type)
    else:
        out_t = t
    element = t.element_type
    width = element.width
    if width == 1:
        planes = stablehlo.ConvertOp(_u8_type(t), value).result
    else:
        unsigned = ir.IntegerType.get_unsigned(width)
        bits = stablehlo.BitcastConvertOp(ir.RankedTensorType.get(t.shape, unsigned), value).result
        wide_t = ir.RankedTensorType.get([*t.shape, width], unsigned)
        wide = stablehlo.BroadcastInDimOp(wide_t, bits, ir.DenseI64ArrayAttr.get(list(range(t.rank)))).result
        shifts = stablehlo.IotaOp(wide_t, ir.IntegerAttr.get(ir.IntegerType.get_signless(64), t.rank)).result
        one = stablehlo.ConstantOp(ir.DenseElementsAttr.get_splat(wide_t, ir.IntegerAttr.get(unsigned, 1))).result
        masked = stablehlo.AndOp(stablehlo.ShiftRightLogicalOp(wide, shifts).result, one).result
        planes = stablehlo.ConvertOp(_u8_type(t, [width]), masked).result
    plane_t = _u8_type(out_t, [] if width == 1 else [width])
    attrs = _group_attrs(groups, channels, global_ids)
    if scatter_dim is not None:
        attrs["scatter_dimension"] = ir.IntegerAttr.get(ir.IntegerType.get_signless(64), scatter_dim)
    op = ir.Operation.create(
        "stablehlo.reduce_scatter" if scatter_dim is not None else "stablehlo.all_reduce",
        results=[plane_t], operands=[planes], attributes=attrs, regions=1,
    )
    _add_reduction_body(op, _BIT_REDUCTION[name], plane_t.element_type)
    reduced = op.result
    t = out_t
    if name == "xor":
        one_u8 = stablehlo.ConstantOp(ir.DenseElementsAttr.get_splat(plane_t, ir.IntegerAttr.get(plane_t.element_type, 1))).result
        reduced = stablehlo.AndOp(reduced, one_u8).result
    if width == 1:
        return stablehlo.ConvertOp(t, reduced).result
    unsigned = ir.IntegerType.get_unsigned(width)
    wide_t = ir.RankedTensorType.get([*t.shape, width], unsigned)
    shifts = stablehlo.IotaOp(wide_t, ir.IntegerAttr.get(ir.IntegerType.get_signless(64), t.rank)).result
    placed = stablehlo.ShiftLeftOp(stablehlo.ConvertOp(wide_t, reduced).result, shifts).result
    zero = stablehlo.ConstantOp(ir.DenseElementsAttr.get_splat(ir.RankedTensorType.get([], unsigned), ir.IntegerAttr.get(unsigned, 0))).result
    summed = stablehlo.ReduceOp([ir.RankedTensorType.get(t.shape, unsigned)], [placed], [zero], ir.DenseI64ArrayAttr.get([t.rank]))
    scalar = ir.RankedTensorType.get([], unsigned)
    block = summed.regions[0].blocks.append(scalar, scalar)
    with ir.InsertionPoint(block):
        stablehlo.ReturnOp([stablehlo.OrOp(block.arguments[0], block.arguments[1]).result])
    return stablehlo.BitcastConvertOp(t, summed.results[0]).result


def _bits_as_bytes(name: str, element: ir.Type, bitwise: str) -> bool:
    """Whether an and/or/xor reduction goes through 0/1 bytes (see `_reduce_bits_as_bytes`)."""
    return name in _BIT_REDUCTION and (bitwise == "bytes" or element_kind(element) == "bool")


def _reduced(op: ir.Operation, name: str, reduce_op: str, groups, global_ids: bool) -> ir.Value:
    """The result of an all-reduce / reduce-scatter `op` once its reduction body combines
    with `name`; an average is divided by the group's size."""
    _add_reduction_body(op, name, ir.RankedTensorType(op.results[0].type).element_type)
    result = op.results[0]
    if reduce_op == "avg":
        result = _divide_by_group_size(result, groups, global_ids)
    return result


def all_reduce(value: ir.Value, reduce_op: str, groups, channels: ChannelAllocator, global_ids: bool = False,
               bitwise: str = "native") -> ir.Value:
    t = ir.RankedTensorType(value.type)
    name = combiner(reduce_op, t.element_type)
    if _bits_as_bytes(name, t.element_type, bitwise):
        return _reduce_bits_as_bytes(value, name, groups, channels, global_ids)
    op = ir.Operation.create(
        "stablehlo.all_reduce", results=[t], operands=[value], attributes=_group_attrs(groups, channels, global_ids), regions=1
    )
    return _reduced(op, name, reduce_op, groups, global_ids)


def _even(groups, what: str) -> int:
    if _uneven(groups):
        raise CollectiveError(
            f"{what} over groups of different sizes ({[[r for r in g if r != -1] for g in groups]}) gives "
            "each rank a different shape, which one program cannot have; use groups of equal size"
        )
    return len(groups[0])


def all_gather(value: ir.Value, dim: int, groups, channels: ChannelAllocator, global_ids: bool = False) -> ir.Value:
    size = _even(groups, "all_gather")
    t = ir.RankedTensorType(value.type)
    shape = list(t.shape)
    shape[dim] *= size
    attrs = _group_attrs(groups, channels, global_ids)
    attrs["all_gather_dim"] = ir.IntegerAttr.get(ir.IntegerType.get_signless(64), dim)
    op = ir.Operation.create(
        "stablehlo.all_gather", results=[ir.RankedTensorType.get(shape, t.element_type)], operands=[value], attributes=attrs
    )
    return op.result


def reduce_scatter(
    value: ir.Value, reduce_op: str, dim: int, groups, channels: ChannelAllocator, global_ids: bool = False,
    bitwise: str = "native",
) -> ir.Value:
    size = _even(groups, "reduce_scatter")
    t = ir.RankedTensorType(value.type)
    name = combiner(reduce_op, t.element_type)
    shape = list(t.shape)
    if shape[dim] % size == 0 and _bits_as_bytes(name, t.element_type, bitwise):
        return _reduce_bits_as_bytes(value, name, groups, channels, global_ids, scatter_dim=dim)
    if shape[dim] % size:
        raise CollectiveError(f"reduce_scatter: dimension {dim} of size {shape[dim]} does not divide by {size} ranks")
    shape[dim] //= size
    attrs = _group_attrs(groups, channels, global_ids)
    attrs["scatter_dimension"] = ir.IntegerAttr.get(ir.IntegerType.get_signless(64), dim)
    op = ir.Operation.create(
        "stablehlo.reduce_scatter",
        results=[ir.RankedTensorType.get(shape, t.element_type)],
        operands=[value],
        attributes=attrs,
        regions=1,
    )
    return _reduced(op, name, reduce_op, groups, global_ids)


def all_to_all(value: ir.Value, dim: int, groups, channels: ChannelAllocator, global_ids: bool = False) -> ir.Value:
    size = _even(groups, "all_to_all")
    t = ir.RankedTensorType(value.type)
    i64 = ir.IntegerType.get_signless(64)
    attrs = {
        **_group_attrs(groups, channels, global_ids, has_global_flag=False),
        "split_dimension": ir.IntegerAttr.get(i64, dim),
        "concat_dimension": ir.IntegerAttr.get(i64, dim),
        "split_count": ir.IntegerAttr.get(i64, size),
    }
    return ir.Operation.create("stablehlo.all_to_all", results=[t], operands=[value], attributes=attrs).result


def collective_permute(value: ir.Value, pairs, channels: ChannelAllocator, global_ids: bool = False) -> ir.Value:
    attrs = {"source_target_pairs": _i64_matrix(pairs)}
    if global_ids:
        attrs["channel_handle"] = channels.take()
    return ir.Operation.create("stablehlo.collective_permute", results=[value.type], operands=[value], attributes=attrs).result


def broadcast(value: ir.Value, src: int, groups, channels: ChannelAllocator, via: str = "collective_broadcast",
              global_ids: bool = False) -> ir.Value:
    """Every member of each group receives the value of the group's member at index `src`.

    via="collective_broadcast": StableHLO's op (the source is each group's first member,
    so `src` is rotated to the front). via="all_gather": gather and keep the source's
    slice -- exact bits, for backends without collective-broadcast (XLA:CPU)."""
    if via == "all_gather":
        t = ir.RankedTensorType(value.type)
        _even(groups, "broadcast through all_gather")
        lifted = stablehlo.ReshapeOp(ir.RankedTensorType.get([1, *t.shape], t.element_type), value).result
        gathered = all_gather(lifted, 0, groups, channels, global_ids)
        zeros = [0] * t.rank
        picked = stablehlo.SliceOp(
            gathered,
            ir.DenseI64ArrayAttr.get([src, *zeros]),
            ir.DenseI64ArrayAttr.get([src + 1, *t.shape]),
            ir.DenseI64ArrayAttr.get([1] * (t.rank + 1)),
        ).result
        return stablehlo.ReshapeOp(t, picked).result
    reordered = []
    for g in groups:
        members = [r for r in g if r != -1]
        if src >= len(members):
            raise CollectiveError(f"broadcast source index {src} is outside the group {members}")
        members = [members[src]] + members[:src] + members[src + 1 :]
        reordered.append(members + [-1] * (len(g) - len(members)))
    attrs = _group_attrs(reordered, channels, global_ids, has_global_flag=False)
    return ir.Operation.create("stablehlo.collective_broadcast", results=[value.type], operands=[value], attributes=attrs).result
