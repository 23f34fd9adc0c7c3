"""torchtpu-insert-collectives: from Shardy shardings on a single-device program to the
per-device program with explicit collectives.

This file declares the pass and drives it over each function; how values move between
shardings is `_resharding.py`, what each op does with sharded operands is the rule
table in `_partition_rules.py`.
"""

from __future__ import annotations

from torch_tpu.core import attributes

from ..context import ir
from . import _collective_builders as build
from ._partition_rules import RULES
from ._resharding import Partitioner, Unsupported, shape_of, with_shape
from .sharding import (
    MESH_ATTR_PREFIX,
    SHARDING_ATTR,
    Layout,
    Mesh,
    ShardingError,
    parse_mesh,
    parse_sharding,
)
from .base import Pass, register_pass


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
    follows_calls = False

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
            self._partition_function(fn, meshes)
        if not self.engine.has_errors():
            # The per-device program has no mesh left for XLA to partition over; the
            # meshes stay readable as module attributes (torch_tpu.spmd reads them).
            for op in mesh_ops:
                name = ir.StringAttr(op.attributes["sym_name"]).value
                module.attributes[MESH_ATTR_PREFIX + name] = ir.StringAttr.get(str(op.attributes["mesh"]))
                op.erase()

    def _partition_function(self, fn: ir.Operation, meshes: dict[str, Mesh]) -> None:
        block = fn.regions[0].blocks[0]
        args = list(block.arguments)
        arg_attrs = _attr_dicts(fn, "arg_attrs", len(args))
        ftype = ir.FunctionType(ir.TypeAttr(fn.attributes["function_type"]).value)
        res_attrs = _attr_dicts(fn, "res_attrs", len(ftype.results))
        try:
            declared = [(attrs, shape_of(a), f"argument #{i}") for i, (a, attrs) in enumerate(zip(args, arg_attrs))]
            declared += [(attrs, list(ir.RankedTensorType(t).shape), f"result #{i}")
                         for i, (t, attrs) in enumerate(zip(ftype.results, res_attrs))]
            mesh, layouts = _declared_layouts(declared, meshes)
        except ShardingError as err:
            self.error(fn, str(err))
            return
        if mesh is None:
            return
        arg_layouts, res_layouts = layouts[:len(args)], layouts[len(args):]
        p = Partitioner(mesh)
        for arg, layout in zip(args, arg_layouts):
            try:
                arg.set_type(with_shape(arg.type, p.local_shape(shape_of(arg), layout)))
            except Unsupported as err:
                self.error(fn, f"argument #{arg.arg_number}: {err}")
                return
            p.set_layout(arg, layout)
        for op in list(block.operations):
            op = op.operation
            try:
                with ir.InsertionPoint(op), op.location:
                    if op.name == "func.return":
                        for i, (value, target) in enumerate(zip(list(op.operands), res_layouts)):
                            op.operands[i] = p.reshard(value, target.dims) if p.layout(value) != target else value
                    else:
                        _partition_op(p, op)
            except Unsupported as err:
                operands = ", ".join(p.layout(v).describe() for v in op.operands)
                self.error(op, f"'{op.name}' on operands sharded {operands}: {err}")
                return
            except (build.CollectiveError, ShardingError) as err:
                self.error(op, f"'{op.name}': {err}")
                return
        _erase_dead(block)
        results = [v.type for v in block.operations[len(block.operations) - 1].operands]
        fn.attributes["function_type"] = ir.TypeAttr.get(ir.FunctionType.get([a.type for a in args], results))
        _rewrite_attrs(fn, arg_attrs, "arg_attrs", arg_layouts, mesh)
        _rewrite_attrs(fn, res_attrs, "res_attrs", res_layouts, mesh)


def _partition_op(p: Partitioner, op: ir.Operation) -> None:
    layouts = [p.layout(v) for v in op.operands if isinstance(v.type, ir.RankedTensorType)]
    if all(l.is_replicated for l in layouts):
        return  # replicated inputs: every rank computes the whole op, as before
    rule = RULES.get(op.name)
    if rule is None:
        raise Unsupported("the partitioner has no rule for this op on sharded values; "
                          "replicate its operands (sdy.sharding with {} dimensions) or restructure the code")
    rule(p, op)


def _has_shardings(fn: ir.Operation) -> bool:
    for key in ("arg_attrs", "res_attrs"):
        if key in fn.attributes:
            for attr in ir.ArrayAttr(fn.attributes[key]):
                if attributes.SDY_SHARDING in ir.DictAttr(attr):
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


def _declared_layouts(declared: list[tuple[dict, list[int], str]],
                      meshes: dict[str, Mesh]) -> tuple[Mesh | None, list[Layout]]:
    """The layouts the `sdy.sharding` attributes declare ((attributes, shape, what) per
    argument then result) and the one mesh they use (None: nothing sharded)."""
    mesh: Mesh | None = None
    layouts = []
    for attrs, shape, what in declared:
        sharding = attrs.get(attributes.SDY_SHARDING)
        if sharding is None:
            layouts.append(Layout.replicated(len(shape)))
            continue
        used, layout = parse_sharding(str(sharding), meshes, len(shape))
        if mesh is not None and used != mesh:
            raise ShardingError(f"{what} uses mesh @{used.name} but another value uses @{mesh.name}; use one mesh")
        mesh = used
        layouts.append(layout)
    return mesh, layouts


def _rewrite_attrs(fn: ir.Operation, dicts: list[dict], key: str, layouts: list[Layout], mesh: Mesh) -> None:
    """`sdy.sharding` attributes replaced by `torchtpu.sharding` (nothing for a
    replicated value)."""
    if key not in fn.attributes:
        return
    new = []
    for d, layout in zip(dicts, layouts):
        d = {k: v for k, v in d.items() if k != attributes.SDY_SHARDING}
        if not layout.is_replicated:
            d[SHARDING_ATTR] = ir.StringAttr.get(layout.sdy_text(mesh.name))
        new.append(ir.DictAttr.get(d))
    fn.attributes[key] = ir.ArrayAttr.get(new)


_DEAD_IF_UNUSED = frozenset({"stablehlo.constant", "stablehlo.broadcast_in_dim", "stablehlo.iota", "stablehlo.reshape",
                             "stablehlo.transpose"})


def _erase_dead(block: ir.Block) -> None:
    """Constants and broadcasts replaced by local rebuilds are left unused: erase them."""
    for op in reversed(list(block.operations)):
        op = op.operation
        if op.name in _DEAD_IF_UNUSED and all(not list(r.uses) for r in op.results):
            op.erase()
