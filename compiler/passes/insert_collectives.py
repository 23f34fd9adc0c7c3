"""torchtpu-insert-collectives: from Shardy shardings on a single-device program to the
per-device program with explicit collectives."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..context import ir, stablehlo
from . import _collective_builders as build
from ._sharding import Layout, Mesh, Shard, ShardingError, parse_mesh, parse_sharding
from .base import Pass, register_pass

ELEMENTWISE = frozenset(
    "stablehlo." + n
    for n in (
        "add", "subtract", "multiply", "divide", "maximum", "minimum", "power", "remainder",
        "atan2", "and", "or", "xor", "compare", "select", "negate", "abs", "exponential",
        "exponential_minus_one", "log", "log_plus_one", "logistic", "tanh", "sqrt", "rsqrt",
        "cbrt", "sine", "cosine", "tan", "floor", "ceil", "round_nearest_even",
        "round_nearest_afz", "sign", "not", "convert", "is_finite", "clamp", "real", "imag",
        "complex", "shift_left", "shift_right_logical", "shift_right_arithmetic", "popcnt",
        "count_leading_zeros",
    )
)
# Ops through which a partial sum stays a partial sum: f(a+b) = f(a)+f(b).
_LINEAR_UNARY = frozenset({"stablehlo.negate", "stablehlo.convert", "stablehlo.real", "stablehlo.imag"})
_REDUCE_BODIES = {"stablehlo.add": "sum", "stablehlo.maximum": "max", "stablehlo.minimum": "min"}


def _i32() -> ir.Type:
    return ir.IntegerType.get_signless(32)


class _Unsupported(Exception):
    """A pattern the pass cannot partition; reported at the op."""


@register_pass
class InsertCollectivesPass(Pass):
    argument = "torchtpu-insert-collectives"
    summary = "Partition a single-device program with sdy shardings into the per-device program with explicit collectives"
    description = (
        "Input: functions whose arguments and results carry `sdy.sharding` attributes "
        "over an `sdy.mesh` (Shardy's standard attributes; one mesh axis per dimension). "
        "Output: the program one device runs: local shapes, and StableHLO collectives "
        "where a sharded value meets an op that needs more of it. Shardings propagate "
        "forward through elementwise ops (operands brought to one sharding: a replicated "
        "operand is sliced locally, splat constants and broadcasts are rebuilt at the "
        "local shape, no communication), broadcast_in_dim, transpose, reshape (the split "
        "moves to the output dimension that holds it; merging an unsharded dimension in "
        "front of a sharded one, as batched matmuls do with heads, gives a strided "
        "sharding), slice/pad/reverse/concatenate along unsharded dimensions, reduce (a reduction over "
        "a sharded dimension leaves a partial sum/max/min), and dot_general: matching "
        "batch dimensions stay sharded, contracting dimensions sharded alike leave a "
        "partial sum (Megatron row-parallel: one all-reduce), an axis that would shard "
        "the result twice is all-gathered on the right-hand operand, the weights in "
        "PyTorch's lowerings (FSDP: parameters all-gathered before use). Partial results are combined where a non-linear op "
        "or a result needs them: reduce-scatter when the result's sharding splits a "
        "dimension on that axis (FSDP gradients), all-reduce otherwise. Results are "
        "brought to their declared shardings (all-gather / local slice). Collectives use "
        "replica ids (`replica_groups` from the mesh, the program runs as mesh-size "
        "replicas); the argument/result shardings are kept as `torchtpu.sharding` "
        "attributes and the `sdy` ones removed. Any other op on a sharded value, a "
        "dimension that does not divide by its axis size or a sharding of several axes "
        "is a located error naming the op and the shardings."
    )

    def run(self, module: ir.Operation) -> None:
        body = module.regions[0].blocks[0]
        meshes: dict[str, Mesh] = {}
        mesh_ops = []
        for op in body.operations:
            op = op.operation
            if op.name == "sdy.mesh":
                name = ir.StringAttr(op.attributes["sym_name"]).value
                try:
                    meshes[name] = parse_mesh(name, str(op.attributes["mesh"]))
                except ShardingError as err:
                    self.error(op, str(err))
                    return
                mesh_ops.append(op)
        functions = [op.operation for op in body.operations if op.operation.name == "func.func"
                     and len(op.operation.regions[0].blocks) and _has_shardings(op.operation)]
        if functions and not meshes:
            self.error(functions[0], "arguments carry sdy.sharding but the module defines no sdy.mesh")
            return
        for fn in functions:
            _FunctionPartitioner(self, fn, meshes).run()
        if not self.engine.has_errors():
            # The per-device program has no mesh left for XLA to partition over; the
            # meshes stay readable as module attributes (torch_tpu.spmd reads them).
            for op in mesh_ops:
                name = ir.StringAttr(op.attributes["sym_name"]).value
                module.attributes[f"torchtpu.mesh.{name}"] = ir.StringAttr.get(str(op.attributes["mesh"]))
                op.erase()


def _has_shardings(fn: ir.Operation) -> bool:
    for key in ("arg_attrs", "res_attrs"):
        if key in fn.attributes:
            for attr in ir.ArrayAttr(fn.attributes[key]):
                if "sdy.sharding" in ir.DictAttr(attr):
                    return True
    return False


def _attr_dicts(fn: ir.Operation, key: str, count: int) -> list[dict]:
    if key not in fn.attributes:
        return [{} for _ in range(count)]
    out = []
    for attr in ir.ArrayAttr(fn.attributes[key]):
        d = ir.DictAttr(attr)
        out.append({d[i].name: d[i].attr for i in range(len(d))})
    return out


def _shape(value: ir.Value) -> list[int]:
    return list(ir.RankedTensorType(value.type).shape)


def _with_shape(t: ir.Type, shape: Sequence[int]) -> ir.RankedTensorType:
    return ir.RankedTensorType.get(list(shape), ir.RankedTensorType(t).element_type)


class _FunctionPartitioner:
    def __init__(self, pass_: InsertCollectivesPass, fn: ir.Operation, meshes: dict[str, Mesh]) -> None:
        self.pass_ = pass_
        self.fn = fn
        self.meshes = meshes
        self.mesh: Mesh | None = None
        self.layouts = _ValueMap()
        self.channels = build.ChannelAllocator()

    # -- bookkeeping ----------------------------------------------------------------------
    def layout(self, value: ir.Value) -> Layout:
        found = self.layouts.get(value)
        return found if found is not None else Layout.replicated(len(_shape(value)))

    def set_layout(self, value: ir.Value, layout: Layout) -> None:
        self.layouts.set(value, layout)

    def global_shape(self, value: ir.Value) -> list[int]:
        """The single-device shape of a (possibly already local) value."""
        layout = self.layout(value)
        return [s * (self.mesh.axis_size(a.axis) if a is not None else 1) for s, a in zip(_shape(value), layout.dims)]

    def local_shape(self, shape: Sequence[int], layout: Layout, where) -> list[int]:
        out = []
        for size, shard in zip(shape, layout.dims):
            if shard is None:
                out.append(size)
                continue
            k = self.mesh.axis_size(shard.axis)
            if size % (k * shard.major):
                raise _Unsupported(f"dimension of size {size} is sharded on {shard} of size {k}, which does not divide it")
            out.append(size // k)
        return out

    # -- entry ----------------------------------------------------------------------------
    def run(self) -> None:
        with self.fn.context, self.fn.location:
            self._run()

    def _run(self) -> None:
        fn = self.fn
        block = fn.regions[0].blocks[0]
        args = list(block.arguments)
        arg_attrs = _attr_dicts(fn, "arg_attrs", len(args))
        ftype = ir.FunctionType(ir.TypeAttr(fn.attributes["function_type"]).value)
        res_attrs = _attr_dicts(fn, "res_attrs", len(ftype.results))
        try:
            arg_layouts = [self._declared(attrs, _shape(a), f"argument #{i}") for i, (a, attrs) in enumerate(zip(args, arg_attrs))]
            res_layouts = [self._declared(attrs, list(ir.RankedTensorType(t).shape), f"result #{i}")
                           for i, (t, attrs) in enumerate(zip(ftype.results, res_attrs))]
        except (ShardingError, _Unsupported) as err:
            self.pass_.error(fn, str(err))
            return
        if self.mesh is None:
            return
        for arg, layout in zip(args, arg_layouts):
            try:
                arg.set_type(_with_shape(arg.type, self.local_shape(_shape(arg), layout, arg)))
            except _Unsupported as err:
                self.pass_.error(fn, f"argument #{arg.arg_number}: {err}")
                return
            self.set_layout(arg, layout)
        for op in list(block.operations):
            op = op.operation
            try:
                with ir.InsertionPoint(op), op.location:
                    if op.name == "func.return":
                        self._return(op, res_layouts)
                    else:
                        self._partition(op)
            except _Unsupported as err:
                operands = ", ".join(self.layout(v).describe() for v in op.operands)
                self.pass_.error(op, f"'{op.name}' on operands sharded {operands}: {err}")
                return
            except (build.CollectiveError, ShardingError) as err:
                self.pass_.error(op, f"'{op.name}': {err}")
                return
        _erase_dead(block)
        results = [v.type for v in block.operations[len(block.operations) - 1].operands]
        fn.attributes["function_type"] = ir.TypeAttr.get(ir.FunctionType.get([a.type for a in args], results))
        self._rewrite_attrs(arg_attrs, "arg_attrs", arg_layouts)
        self._rewrite_attrs(res_attrs, "res_attrs", res_layouts)

    def _declared(self, attrs: dict, shape: list[int], what: str) -> Layout:
        sharding = attrs.get("sdy.sharding")
        if sharding is None:
            return Layout.replicated(len(shape))
        mesh, layout = parse_sharding(str(sharding), self.meshes, len(shape))
        if self.mesh is not None and mesh != self.mesh:
            raise ShardingError(f"{what} uses mesh @{mesh.name} but another value uses @{self.mesh.name}; use one mesh")
        self.mesh = mesh
        return layout

    def _rewrite_attrs(self, dicts: list[dict], key: str, layouts: list[Layout]) -> None:
        if key not in self.fn.attributes:
            return
        new = []
        for d, layout in zip(dicts, layouts):
            d = {k: v for k, v in d.items() if k != "sdy.sharding"}
            if not layout.is_replicated:
                d["torchtpu.sharding"] = ir.StringAttr.get(layout.sdy_text(self.mesh.name))
            new.append(ir.DictAttr.get(d))
        self.fn.attributes[key] = ir.ArrayAttr.get(new)

    # -- collectives and local slices -------------------------------------------------------
    def reshard(self, value: ir.Value, target: Sequence[Shard | None]) -> ir.Value:
        """`value` brought to sharding `target` (partial results combined)."""
        current = self.layout(value)
        dims = list(current.dims)
        target = list(target)
        for axis, kind in current.partial:
            scatter = next((d for d, a in enumerate(target) if a is not None and a.axis == axis and a.major == 1
                            and dims[d] is None and _shape(value)[d] % self.mesh.axis_size(axis) == 0), None)
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

    def _axis_index(self, axis: str) -> ir.Value:
        table = np.array(self.mesh.axis_index_table(axis), dtype=np.int32)
        constant = stablehlo.ConstantOp(ir.DenseElementsAttr.get(table)).result
        rank = build.rank_id(False)
        one = stablehlo.DynamicSliceOp(constant, [rank], ir.DenseI64ArrayAttr.get([1])).result
        return stablehlo.ReshapeOp(ir.RankedTensorType.get([], _i32()), one).result

    def _split_major(self, value: ir.Value, d: int, major: int) -> ir.Value:
        shape = _shape(value)
        return stablehlo.ReshapeOp(_with_shape(value.type, shape[:d] + [major, shape[d] // major] + shape[d + 1:]), value).result

    def _merge_major(self, value: ir.Value, d: int) -> ir.Value:
        shape = _shape(value)
        return stablehlo.ReshapeOp(_with_shape(value.type, shape[:d] + [shape[d] * shape[d + 1]] + shape[d + 2:]), value).result

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
        shape = _shape(value)
        sizes = list(shape)
        starts = []
        for d, size in enumerate(shape):
            if d in slices:
                k = self.mesh.axis_size(slices[d].axis)
                if size % k:
                    raise _Unsupported(f"dimension {d} of size {size} does not divide by axis {slices[d]} of size {k}")
                sizes[d] = size // k
                block_size = stablehlo.ConstantOp(ir.DenseElementsAttr.get(np.array(sizes[d], dtype=np.int32))).result
                starts.append(stablehlo.MulOp(self._axis_index(slices[d].axis), block_size).result)
            else:
                starts.append(stablehlo.ConstantOp(ir.DenseElementsAttr.get(np.array(0, dtype=np.int32))).result)
        return stablehlo.DynamicSliceOp(value, starts, ir.DenseI64ArrayAttr.get(sizes)).result

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
        op = _defining_op(value)
        if op is None:
            return None
        layout = Layout(tuple(target))
        if op.name == "stablehlo.constant":
            attr = op.attributes["value"]
            if isinstance(attr, ir.DenseElementsAttr) and attr.is_splat:
                local = self.local_shape(self.global_shape(value), layout, op)
                splat = ir.DenseElementsAttr.get_splat(_with_shape(value.type, local), attr.get_splat_value())
                result = stablehlo.ConstantOp(splat).result
                self.set_layout(result, layout)
                return result
            return None
        if op.name == "stablehlo.broadcast_in_dim":
            operand = op.operands[0]
            operand_target = self._broadcast_operand_target(op, target)
            local = self.local_shape(self.global_shape(value), layout, op)
            # Dimensions the broadcast creates are built at the local size for free; the
            # operand's own dimensions are brought to the sharding first.
            source = self.bring(operand, operand_target)
            result = stablehlo.BroadcastInDimOp(_with_shape(value.type, local), source, op.attributes["broadcast_dimensions"]).result
            self.set_layout(result, layout)
            return result
        return None

    # -- ops ------------------------------------------------------------------------------------
    def _partition(self, op: ir.Operation) -> None:
        layouts = [self.layout(v) for v in op.operands if isinstance(v.type, ir.RankedTensorType)]
        if all(l.is_replicated for l in layouts):
            return  # replicated inputs: every rank computes the whole op, as before
        name = op.name
        if name in ELEMENTWISE:
            self._elementwise(op)
        elif name == "stablehlo.broadcast_in_dim":
            self._broadcast_in_dim(op)
        elif name == "stablehlo.transpose":
            self._transpose(op)
        elif name == "stablehlo.reshape":
            self._reshape(op)
        elif name == "stablehlo.reduce":
            self._reduce(op)
        elif name == "stablehlo.dot_general":
            self._dot_general(op)
        elif name in ("stablehlo.slice", "stablehlo.pad", "stablehlo.reverse"):
            self._along_whole_dims(op)
        elif name == "stablehlo.concatenate":
            self._concatenate(op)
        else:
            raise _Unsupported("the partitioner has no rule for this op on sharded values; "
                               "replicate its operands (sdy.sharding with {} dimensions) or restructure the code")

    def _retype(self, op: ir.Operation, index: int, layout: Layout) -> None:
        result = op.results[index]
        result.set_type(_with_shape(result.type, self.local_shape(_shape(result), layout, op)))
        self.set_layout(result, layout)

    def _elementwise(self, op: ir.Operation) -> None:
        operands = list(op.operands)
        rank = len(_shape(op.results[0]))
        # clamp/select may take 0-d operands next to ranked ones: those stay whole.
        ranked = [i for i, v in enumerate(operands) if len(_shape(v)) == rank]
        layouts = [self.layout(v) for v in operands]
        partials = [l.partial for l in layouts]
        keep_partial: tuple = ()
        nonzero = [i for i, p in enumerate(partials) if p]
        sum_only = all(kind == "sum" for p in partials for _, kind in p)
        if nonzero and sum_only:
            linear_unary = op.name in _LINEAR_UNARY and len(operands) == 1 and _keeps_sums(op)
            same_sums = op.name in ("stablehlo.add", "stablehlo.subtract") and all(p == partials[0] for p in partials)
            if linear_unary or same_sums:
                keep_partial = partials[0]
            elif op.name == "stablehlo.multiply" and len(nonzero) == 1:
                keep_partial = partials[nonzero[0]]
            elif op.name == "stablehlo.divide" and nonzero == [0]:
                keep_partial = partials[0]
        target = self._cheapest_target([operands[i] for i in ranked], rank)
        partial_axes = {a for a, _ in keep_partial}
        if partial_axes & {a.axis for a in target if a is not None}:
            keep_partial = ()
        for i in ranked:
            value = operands[i]
            if keep_partial and layouts[i].partial == keep_partial:
                if list(layouts[i].dims) != target:
                    # Bring the sharding along without combining the partial sums.
                    value = self._reshard_keep_partial(value, target)
            else:
                value = self.bring(value, target)
            op.operands[i] = value
        for i in range(len(op.results)):
            self._retype(op, i, Layout(tuple(target), keep_partial))

    def _cheapest_target(self, values: list[ir.Value], rank: int) -> list[Shard | None]:
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
        op = _defining_op(value)
        if op is not None and op.name == "stablehlo.constant":
            attr = op.attributes["value"]
            if isinstance(attr, ir.DenseElementsAttr) and attr.is_splat:
                return 0
        if op is not None and op.name == "stablehlo.broadcast_in_dim" and not layout.partial:
            operand = op.operands[0]
            return self.move_cost(operand, self._broadcast_operand_target(op, target))
        size = _numel(self.global_shape(value))
        cost = size if layout.partial else 0
        for d, axis in enumerate(layout.dims):
            if axis is not None and target[d] != axis:
                cost += size
        return cost

    def _broadcast_operand_target(self, op: ir.Operation, target: Sequence[Shard | None]) -> list[Shard | None]:
        operand = op.operands[0]
        mapping = list(ir.DenseI64ArrayAttr(op.attributes["broadcast_dimensions"]))
        operand_shape = self.global_shape(operand)
        result_shape = [s for s in _shape(op.results[0])]
        layout = self.layout(op.results[0])
        global_result = [s * (self.mesh.axis_size(a.axis) if a else 1) for s, a in zip(result_shape, layout.dims)]
        operand_target: list[Shard | None] = [None] * len(operand_shape)
        for j, d in enumerate(mapping):
            if target[d] is not None and operand_shape[j] == global_result[d]:
                operand_target[j] = target[d]
        return operand_target

    def _reshard_keep_partial(self, value: ir.Value, target) -> ir.Value:
        layout = self.layout(value)
        self.set_layout(value, Layout(layout.dims))
        result = self.reshard(value, target)
        self.set_layout(value, layout)
        self.set_layout(result, Layout(tuple(target), layout.partial))
        return result

    def _broadcast_in_dim(self, op: ir.Operation) -> None:
        operand = op.operands[0]
        layout = self.layout(operand)
        mapping = list(ir.DenseI64ArrayAttr(op.attributes["broadcast_dimensions"]))
        out_shape = _shape(op.results[0])
        dims: list[Shard | None] = [None] * len(out_shape)
        in_shape = self.global_shape(operand)
        for j, d in enumerate(mapping):
            if layout.dims[j] is not None:
                if in_shape[j] != out_shape[d]:
                    raise _Unsupported("a sharded dimension cannot be expanded by broadcasting")
                dims[d] = layout.dims[j]
        self._retype(op, 0, Layout(tuple(dims), layout.partial))

    def _transpose(self, op: ir.Operation) -> None:
        layout = self.layout(op.operands[0])
        perm = list(ir.DenseI64ArrayAttr(op.attributes["permutation"]))
        self._retype(op, 0, Layout(tuple(layout.dims[p] for p in perm), layout.partial))

    def _reshape(self, op: ir.Operation) -> None:
        layout = self.layout(op.operands[0])
        in_shape, out_shape = self.global_shape(op.operands[0]), _shape(op.results[0])
        dims: list[Shard | None] = [None] * len(out_shape)
        for in_group, out_group in _reshape_groups(in_shape, out_shape):
            sharded = [d for d in in_group if layout.dims[d] is not None]
            if not sharded:
                continue
            if len(sharded) > 1:
                raise _Unsupported(f"reshape {in_shape} -> {out_shape} merges two sharded dimensions")
            i = sharded[0]
            shard = layout.dims[i]
            placed = _place_shard(in_shape, out_shape, in_group, out_group, i, shard, self.mesh.axis_size(shard.axis))
            if placed is None:
                raise _Unsupported(
                    f"reshape {in_shape} -> {out_shape} splits sharded dimension {i} (axis \"{shard.axis}\") "
                    "across dimensions so that no single dimension holds the split; shard a dimension that "
                    "stays whole or leads its group"
                )
            j, major = placed
            dims[j] = Shard(shard.axis, major)
        self._retype(op, 0, Layout(tuple(dims), layout.partial))

    def _along_whole_dims(self, op: ir.Operation) -> None:
        """slice / pad / reverse: local when every dimension they change is unsharded
        (a sharded dimension must be kept whole: full slice, no padding, not reversed)."""
        operand = op.operands[0]
        layout = self.layout(operand)
        shape = self.global_shape(operand)
        sharded = [d for d, a in enumerate(layout.dims) if a is not None]
        attrs = op.attributes
        if op.name == "stablehlo.slice":
            start = list(ir.DenseI64ArrayAttr(attrs["start_indices"]))
            limit = list(ir.DenseI64ArrayAttr(attrs["limit_indices"]))
            strides = list(ir.DenseI64ArrayAttr(attrs["strides"]))
            touched = [d for d in sharded if (start[d], limit[d], strides[d]) != (0, shape[d], 1)]
        elif op.name == "stablehlo.pad":
            if not self.layout(op.operands[1]).is_replicated:
                raise _Unsupported("the padding value must be replicated")
            pads = [list(ir.DenseI64ArrayAttr(attrs[k])) for k in ("edge_padding_low", "edge_padding_high", "interior_padding")]
            touched = [d for d in sharded if any(p[d] for p in pads)]
        else:
            touched = [d for d in sharded if d in set(ir.DenseI64ArrayAttr(attrs["dimensions"]))]
        if touched:
            raise _Unsupported(f"it changes sharded dimension(s) {touched}; only unsharded dimensions may be "
                               "sliced, padded or reversed")
        if op.name == "stablehlo.slice":
            local = self.local_shape(shape, Layout(layout.dims), op)
            attrs["limit_indices"] = ir.DenseI64ArrayAttr.get(
                [local[d] if layout.dims[d] is not None else limit[d] for d in range(len(shape))])
        self._retype(op, 0, layout)

    def _concatenate(self, op: ir.Operation) -> None:
        dim = ir.IntegerAttr(op.attributes["dimension"]).value
        operands = list(op.operands)
        target = self._cheapest_target(operands, len(_shape(op.results[0])))
        target = [None if d == dim else a for d, a in enumerate(target)]
        partials = {self.layout(v).partial for v in operands}
        keep = partials.pop() if len(partials) == 1 else ()
        if keep and not all(kind == "sum" for _, kind in keep):
            keep = ()
        for i, value in enumerate(operands):
            if keep and list(self.layout(value).dims) != target:
                value = self._reshard_keep_partial(value, target)
            elif not keep:
                value = self.bring(value, target)
            op.operands[i] = value
        self._retype(op, 0, Layout(tuple(target), keep))

    def _reduce(self, op: ir.Operation) -> None:
        n = len(op.results)
        if n != 1:
            raise _Unsupported("a reduce of several operands (argmax-like) over sharded values is not supported")
        body_ops = [o.operation.name for o in op.regions[0].blocks[0].operations]
        kind = _REDUCE_BODIES.get(body_ops[0]) if len(body_ops) == 2 else None
        operand = op.operands[0]
        layout = self.layout(operand)
        if self.layout(op.operands[1]).partial or not self.layout(op.operands[1]).is_replicated:
            raise _Unsupported("the init value of a reduce must be replicated")
        if layout.partial and not (kind == "sum" and all(k == "sum" for _, k in layout.partial)):
            operand = self.reshard(operand, layout.dims)
            op.operands[0] = operand
            layout = self.layout(operand)
        reduced = set(ir.DenseI64ArrayAttr(op.attributes["dimensions"]))
        partial = list(layout.partial)
        dims = []
        for d, axis in enumerate(layout.dims):
            if d in reduced:
                if axis is not None:
                    if kind is None:
                        raise _Unsupported("a reduction over a sharded dimension must be a sum, max or min")
                    partial.append((axis.axis, kind))
            else:
                dims.append(axis)
        self._retype(op, 0, Layout(tuple(dims), tuple(partial)))

    def _dot_general(self, op: ir.Operation) -> None:
        lhs, rhs = op.operands[0], op.operands[1]
        if self.layout(lhs).partial:
            lhs = self.reshard(lhs, self.layout(lhs).dims)
        if self.layout(rhs).partial:
            rhs = self.reshard(rhs, self.layout(rhs).dims)
        numbers = stablehlo.DotDimensionNumbers(op.attributes["dot_dimension_numbers"])
        lb, rb = list(numbers.lhs_batching_dimensions), list(numbers.rhs_batching_dimensions)
        lc, rc = list(numbers.lhs_contracting_dimensions), list(numbers.rhs_contracting_dimensions)
        L = list(self.layout(lhs).dims)
        R = list(self.layout(rhs).dims)
        for i, j in zip(lb, rb):
            if L[i] != R[j]:
                chosen = L[i] if L[i] is not None else R[j]
                L[i] = R[j] = chosen
        lfree = [d for d in range(len(L)) if d not in lb and d not in lc]
        rfree = [d for d in range(len(R)) if d not in rb and d not in rc]

        def used_elsewhere(shard: Shard, skip_l=None, skip_r=None) -> bool:
            for d, a in enumerate(L):
                if a is not None and a.axis == shard.axis and d != skip_l:
                    return True
            for d, a in enumerate(R):
                if a is not None and a.axis == shard.axis and d != skip_r:
                    return True
            return False

        for i, j in zip(lc, rc):
            if L[i] == R[j]:
                continue
            if L[i] is not None and R[j] is not None:
                L[i] = R[j] = None
            elif L[i] is not None:
                if used_elsewhere(L[i], skip_l=i):
                    L[i] = None
                else:
                    R[j] = L[i]
            else:
                if used_elsewhere(R[j], skip_r=j):
                    R[j] = None
                else:
                    L[i] = R[j]
        # An axis may shard the result once: free dims of both operands on one axis
        # gather one of them.
        while True:
            seen: dict[str, tuple[str, int]] = {}
            conflict = None
            for side, dims, idx in (("l", L, lb), ("r", R, ())):
                for d in idx:
                    if dims[d] is not None:
                        seen.setdefault(dims[d].axis, (side, d))
            for i, j in zip(lc, rc):
                if L[i] is not None:
                    seen.setdefault(L[i].axis, ("c", i))
            for side, dims, free in (("l", L, lfree), ("r", R, rfree)):
                for d in free:
                    a = dims[d]
                    if a is None:
                        continue
                    if a.axis in seen:
                        conflict = (a.axis, seen[a.axis], (side, d))
                        break
                    seen[a.axis] = (side, d)
                if conflict:
                    break
            if conflict is None:
                break
            axis, first, second = conflict
            candidates = [c for c in (first, second) if c[0] in ("l", "r") and
                          ((c[0] == "l" and c[1] in lfree) or (c[0] == "r" and c[1] in rfree))]
            if len(candidates) == 2:
                # The right-hand side is gathered: PyTorch's linear/matmul lowerings put the
                # activations left and the weights right, and FSDP gathers the weights so
                # that the activations keep their batch sharding downstream. (Gathering the
                # smaller operand looks cheaper here but shards the hidden activations on
                # the axis, which costs more later: measured in bench/spmd.py.)
                pick = next(c for c in candidates if c[0] == "r")
            elif candidates:
                pick = candidates[0]
            else:
                raise _Unsupported(f"axis \"{axis}\" would shard two dimensions of the result")
            (L if pick[0] == "l" else R)[pick[1]] = None
        lhs = self.bring(lhs, L)
        rhs = self.bring(rhs, R)
        op.operands[0] = lhs
        op.operands[1] = rhs
        partial = tuple((L[i].axis, "sum") for i, j in zip(lc, rc) if L[i] is not None)
        out = [L[i] for i in lb] + [L[d] for d in lfree] + [R[d] for d in rfree]
        self._retype(op, 0, Layout(tuple(out), partial))

    def _return(self, op: ir.Operation, targets: list[Layout]) -> None:
        for i, (value, target) in enumerate(zip(list(op.operands), targets)):
            op.operands[i] = self.reshard(value, target.dims) if self.layout(value) != target else value


_DEAD_IF_UNUSED = frozenset({"stablehlo.constant", "stablehlo.broadcast_in_dim", "stablehlo.iota", "stablehlo.reshape",
                             "stablehlo.transpose"})


def _keeps_sums(op: ir.Operation) -> bool:
    """A convert keeps partial sums partial only between float types (to an integer
    type, rounding each part is not rounding the sum)."""
    if op.name != "stablehlo.convert":
        return True
    kinds = {build.element_kind(ir.RankedTensorType(v.type).element_type) for v in (op.operands[0], op.results[0])}
    return kinds <= {"float", "complex"}


def _erase_dead(block: ir.Block) -> None:
    """Constants and broadcasts replaced by local rebuilds are left unused: erase them."""
    for op in reversed(list(block.operations)):
        op = op.operation
        if op.name in _DEAD_IF_UNUSED and all(not list(r.uses) for r in op.results):
            op.erase()


def _defining_op(value: ir.Value) -> ir.Operation | None:
    owner = value.owner
    if isinstance(owner, ir.Block):
        return None
    return owner.operation if hasattr(owner, "operation") else owner


class _ValueMap:
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


def _numel(shape: Sequence[int]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def _place_shard(in_shape, out_shape, in_group, out_group, i: int, shard: Shard, k: int) -> tuple[int, int] | None:
    """Where a reshape puts input dimension `i`'s sharding: (output dimension, major).

    Flattened, the group is [M, R/k-blocks..., minor] with M the elements before the
    split factor (the dimensions before `i` in the group, times its own major), R the
    split factor (dimension i without its major part) and `minor` the dimensions after
    it. The output dimension j (with P elements before it, Q after it in the group)
    holds the split when P divides M, and j's size over M/P, times Q, is R * minor and
    divides by k."""
    before = 1
    for d in in_group:
        if d == i:
            break
        before *= in_shape[d]
    major_elems = before * shard.major
    split = in_shape[i] // shard.major
    minor = 1
    for d in in_group[in_group.index(i) + 1:]:
        minor *= in_shape[d]
    prefix = 1
    for pos, j in enumerate(out_group):
        suffix = 1
        for d in out_group[pos + 1:]:
            suffix *= out_shape[d]
        if major_elems % prefix == 0:
            m_out = major_elems // prefix
            if out_shape[j] % m_out == 0:
                inner = out_shape[j] // m_out
                if inner * suffix == split * minor and inner % k == 0:
                    return j, m_out
        prefix *= out_shape[j]
    return None


def _reshape_groups(a: list[int], b: list[int]) -> list[tuple[list[int], list[int]]]:
    """Pairs of minimal dimension groups of `a` and `b` with equal element counts
    (size-1 dimensions join the group before them)."""
    groups = []
    i = j = 0
    while i < len(a) or j < len(b):
        gi, gj = [], []
        pa = pb = 1
        if i < len(a):
            gi.append(i); pa *= a[i]; i += 1
        if j < len(b):
            gj.append(j); pb *= b[j]; j += 1
        while pa != pb:
            if pa < pb and i < len(a):
                gi.append(i); pa *= a[i]; i += 1
            elif j < len(b):
                gj.append(j); pb *= b[j]; j += 1
            else:
                break
        while i < len(a) and a[i] == 1 and (j >= len(b) or b[j] != 1):
            gi.append(i); i += 1
        while j < len(b) and b[j] == 1 and (i >= len(a) or a[i] != 1):
            gj.append(j); j += 1
        groups.append((gi, gj))
    return groups
