"""Non-functional import: ATen graphs with views and in-place / `out=` ops
(docs/explanation/views.md).

Storage that is ever written is a reference (`!torchtpu.ref<...>`): a mutated graph
input is a reference argument, a mutated tensor created in the graph is a
`torchtpu.alloc`. ATen views of a reference become `torchtpu` view ops; any other use
of it reads the current value with `torchtpu.load` at that point of the program. An op
that writes an argument (its schema says `Tensor(a!)`) is lowered as its out-of-place
counterpart (`add_` -> `add`, `add.out` -> `add.Tensor`, `copy_` -> `copy`) on loaded
values, followed by a `torchtpu.store` into the written reference. Storage that is
never written stays a plain value, exactly as in functional import.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx
import torch.utils._pytree as pytree

from ..context import ir
from ..dialect import make_ref_type, ref_tensor_type
from ..dtypes import tensor_type
from ..lowering import LOWERINGS, LoweringError, UnsupportedOpError
from ..lowering.helpers import broadcast_to, convert, shape_of
from ..lowering.registry import OpRecord, require_padding_as_is
from ..fx_locations import node_location

aten = torch.ops.aten
operator_getitem = operator.getitem

# In-place ops that change a tensor's metadata, not its data: they are views.
METADATA_INPLACE = frozenset({
    aten.t_.default, aten.transpose_.default, aten.squeeze_.default, aten.squeeze_.dim,
    aten.squeeze_.dims, aten.unsqueeze_.default, aten.as_strided_.default, aten.detach_.default,
    aten.swapdims_.default, aten.swapaxes_.default,
})


@dataclass(frozen=True)
class RefHandle:
    """What the importer's environment holds for an FX node whose storage is written:
    the reference value and the node at the root of its storage."""

    value: ir.Value
    root: torch.fx.Node


def _schema(target) -> Any:
    return getattr(target, "_schema", None)


def written_args(target) -> list[str]:
    """Names of the arguments the op writes (`Tensor(a!)`), metadata-only ops excluded."""
    schema = _schema(target)
    if schema is None or target in METADATA_INPLACE:
        return []
    return [a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write]


def is_view(target) -> bool:
    """Whether the op's result aliases its first argument without writing it."""
    if target in METADATA_INPLACE:
        return True
    schema = _schema(target)
    if schema is None or not schema.returns or not schema.arguments:
        return False
    ret, first = schema.returns[0].alias_info, schema.arguments[0].alias_info
    if first is None or first.is_write:
        return False
    # `Tensor(a) self -> Tensor(a)`, or `Tensor(a -> *) self -> Tensor(a)[]` (split,
    # unbind: the list's elements alias self).
    return "*" in first.after_set or (ret is not None and bool(set(ret.before_set) & set(first.before_set)))


def _bind(target, node: torch.fx.Node) -> dict[str, Any]:
    """Node arguments by schema name."""
    schema = _schema(target)
    bound: dict[str, Any] = {}
    for arg, value in zip(schema.arguments, node.args):
        bound[arg.name] = value
    bound.update(node.kwargs)
    return bound


def _analyze(graph: torch.fx.Graph) -> tuple[dict, set]:
    """(root node of each node's storage, roots that are written)."""
    root: dict[torch.fx.Node, torch.fx.Node] = {}
    written: set[torch.fx.Node] = set()
    for node in graph.nodes:
        root[node] = node
        if node.op != "call_function":
            continue
        target = node.target
        if target is operator_getitem:
            src = node.args[0]
            if isinstance(src, torch.fx.Node) and _is_multi_view(src):
                root[node] = root[src]  # an element of a multi-result view (split, unbind)
            continue
        if is_view(target) and isinstance(node.args[0], torch.fx.Node):
            root[node] = root[node.args[0]]
        names = written_args(target)
        if names:
            bound = _bind(target, node)
            for name in names:
                arg = bound.get(name)
                for leaf in pytree.tree_leaves(arg):
                    if isinstance(leaf, torch.fx.Node):
                        written.add(root[leaf])
            # The result of an in-place op is its written argument.
            first = bound.get(names[0])
            if isinstance(first, torch.fx.Node):
                root[node] = root[first]
    return root, written


def _is_multi_view(node: torch.fx.Node) -> bool:
    return node.op == "call_function" and is_view(node.target)


