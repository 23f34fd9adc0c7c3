"""The state `torchtpu-insert-collectives` keeps while it partitions one function, and
how it moves a value from one sharding to another.

A `Partitioner` knows each value's `Layout` (values it has not seen are replicated)
and brings values to the sharding a rule asks for: partial results combined
(all-reduce / reduce-scatter), shardings dropped (all-gather) or taken (a local slice,
no communication), splat constants and broadcasts rebuilt at the local shape. The
per-op rules that decide those shardings are in `_partition_rules.py`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from ..context import ir, stablehlo
from . import _collective_builders as build
from .base import defining_op
from .sharding import Layout, Mesh, Shard


class Unsupported(Exception):
    """A pattern the pass cannot partition; reported at the op."""


def shape_of(value: ir.Value) -> list[int]:
    return list(ir.RankedTensorType(value.type).shape)


def with_shape(t: ir.Type, shape: Sequence[int]) -> ir.RankedTensorType:
    return ir.RankedTensorType.get(list(shape), ir.RankedTensorType(t).element_type)


def _is_splat_constant(op: ir.Operation) -> bool:
    if op.name != "stablehlo.constant":
        return False
    attr = op.attributes["value"]
    return isinstance(attr, ir.DenseElementsAttr) and attr.is_splat


class ValueMap:
    """Value -> Layout. Values are compared with == (their pointers), never hashed:
    the hash of jaxlib's IR objects is not stable while the IR is rewritten."""

    def __init__(self) -> None:
        self._items: list[tuple[ir.Value, Layout]] = []

    def get(self, value: ir.Value) -> Layout | None:
        for key, layout in reversed(self._items):
            if key == value:
                return layout
        return None

    def set(self, value: ir.Value, layout: Layout) -> None:
        for i, (key, _) in enumerate(self._items):
            if key == value:
                self._items[i] = (key, layout)
                return
        if not layout.is_replicated:
            self._items.append((value, layout))