def _norm(dim: int, rank: int) -> int:
    return dim + rank if dim < 0 else dim


def view_op(name: str, source: ir.Value, result: ir.RankedTensorType, **attrs) -> ir.Value:
    """Builds `torchtpu.<name>` on a reference at the current insertion point."""
    from ..dialect.view_ops import build_view

    return build_view(name, source, result, **attrs)


def load(ref: ir.Value) -> ir.Value:
    return ir.Operation.create("torchtpu.load", results=[ref_tensor_type(ref.type)], operands=[ref]).result


def store(ref: ir.Value, value: ir.Value) -> None:
    ir.Operation.create("torchtpu.store", results=[], operands=[ref, value])


def alloc(value: ir.Value) -> ir.Value:
    return ir.Operation.create("torchtpu.alloc", results=[make_ref_type(ir.RankedTensorType(value.type))],
                               operands=[value]).result


def _as_stored(value: ir.Value, target: ir.RankedTensorType) -> ir.Value:
    """`value` converted to the written tensor's dtype (and broadcast to its shape): an
    in-place op keeps its destination's dtype, whatever the out-of-place op promoted to."""
    from ..dtypes import dtype_of

    value = convert(value, dtype_of(target))
    if shape_of(value) != list(target.shape):
        value = broadcast_to(value, list(target.shape))
    return value


# In-place ops whose out-of-place form is not found by name (ATen names it otherwise).
_RENAMED_COUNTERPARTS = {
    "aten::normal_.default": "normal_functional.default",
    "aten::bernoulli_.float": "bernoulli.p",
    # Python's in-place shift operators (`t <<= 2`).
    "aten::__ilshift__.Scalar": "__lshift__.Scalar",
    "aten::__ilshift__.Tensor": "__lshift__.Tensor",
    "aten::__irshift__.Scalar": "__rshift__.Scalar",
    "aten::__irshift__.Tensor": "__rshift__.Tensor",
}


def functional_counterpart(target) -> Any:
    """The out-of-place overload computing what an in-place / out= op writes, or None."""
    schema = _schema(target)
    if schema is None:
        return None
    renamed = _RENAMED_COUNTERPARTS.get(f"{schema.name}.{target._overloadname}")
    if renamed is not None:
        packet, overload = renamed.split(".")
        return getattr(getattr(aten, packet), overload)
    name = schema.name.split("::", 1)[-1]
    if name.endswith("_"):
        # In place: the overload taking the same arguments without writing `self`. ATen
        # mostly gives it the same overload name, but not always: `pow_.Scalar` is
        # `pow.Tensor_Scalar` (`pow.Scalar` takes a number as its base), `floor_divide_.Tensor`
        # is `floor_divide.default`.
        name, outs = name[:-1], []
    else:
        outs = [a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write]
        if not outs:
            return None
    wanted = [(a.name, str(a.type)) for a in schema.arguments if a.name not in outs]
    packet = getattr(aten, name, None)
    if packet is None:
        return None
    same_name = [target._overloadname] if target._overloadname in packet.overloads() else []
    for candidate in same_name + packet.overloads():
        op = getattr(packet, candidate)
        args = [(a.name, str(a.type)) for a in op._schema.arguments]
        if args == wanted and not written_args(op):
            return op
    return None


def _fake_meta(op, args, kwargs) -> Any:
    """The result metadata of `op` on the FX arguments' `meta['val']` (fake tensors)."""
    from torch._guards import detect_fake_mode
    from torch._subclasses.fake_tensor import FakeTensorMode

    def val(x):
        return x.meta.get("val") if isinstance(x, torch.fx.Node) else x

    vals = torch.fx.node.map_arg((args, kwargs), val)
    leaves = [v for v in pytree.tree_leaves(vals) if isinstance(v, torch.Tensor)]
    mode = detect_fake_mode(leaves) or FakeTensorMode(allow_non_fake_inputs=True)
    with mode:
        fake = pytree.tree_map(lambda v: mode.from_tensor(v) if isinstance(v, torch.Tensor)
                               and not isinstance(v, torch._subclasses.FakeTensor) else v, vals)
        return op(*fake[0], **fake[1])