class Partitioner:
    """Layouts of one function's values on `mesh`, and the resharding between them.
    Builds at the ambient insertion point and location."""

    def __init__(self, mesh: Mesh) -> None:
        self.mesh = mesh
        self.layouts = ValueMap()
        self.channels = build.ChannelAllocator()

    # -- bookkeeping ----------------------------------------------------------------------
    def layout(self, value: ir.Value) -> Layout:
        found = self.layouts.get(value)
        return found if found is not None else Layout.replicated(len(shape_of(value)))

    def set_layout(self, value: ir.Value, layout: Layout) -> None:
        self.layouts.set(value, layout)

    def global_shape(self, value: ir.Value) -> list[int]:
        """The single-device shape of a (possibly already local) value."""
        return self.layout(value).global_shape(shape_of(value), self.mesh)

    def local_shape(self, shape: Sequence[int], layout: Layout) -> list[int]:
        out = []
        for size, shard in zip(shape, layout.dims):
            if shard is None:
                out.append(size)
                continue
            k = self.mesh.axis_size(shard.axis)
            if size % (k * shard.major):
                raise Unsupported(f"dimension of size {size} is sharded on {shard} of size {k}, which does not divide it")
            out.append(size // k)
        return out

    def retype(self, op: ir.Operation, index: int, layout: Layout) -> None:
        """Result `index` of `op` (still at its single-device shape) takes `layout`."""
        result = op.results[index]
        result.set_type(with_shape(result.type, self.local_shape(shape_of(result), layout)))
        self.set_layout(result, layout)

    # -- collectives and local slices -------------------------------------------------------
    def reshard(self, value: ir.Value, target: Sequence[Shard | None]) -> ir.Value:
        """`value` brought to sharding `target` (partial results combined)."""
        current = self.layout(value)
        dims = list(current.dims)
        target = list(target)
        for axis, kind in current.partial:
            scatter = next((d for d, a in enumerate(target) if a is not None and a.axis == axis and a.major == 1
                            and dims[d] is None and shape_of(value)[d] % self.mesh.axis_size(axis) == 0), None)
            groups = self.mesh.groups(axis)
            if scatter is not None:
                value = build.reduce_scatter(value, kind, scatter, groups, self.channels)
                dims[scatter] = Shard(axis)
            else:
                value = build.all_reduce(value, kind, groups, self.channels)
        for d, shard in enumerate(dims):
            if shard is not None and target[d] != shard:
                value = self._all_gather(value, d, shard)
                dims[d] = None
        slices = {d: axis for d, axis in enumerate(target) if axis is not None and dims[d] is None}
        if slices:
            value = self._local_slice(value, slices)
            for d, axis in slices.items():
                dims[d] = axis
        self.set_layout(value, Layout(tuple(dims)))
        return value

    def reshard_keep_partial(self, value: ir.Value, target: Sequence[Shard | None]) -> ir.Value:
        """`value` brought to sharding `target` without combining its partial results."""
        layout = self.layout(value)
        self.set_layout(value, Layout(layout.dims))
        result = self.reshard(value, target)
        self.set_layout(value, layout)
        self.set_layout(result, Layout(tuple(target), layout.partial))
        return result

    def _axis_index(self, axis: str) -> ir.Value:
        return build.lookup_by_rank(self.mesh.axis_index_table(axis), False)

    def _split_major(self, value: ir.Value, d: int, major: int) -> ir.Value:
        shape = shape_of(value)
        return stablehlo.ReshapeOp(with_shape(value.type, shape[:d] + [major, shape[d] // major] + shape[d + 1:]), value).result

    def _merge_major(self, value: ir.Value, d: int) -> ir.Value:
        shape = shape_of(value)
        return stablehlo.ReshapeOp(with_shape(value.type, shape[:d] + [shape[d] * shape[d + 1]] + shape[d + 2:]), value).result

    def _all_gather(self, value: ir.Value, d: int, shard: Shard) -> ir.Value:
        groups = self.mesh.groups(shard.axis)
        if shard.major == 1:
            return build.all_gather(value, d, groups, self.channels)
        # `major` blocks, each split: gather inside the blocks.
        split = self._split_major(value, d, shard.major)
        return self._merge_major(build.all_gather(split, d + 1, groups, self.channels), d)

    def _local_slice(self, value: ir.Value, slices: dict[int, Shard]) -> ir.Value:
        """This rank's block of a value that every rank holds whole (no communication)."""
        for d, shard in slices.items():
            if shard.major > 1:
                split = self._split_major(value, d, shard.major)
                return self._merge_major(self._local_slice(split, {d + 1: Shard(shard.axis)} | {
                    (e if e < d else e + 1): s for e, s in slices.items() if e != d}), d)
        shape = shape_of(value)
        sizes = list(shape)
        starts = []
        for d, size in enumerate(shape):
            if d in slices:
                k = self.mesh.axis_size(slices[d].axis)
                if size % k:
                    raise Unsupported(f"dimension {d} of size {size} does not divide by axis {slices[d]} of size {k}")
                sizes[d] = size // k
                block_size = stablehlo.ConstantOp(ir.DenseElementsAttr.get(np.array(sizes[d], dtype=np.int32))).result
                starts.append(stablehlo.MulOp(self._axis_index(slices[d].axis), block_size).result)
            else:
                starts.append(stablehlo.ConstantOp(ir.DenseElementsAttr.get(np.array(0, dtype=np.int32))).result)
        return stablehlo.DynamicSliceOp(value, starts, ir.DenseI64ArrayAttr.get(sizes)).result

    # -- bringing operands to a sharding ----------------------------------------------------
    def bring(self, value: ir.Value, target: Sequence[Shard | None]) -> ir.Value:
        """Like reshard, but a splat constant or a broadcast is rebuilt at the local shape
        (its operand brought instead: fewer elements to move, often none)."""
        current = self.layout(value)
        if list(current.dims) == list(target) and not current.partial:
            return value
        if not current.partial:
            rebuilt = self._rebuild_local(value, target)
            if rebuilt is not None:
                return rebuilt
        return self.reshard(value, target)

    def _rebuild_local(self, value: ir.Value, target: Sequence[Shard | None]) -> ir.Value | None:
        op = defining_op(value)
        if op is None:
            return None
        layout = Layout(tuple(target))
        if op.name == "stablehlo.constant":
            if _is_splat_constant(op):
                attr = op.attributes["value"]
                local = self.local_shape(self.global_shape(value), layout)
                splat = ir.DenseElementsAttr.get_splat(with_shape(value.type, local), attr.get_splat_value())
                result = stablehlo.ConstantOp(splat).result
                self.set_layout(result, layout)
                return result
            return None
        if op.name == "stablehlo.broadcast_in_dim":
            operand = op.operands[0]
            operand_target = self._broadcast_operand_target(op, target)
            local = self.local_shape(self.global_shape(value), layout)
            # Dimensions the broadcast creates are built at the local size for free; the
            # operand's own dimensions are brought to the sharding first.
            source = self.bring(operand, operand_target)
            result = stablehlo.BroadcastInDimOp(with_shape(value.type, local), source, op.attributes["broadcast_dimensions"]).result
            self.set_layout(result, layout)
            return result
        return None

    def cheapest_target(self, values: list[ir.Value], rank: int) -> list[Shard | None]:
        """The sharding for an elementwise op: among the operands' own shardings, the one
        whose bringing costs the fewest all-gathered elements."""
        candidates: list[list[Shard | None]] = []
        for v in values:
            dims = list(self.layout(v).dims)
            if dims not in candidates:
                candidates.append(dims)
        return min(candidates, key=lambda t: sum(self.move_cost(v, t) for v in values))

    def move_cost(self, value: ir.Value, target: Sequence[Shard | None]) -> int:
        """Elements all-gathered (or all-reduced) to bring `value` to `target`."""
        layout = self.layout(value)
        if list(layout.dims) == list(target) and not layout.partial:
            return 0
        op = defining_op(value)
        if op is not None and _is_splat_constant(op):
            return 0
        if op is not None and op.name == "stablehlo.broadcast_in_dim" and not layout.partial:
            operand = op.operands[0]
            return self.move_cost(operand, self._broadcast_operand_target(op, target))
        size = math.prod(self.global_shape(value))
        cost = size if layout.partial else 0
        for d, axis in enumerate(layout.dims):
            if axis is not None and target[d] != axis:
                cost += size
        return cost

    def _broadcast_operand_target(self, op: ir.Operation, target: Sequence[Shard | None]) -> list[Shard | None]:
        """The sharding of a broadcast's operand that gives its result `target`."""
        operand = op.operands[0]
        mapping = list(ir.DenseI64ArrayAttr(op.attributes["broadcast_dimensions"]))
        operand_shape = self.global_shape(operand)
        global_result = self.global_shape(op.results[0])
        operand_target: list[Shard | None] = [None] * len(operand_shape)
        for j, d in enumerate(mapping):
            if target[d] is not None and operand_shape[j] == global_result[d]:
                operand_target[j] = target[d]
        return operand_target