class MutationImporter:
    """The non-functional half of `FxImporter`: decides which nodes are references and
    lowers views of references, writes, and reads."""

    def __init__(self, importer, graph: torch.fx.Graph) -> None:
        self.importer = importer
        self.root, self.written = _analyze(graph)
        for node in self.written:
            if node.op == "get_attr":
                raise LoweringError(
                    "the graph writes a constant/attribute tensor in place; lift it to a graph "
                    "input or use functional import", node)

    # -- placeholders --------------------------------------------------------------------
    def is_ref_input(self, node: torch.fx.Node) -> bool:
        return node in self.written

    def input_type(self, node: torch.fx.Node, tensor: ir.RankedTensorType) -> ir.Type:
        return make_ref_type(tensor) if node in self.written else tensor

    def wrap_input(self, node: torch.fx.Node, arg: ir.Value) -> Any:
        return RefHandle(arg, node) if node in self.written else arg

    # -- reads ---------------------------------------------------------------------------
    @staticmethod
    def read(value: Any) -> Any:
        """The current value of a reference (a `torchtpu.load` here); values pass through."""
        if isinstance(value, RefHandle):
            return load(value.value)
        if isinstance(value, tuple) and any(isinstance(v, RefHandle) for v in value):
            return tuple(MutationImporter.read(v) for v in value)
        return value

    # -- nodes ---------------------------------------------------------------------------
    def lower(self, node: torch.fx.Node) -> Any:
        """Lowers `node` when it involves references; returns NotImplemented otherwise
        (the functional path then lowers it)."""
        if node.op != "call_function":
            return NotImplemented
        env = self.importer.env
        target = node.target
        if target is operator_getitem:
            src = env.get(node.args[0])
            if isinstance(src, tuple) and isinstance(src[node.args[1]], RefHandle):
                return src[node.args[1]]
            return NotImplemented
        if written_args(target):
            return self._lower_write(node)
        if target in METADATA_INPLACE:
            return self._lower_metadata_inplace(node)
        if is_view(target) and isinstance(env.get(node.args[0]), RefHandle):
            return self._lower_view(node, env[node.args[0]])
        if self.root.get(node) is node and node in self.written:
            # A tensor created here and written later: new storage holding its value.
            value = self.importer.lower_functional(node)
            with node_location(node):
                return RefHandle(alloc(value), node)
        return NotImplemented

    def _lower_metadata_inplace(self, node: torch.fx.Node) -> Any:
        """`t_`, `transpose_`, `squeeze_`, ...: the tensor becomes a view of its old self.
        Later FX uses name this node, so it is the out-of-place view; a graph input's
        metadata cannot be changed for the caller, so that is rejected."""
        source = node.args[0]
        if isinstance(source, torch.fx.Node) and self.root.get(source) is not None \
                and self.root[source].op == "placeholder":
            raise UnsupportedOpError(
                "changes the shape/strides of a graph input in place, which a compiled graph cannot "
                "do for the caller; use the out-of-place view (e.g. x = x.t())", node)
        if isinstance(self.importer.env.get(source), RefHandle):
            return self._lower_view(node, self.importer.env[source])
        functional = functional_counterpart(node.target)
        lowering = LOWERINGS.get(functional) if functional is not None else None
        if lowering is None:
            raise UnsupportedOpError(f"no lowering for the out-of-place view {functional}", node)
        loc = node_location(node)
        args = torch.fx.node.map_arg(node.args, lambda n: self.read(self.importer.env[n]))
        kwargs = torch.fx.node.map_arg(node.kwargs, lambda n: self.read(self.importer.env[n]))
        with loc:
            ctx = self.importer.lowering_context(node, loc)
            if self.importer.dynamic is not None and self.importer.dynamic.touches_dynamic(node):
                require_padding_as_is(lowering, ctx)
            result = lowering.fn(ctx, *args, **kwargs)
        if isinstance(result, (ir.OpView, ir.Operation)):
            result = result.results[0] if isinstance(result, ir.Operation) else result.result
        return result

    def _lower_write(self, node: torch.fx.Node) -> Any:
        """An op writing one tensor, or one list of tensors (`_foreach_*_`): its
        out-of-place counterpart's result(s) are stored into the written reference(s)."""
        target = node.target
        names = written_args(target)
        bound = _bind(target, node)
        if len(names) != 1:
            raise UnsupportedOpError(
                f"writes {len(names)} arguments ({', '.join(names)}); non-functional import supports "
                "ops that write one tensor or one list of tensors", node)
        written = bound.get(names[0])
        dest_nodes = [written] if isinstance(written, torch.fx.Node) else list(written or [])
        dests = [self.importer.env.get(n) for n in dest_nodes]
        if not dests or not all(isinstance(d, RefHandle) for d in dests):
            raise LoweringError("internal error: written argument is not a reference; please report this", node)
        functional = functional_counterpart(target)
        lowering = LOWERINGS.get(functional) if functional is not None else None
        if lowering is None:
            raise UnsupportedOpError(
                f"no out-of-place counterpart with a lowering ({functional or 'none found'}) for this "
                "in-place/out= op", node)
        out_name = names[0] if not target._schema.name.endswith("_") else None
        args = tuple(a for a, s in zip(node.args, target._schema.arguments) if s.name != out_name)
        kwargs = {k: v for k, v in node.kwargs.items() if k != out_name}
        meta = _fake_meta(functional, args, kwargs)
        loc = node_location(node)
        values_args = torch.fx.node.map_arg(args, lambda n: self.read(self.importer.env[n]))
        values_kwargs = torch.fx.node.map_arg(kwargs, lambda n: self.read(self.importer.env[n]))
        with loc:
            try:
                # The counterpart's result metadata may differ from the in-place op's
                # (type promotion): the record carries the counterpart's.
                ctx = self.importer.lowering_context(node, loc, OpRecord.of_node(node, meta, use_node_val=False))
                if self.importer.dynamic is not None and self.importer.dynamic.touches_dynamic(node):
                    require_padding_as_is(lowering, ctx)
                result = lowering.fn(ctx, *values_args, **values_kwargs)
            except LoweringError:
                raise
            except (ir.MLIRError, ValueError, TypeError, IndexError, NotImplementedError) as err:
                raise LoweringError(f"lowering of {functional} failed: {type(err).__name__}: {err}", node) from err
            if isinstance(result, (ir.OpView, ir.Operation)):
                result = result.operation.results if len(result.operation.results) != 1 else result.operation.result
            values = list(result) if isinstance(result, (list, tuple)) else [result]
            if len(values) != len(dests):
                raise UnsupportedOpError(
                    f"{functional} gives {len(values)} results for {len(dests)} written tensors", node)
            for dest, value in zip(dests, values):
                store(dest.value, _as_stored(value, ref_tensor_type(dest.value.type)))
        return dests[0] if isinstance(written, torch.fx.Node) else tuple(dests)

    def _lower_view(self, node: torch.fx.Node, source: RefHandle) -> Any:
        val = node.meta.get("val")
        with node_location(node):
            if isinstance(val, (list, tuple)):
                return tuple(self._view_piece(node, source, i, v) for i, v in enumerate(val))
            return RefHandle(self._view(node, source, val), source.root)

    def _view_piece(self, node, source: RefHandle, index: int, val) -> RefHandle:
        """Element `index` of a multi-result view (split, unbind, chunk)."""
        target = node.target
        src_shape = [int(s) for s in ref_tensor_type(source.value.type).shape]
        result = tensor_type(val.shape, val.dtype)
        if target in (aten.unbind.int,):
            dim = _norm(node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0), len(src_shape))
            return RefHandle(view_op("select", source.value, result, dim=dim, index=index), source.root)
        if target in (aten.split.Tensor, aten.split_with_sizes.default, aten.chunk.default):
            dim = node.args[2] if len(node.args) > 2 else node.kwargs.get("dim", 0)
            dim = _norm(dim, len(src_shape))
            metas = node.meta["val"]
            start = sum(int(m.shape[dim]) for m in metas[:index])
            return RefHandle(view_op("slice", source.value, result, dim=dim, start=start,
                                     limit=start + int(val.shape[dim]), step=1), source.root)
        raise UnsupportedOpError("multi-result view of a written tensor is not supported", node)

    def _view(self, node: torch.fx.Node, source: RefHandle, val: torch.Tensor) -> ir.Value:
        target, args = node.target, node.args
        src = source.value
        src_type = ref_tensor_type(src.type)
        shape = [int(s) for s in src_type.shape]
        rank = len(shape)
        result = tensor_type(val.shape, val.dtype)
        kw = node.kwargs
        if target is aten.slice.Tensor:
            dim = _norm(args[1] if len(args) > 1 else kw.get("dim", 0), rank)
            start = args[2] if len(args) > 2 else kw.get("start")
            end = args[3] if len(args) > 3 else kw.get("end")
            step = args[4] if len(args) > 4 else kw.get("step", 1)
            from ..lowering.view_like import _slice_bounds

            start, end = _slice_bounds(shape[dim], start, end)
            return view_op("slice", src, result, dim=dim, start=start, limit=max(start, end), step=int(step))
        if target is aten.narrow.default:
            dim = _norm(args[1], rank)
            start = args[2] + shape[dim] if args[2] < 0 else args[2]
            return view_op("slice", src, result, dim=dim, start=start, limit=start + args[3], step=1)
        if target is aten.select.int:
            dim = _norm(args[1], rank)
            index = args[2] + shape[dim] if args[2] < 0 else args[2]
            return view_op("select", src, result, dim=dim, index=index)
        if target is aten.permute.default:
            return view_op("permute", src, result, permutation=[_norm(d, rank) for d in args[1]])
        if target in (aten.t.default, aten.t_.default, aten.transpose.int, aten.transpose_.default,
                      aten.swapdims_.default, aten.swapaxes_.default):
            if rank < 2:
                return view_op("alias", src, result)
            d0, d1 = (0, 1) if target in (aten.t.default, aten.t_.default) else (_norm(args[1], rank), _norm(args[2], rank))
            perm = list(range(rank))
            perm[d0], perm[d1] = perm[d1], perm[d0]
            return view_op("permute", src, result, permutation=perm)
        if target in (aten.view.default, aten._unsafe_view.default, aten.reshape.default):
            return view_op("reshape", src, result)
        if target is aten.expand.default:
            return view_op("expand", src, result)
        if target in (aten.squeeze.default, aten.squeeze.dim, aten.squeeze.dims, aten.squeeze_.default,
                      aten.squeeze_.dim, aten.squeeze_.dims):
            if target in (aten.squeeze.default, aten.squeeze_.default):
                dims = [i for i, s in enumerate(shape) if s == 1]
            else:
                given = args[1] if isinstance(args[1], (list, tuple)) else [args[1]]
                dims = sorted({_norm(d, rank) for d in given if shape[_norm(d, rank)] == 1})
            return view_op("squeeze", src, result, dims=dims)
        if target in (aten.unsqueeze.default, aten.unsqueeze_.default):
            return view_op("unsqueeze", src, result, dim=_norm(args[1], rank + 1))
        if target is aten.diagonal.default:
            offset = args[1] if len(args) > 1 else kw.get("offset", 0)
            d1 = _norm(args[2] if len(args) > 2 else kw.get("dim1", 0), rank)
            d2 = _norm(args[3] if len(args) > 3 else kw.get("dim2", 1), rank)
            return view_op("diagonal", src, result, offset=offset, dim1=d1, dim2=d2)
        if target is aten.unfold.default:
            return view_op("unfold", src, result, dimension=_norm(args[1], max(rank, 1)), size=args[2], step=args[3])
        if target in (aten.alias.default, aten.detach.default, aten.detach_.default, aten.lift_fresh.default):
            return view_op("alias", src, result)
        if target is aten.view.dtype:
            return view_op("view_dtype", src, result)
        # Any other view (as_strided included): address the root's storage with the
        # strides PyTorch computed, which needs a contiguous root.
        return self._as_strided(node, source, val, result)

    def _as_strided(self, node, source: RefHandle, val, result) -> ir.Value:
        root_val = source.root.meta.get("val")
        if not isinstance(root_val, torch.Tensor) or not root_val.is_contiguous() or root_val.storage_offset() != 0:
            raise UnsupportedOpError(
                f"view {node.target} of a written tensor whose storage is not contiguous cannot be "
                "expressed; make the tensor contiguous first", node)
        root_ref = self.importer.env[source.root]
        return view_op("as_strided", root_ref.value, result, strides=[int(s) for s in val.stride()],
                       storage_offset=int(val.storage_offset()))
