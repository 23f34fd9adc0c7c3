"""FX GraphModule (ATen IR, as aot_autograd or make_fx produce it) -> MLIR module with
`func.func @main`, built from the lowering table."""

from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import Any

import sympy
import torch
import torch.fx
import torch.utils._pytree as pytree

from .. import ir as hlo
from ..context import func, ir, make_context, stablehlo
from ..lowering import LOWERINGS, DynamicFallback, LoweringContext, LoweringError, UnsupportedOpError, dynamic_lowering
from ..lowering.helpers import array_constant
from ..lowering.registry import OpRecord, require_padding_as_is
from ..lowering.symsize import SymSize, dynamic_import
from ..dtypes import dtype_of, tensor_type
from ..process_groups import ProcessGroups
from .dynamic import BOUNDS_ATTR, DynamicShapes, bounds_attr, each_tensor_result, has_symbolic_shapes
from ..fx_locations import node_location
from .random_state import RandomState
from .storage_views import rebase_storage_views
from ..lowering.row_layout import _VIEWS as _VIEW_TARGETS, RowLayout, result_keeps_layout, row_wise_operands

# Python operators that appear in FX graphs on static values (sizes, scalars).
_PYTHON_OPERATORS = {
    operator.add, operator.sub, operator.mul, operator.truediv, operator.floordiv,
    operator.mod, operator.pow, operator.neg, operator.eq, operator.ne, operator.lt,
    operator.le, operator.gt, operator.ge, operator.and_, operator.or_, operator.not_,
    torch.sym_ite, torch.sym_max, torch.sym_min, torch.sym_not, torch.sym_float, torch.sym_int,
}


@dataclass(frozen=True)
class InputSpec:
    """One argument of @main: a tensor placeholder, or a Python scalar passed as a 0-d
    tensor."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    is_scalar: bool = False
    # "input": a graph placeholder. "rng_state": a tensor<2xui64> seed the caller passes
    # on every call (added when the graph has random ops; it is always the last input).
    role: str = "input"
    # Dims of a symbolic size (bounded dynamism): `shape` holds their bounds.
    dynamic_dims: tuple[int, ...] = ()


@dataclass(frozen=True)
class OutputSpec:
    """One leaf of the graph's output: result `index` of @main, or a constant."""

    kind: str  # "tensor" | "constant" | "symint" (a symbolic size: a 0-d i64 result)
    index: int = -1
    value: Any = None
    dynamic_dims: tuple[int, ...] = ()  # dims returned padded to their bounds


@dataclass
class ImportedGraph:
    module: ir.Module
    context: ir.Context
    inputs: list[InputSpec]
    outputs: list[OutputSpec]
    output_tree: Any  # pytree spec of the graph's output structure
    func_name: str = "main"
    num_results: int = 0
    node_count: int = field(default=0)
    # Non-functional import: positions of the inputs written in place (reference
    # arguments of @main until torchtpu-inverse-views turns them into aliased results).
    mutated_inputs: list[int] = field(default_factory=list)

    def text(self, debug_info: bool = False) -> str:
        return self.module.operation.get_asm(enable_debug_info=debug_info)


def _scalar_dtype(val) -> torch.dtype:
    if isinstance(val, (bool, torch.SymBool)):
        return torch.bool
    if isinstance(val, (int, torch.SymInt)):
        return torch.int64
    if isinstance(val, (float, torch.SymFloat)):
        return torch.float64
    raise TypeError(f"unsupported graph input of type {type(val).__name__}")


def _fetch_attr(gm: torch.fx.GraphModule, target: str):
    obj: Any = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def cond_branches(node: torch.fx.Node) -> dict[str, torch.fx.GraphModule]:
    """A `higher_order.cond` node's two branch graphs by attribute name (none when the
    graph has no owning module to read them from)."""
    owner = node.graph.owning_module
    return {} if owner is None else {b.target: _fetch_attr(owner, b.target) for b in node.args[1:3]}


def is_supported(node: torch.fx.Node) -> bool:
    """Whether the importer can lower `node` (used to partition graphs)."""
    if node.op != "call_function":
        return True
    if node.target is torch.ops.higher_order.with_effects:
        return node.args[1] in LOWERINGS
    if node.target is torch.ops.higher_order.cond:
        branches = cond_branches(node)
        return len(branches) == 2 and all(is_supported(n) for b in branches.values() for n in b.graph.nodes)
    return node.target in LOWERINGS or node.target is operator.getitem or node.target in _PYTHON_OPERATORS


class FxImporter:
    def __init__(
        self,
        gm: torch.fx.GraphModule,
        context: ir.Context | None = None,
        func_name: str = "main",
        symbol_bounds=None,
        functional: bool = True,
        process_groups: ProcessGroups | None = None,
    ):
        self.gm = gm
        self.functional = functional
        # What the frontend found out about the process groups the collectives name.
        self.process_groups = process_groups or ProcessGroups()
        self.mutation = None  # MutationImporter in non-functional mode (importer/mutation.py)
        # Bounded dynamism: symbolic sizes lower at their bounds (importer/dynamic.py).
        self.dynamic: DynamicShapes | None = None
        if has_symbolic_shapes(gm):
            if symbol_bounds is None:
                raise LoweringError(
                    "the graph has symbolic (dynamic) sizes; import it with symbol_bounds "
                    "(the bound of each size symbol)"
                )
            self.dynamic = DynamicShapes(gm, symbol_bounds)
        # Row-interleaved values (row_layout.py) and their compacted forms.
        self.interleaved: dict[torch.fx.Node, RowLayout] = {}
        self._compacted: dict[torch.fx.Node, ir.Value] = {}
        self._arg_override: dict[torch.fx.Node, ir.Value] = {}
        self.context = context or make_context()
        self.func_name = func_name
        self.env: dict[torch.fx.Node, Any] = {}
        self._block: ir.Block | None = None
        self._random = RandomState()

    # -- random numbers: a threaded rng_bit_generator state seeded by an extra input -------
    def random_bits(self, shape, bits: int) -> ir.Value:
        """Random `ui{bits}` values of `shape`, advancing the graph's RNG state."""
        return self._random.random_bits(shape, bits)

    def lowering_context(self, node: torch.fx.Node, loc: ir.Location, record: OpRecord | None = None) -> LoweringContext:
        """The context a rule lowering `node` gets: the graph-level facts it may use
        (dynamic sizes, process groups, row layouts, random bits) as typed fields."""
        return LoweringContext(
            node,
            loc,
            record=record,
            random_source=self,
            dynamic=self.dynamic,
            process_groups=self.process_groups,
            row_layouts=self,
        )

    def run(self) -> ImportedGraph:
        if self.dynamic is None:
            return self._run()
        with self.dynamic.bound_metas():
            return self._run()

    def _arg_type(self, spec: InputSpec) -> ir.Type:
        t = tensor_type(spec.shape, spec.dtype)
        if not spec.dynamic_dims:
            return t
        shape = [ir.ShapedType.get_dynamic_size() if d in spec.dynamic_dims else s for d, s in enumerate(spec.shape)]
        return ir.RankedTensorType.get(shape, t.element_type)

    def _entry_values(self, fn, placeholders, inputs, block) -> None:
        """Binds placeholders to block arguments; a dynamic argument is read at its
        bound with its sizes attached, and its size symbols become known."""
        dyn = self.dynamic
        for node, arg in zip(placeholders, block.arguments):
            self.env[node] = arg
        if dyn is None:
            return
        for node, spec, arg in zip(placeholders, inputs, block.arguments):
            val = dyn.symbolic_val(node)
            if not spec.dynamic_dims:
                continue
            with node_location(node):
                value = arg
                for d in spec.dynamic_dims:
                    size = stablehlo.GetDimensionSizeOp(arg, d).result
                    expr = val.shape[d].node.expr
                    if isinstance(expr, sympy.Symbol):
                        dyn.register(expr, stablehlo.ConvertOp(tensor_type([], torch.int64), size).result)
                    value = stablehlo.SetDimensionSizeOp(value, size, d, results=[tensor_type(spec.shape, spec.dtype)]).result
                self.env[node] = value
        for node, spec, arg in zip(placeholders, inputs, block.arguments):
            val = dyn.symbolic_val(node)
            if isinstance(val, torch.SymInt) and not isinstance(val.node.expr, sympy.Integer):
                # A size passed in (a symbol, or an expression an eager part computed,
                # such as floor(1.5*s0)): its value is the argument.
                dyn.register(val.node.expr, arg)
            if isinstance(val, torch.SymInt):
                self.env[node] = dyn.sym_size(val, node)
        attrs = [
            ir.DictAttr.get({BOUNDS_ATTR: bounds_attr([b if d in spec.dynamic_dims else -1 for d, b in enumerate(spec.shape)])})
            if spec.dynamic_dims else ir.DictAttr.get({})
            for spec in inputs
        ]
        fn.arg_attrs = ir.ArrayAttr.get(attrs)

    def _output_leaf(self, node, value, results: list, outputs: list, source) -> None:
        dyn = self.dynamic
        if isinstance(value, SymSize):
            outputs.append(OutputSpec("symint", len(results)))
            results.append(value.value)
        elif isinstance(value, ir.Value):
            dims: tuple[int, ...] = ()
            if dyn is not None and isinstance(source, torch.fx.Node):
                if source in self.interleaved:
                    value = self.compacted(source)
                val = dyn.symbolic_val(source)
                if isinstance(val, torch.Tensor) and dyn.dynamic_dims(val):
                    dims = tuple(dyn.dynamic_dims(val))
                    value = dyn.mark_result(value, val, source)
            outputs.append(OutputSpec("tensor", len(results), dynamic_dims=dims))
            results.append(value)
        else:
            outputs.append(OutputSpec("constant", value=value))

    def _run(self) -> ImportedGraph:
        graph = self.gm.graph
        placeholders = [n for n in graph.nodes if n.op == "placeholder"]
        with self.context, ir.Location.unknown():
            inputs = [self._input_spec(n) for n in placeholders]
            module = ir.Module.create()
            arg_types = [self._arg_type(spec) for spec in inputs]
            if not self.functional:
                from .mutation import MutationImporter

                self.mutation = MutationImporter(self, graph)
                arg_types = [self.mutation.input_type(n, t) for n, t in zip(placeholders, arg_types)]
            with ir.InsertionPoint(module.body):
                fn = func.FuncOp(self.func_name, ir.FunctionType.get(arg_types, []))
            arg_locs = [ir.Location.name(n.name) for n in placeholders]
            block = fn.body.blocks.append(*arg_types, arg_locs=arg_locs)
            self._block = block
            self._random.block = block
            with ir.InsertionPoint(block):
                self._entry_values(fn, placeholders, inputs, block)
            if self.mutation is not None:
                for node, arg in zip(placeholders, block.arguments):
                    if self.mutation.is_ref_input(node):
                        self.env[node] = self.mutation.wrap_input(node, arg)
            outputs: list[OutputSpec] = []
            results: list[ir.Value] = []
            tree = None
            count = 0
            with ir.InsertionPoint(block):
                for node in graph.nodes:
                    if node.op == "placeholder":
                        continue
                    if node.op == "output":
                        # Map nodes to their values first, so a multi-result node
                        # returned without getitem flattens into its results.
                        structure = torch.fx.node.map_arg(node.args[0], self._read)
                        leaves, tree = pytree.tree_flatten(structure)
                        sources = pytree.tree_leaves(node.args[0]) if self.dynamic is not None else [None] * len(leaves)
                        if len(sources) != len(leaves):
                            sources = [None] * len(leaves)
                        for value, source in zip(leaves, sources):
                            self._output_leaf(node, value, results, outputs, source)
                        with ir.Location.unknown():
                            func.ReturnOp(results)
                        break
                    count += 1
                    self.env[node] = self._lower(node)
            if self._random.state is not None:
                inputs.append(InputSpec("rng_state", (2,), torch.uint64, role="rng_state"))
                if "arg_attrs" in fn.attributes:
                    # The seed argument is added while lowering, after the inputs' attributes
                    # (bounds) were set: one entry per argument keeps the function valid.
                    attrs = list(ir.ArrayAttr(fn.attributes["arg_attrs"]))
                    attrs += [ir.DictAttr.get({})] * (len(block.arguments) - len(attrs))
                    fn.attributes["arg_attrs"] = ir.ArrayAttr.get(attrs)
            fn.attributes["function_type"] = ir.TypeAttr.get(
                ir.FunctionType.get([a.type for a in block.arguments], [r.type for r in results])
            )
        mutated = [i for i, n in enumerate(placeholders) if self.mutation is not None and self.mutation.is_ref_input(n)]
        return ImportedGraph(module, self.context, inputs, outputs, tree, self.func_name, len(results), count, mutated)

    # -- nodes -----------------------------------------------------------------------------
    def _input_spec(self, node: torch.fx.Node) -> InputSpec:
        val = node.meta.get("val", node.meta.get("example_value"))
        if isinstance(val, torch.Tensor):
            dims = tuple(self.dynamic.dynamic_dims(self.dynamic.symbolic_val(node))) if self.dynamic else ()
            return InputSpec(node.name, tuple(int(s) for s in val.shape), val.dtype, dynamic_dims=dims)
        if val is None:
            raise LoweringError("graph input has no shape metadata (meta['val']); trace with make_fx or aot_autograd", node)
        return InputSpec(node.name, (), _scalar_dtype(val), is_scalar=True)

    def _read(self, node: torch.fx.Node):
        value = self.env[node]
        return value if self.mutation is None else self.mutation.read(value)

    def _map_arg(self, arg):
        override = self._arg_override
        return torch.fx.node.map_arg(arg, lambda n: override[n] if n in override else self._read(n))

    def _lower(self, node: torch.fx.Node):
        if self.mutation is not None:
            result = self.mutation.lower(node)
            if result is not NotImplemented:
                return result
        return self.lower_functional(node)

    def lower_functional(self, node: torch.fx.Node):
        if node.op == "get_attr":
            attr = _fetch_attr(self.gm, node.target)
            if isinstance(attr, torch.Tensor):
                with node_location(node):
                    return array_constant(attr, attr.dtype)
            return attr
        if node.op != "call_function":
            raise UnsupportedOpError(f"FX '{node.op}' nodes are not supported; graphs must be flat ATen graphs", node)
        dyn = self.dynamic
        if dyn is not None:
            symbolic = dyn.symbolic_val(node)
            if isinstance(symbolic, torch.SymInt) and not isinstance(
                symbolic.node.expr, sympy.Integer
            ):
                # A size computed from symbols (sym_size, s0 * 2, ...): its bound for the
                # rules, its run-time value for arithmetic.
                with node_location(node):
                    return dyn.sym_size(symbolic, node)
            if isinstance(symbolic, torch.SymFloat) or any(
                isinstance(v, torch.SymFloat) for v in map(dyn.symbolic_val, node.all_input_nodes)
            ) and not isinstance(node.target, torch._ops.OpOverload):
                # A float computed from sizes (a resampling scale): rules would read it at
                # the bounds. It is computed in eager and passed in as a value.
                raise DynamicFallback(
                    "a float computed from dynamic sizes is not lowered with bounded dynamism; "
                    "it runs in PyTorch eager",
                    node,
                )
            sources = [a for a in node.all_input_nodes if a in self.interleaved]
            row_wise = bool(sources) and row_wise_operands(node, self.interleaved, dyn.symbolic_val)
            if sources and not row_wise:
                self._arg_override = {a: self.compacted(a) for a in sources}
            try:
                result = self._lower_node(node)
            finally:
                self._arg_override = {}
            if node in self.interleaved:
                return result  # a flattening view kept interleaved: no size marks
            if row_wise and node.target not in _VIEW_TARGETS:
                layout = self.interleaved[sources[0]]
                if not result_keeps_layout(node, layout, dyn.symbolic_val):
                    raise LoweringError("internal error: a row-wise op lost its operands' row layout; please report this", node)
                self.interleaved[node] = layout
                return result
            return self._mark_dynamic(node, symbolic, result)
        return self._lower_node(node)

    def compacted(self, node: torch.fx.Node) -> ir.Value:
        """The compact value of an interleaved node (built once, where first needed)."""
        value = self._compacted.get(node)
        if value is None:
            from ..lowering.view_like import compact_rows

            symbolic = self.dynamic.symbolic_val(node)
            loc = node_location(node)
            with loc, dynamic_import():
                ctx = self.lowering_context(node, loc)
                value = compact_rows(ctx, self.env[node], self.interleaved[node], symbolic)
                value = self.dynamic.mark(value, symbolic, node)
            self._compacted[node] = value
        return value

    def _mark_dynamic(self, node, symbolic, result):
        # (`mark` leaves a value without dynamic dims as it is.)
        with node_location(node):
            return each_tensor_result(result, symbolic, lambda r, v: self.dynamic.mark(r, v, node))

    def _lower_node(self, node: torch.fx.Node):
        args = self._map_arg(node.args)
        kwargs = self._map_arg(node.kwargs)
        target = node.target
        if target is operator.getitem:
            return args[0][args[1]]
        if target is torch.ops.higher_order.with_effects:
            return self._lower_with_effects(node, args, kwargs)
        if target is torch.ops.higher_order.cond:
            return self._lower_cond(node, *args)
        lowering = LOWERINGS.get(target)
        if lowering is None:
            if target in _PYTHON_OPERATORS and not any(isinstance(a, ir.Value) for a in pytree.tree_leaves((args, kwargs))):
                return target(*args, **kwargs)
            if target in _PYTHON_OPERATORS and self.dynamic is not None:
                # Arithmetic on a symbolic scalar passed in as a value (a float an eager
                # part computed from sizes).
                raise DynamicFallback("Python arithmetic on a symbolic scalar is not lowered; it runs in PyTorch eager", node)
            raise UnsupportedOpError("no lowering registered for this op", node)
        loc = node_location(node)
        with loc:
            try:
                result = NotImplemented
                if self.dynamic is not None and self.dynamic.touches_dynamic(node):
                    with dynamic_import():
                        result = dynamic_lowering(lowering, self.lowering_context(node, loc), *args, **kwargs)
                elif self.dynamic is not None:
                    with dynamic_import():
                        result = lowering.fn(self.lowering_context(node, loc), *args, **kwargs)
                else:
                    result = lowering.fn(self.lowering_context(node, loc), *args, **kwargs)
            except LoweringError as err:
                if err.node is None:
                    raise type(err)(err.reason, node) from err
                raise
            except (ir.MLIRError, ValueError, TypeError, IndexError, NotImplementedError, RuntimeError) as err:
                # (RuntimeError: PyTorch's own checks a lowering reuses, torch._check and
                # broadcast_shapes, refusing these arguments: the op runs in eager, or is a
                # located error under TORCH_TPU_STRICT, never an internal crash.)
                raise LoweringError(f"lowering failed: {type(err).__name__}: {err}", node) from err
        result = _normalize_result(result)
        if self.dynamic is not None:
            with loc:
                result = self.dynamic.cut_to_bounds(node, result)
        self._check_against_meta(node, result)
        return result

    def _lower_with_effects(self, node: torch.fx.Node, args, kwargs):
        """`with_effects(token, op, *args)`: aot_autograd threads a token through ops with
        side effects to keep their order. XLA programs are ordered by data flow, so the
        token passes through and the op is lowered as usual."""
        token, inner, *inner_args = args
        lowering = LOWERINGS.get(inner)
        if lowering is None:
            raise UnsupportedOpError(f"no lowering registered for {inner} (inside with_effects)", node)
        val = node.meta.get("val")
        inner_val = val[1] if isinstance(val, (tuple, list)) else None
        # The wrapped op's arguments are the wrapper's after the token and the op.
        inner_metas = torch.fx.node.map_arg(tuple(node.args[2:]), _val)
        record = OpRecord(inner, tuple(inner_metas), dict(node.kwargs), inner_val, node.name)
        ctx = self.lowering_context(node, node_location(node), record)
        with ctx.loc:
            if self.dynamic is not None and self.dynamic.touches_dynamic(node):
                require_padding_as_is(lowering, ctx)
            result = lowering.fn(ctx, *inner_args, **kwargs)
        return (token, _normalize_result(result))

    def _lower_cond(self, node: torch.fx.Node, pred, true_branch, false_branch, operands):
        """`torch.cond(pred, true_fn, false_fn, operands)`: a `stablehlo.if` whose regions
        hold the two branch graphs, each imported over the same operands (regions see the
        enclosing values, so the operands pass as they are). A predicate known while
        tracing (a Python bool) imports its branch alone."""
        if not isinstance(pred, ir.Value):
            return self._import_branch(true_branch if pred else false_branch, operands)
        vals = node.meta.get("val")
        with node_location(node):
            if self.dynamic is not None:
                raise DynamicFallback("torch.cond over bounded-dynamic sizes is not lowered", node)
            result_types = [tensor_type(v.shape, v.dtype) for v in vals]
            flag = hlo.reshape(hlo.convert(pred, ir.IntegerType.get_signless(1)), [])
            branch_op = stablehlo.IfOp(result_types, flag)
            for region, graph_module in ((branch_op.true_branch, true_branch), (branch_op.false_branch, false_branch)):
                block = region.blocks.append()
                with ir.InsertionPoint(block):
                    outputs = self._import_branch(graph_module, operands)
                    stablehlo.ReturnOp(outputs)
        return list(branch_op.results)

    def _import_branch(self, graph_module: torch.fx.GraphModule, operands) -> list:
        """The values of a branch graph's outputs, its nodes lowered at the current insertion
        point with its placeholders bound to `operands` (its own attributes read from it)."""
        outer, self.gm = self.gm, graph_module
        try:
            placeholders = [n for n in graph_module.graph.nodes if n.op == "placeholder"]
            for placeholder, value in zip(placeholders, operands):
                self.env[placeholder] = value
            for sub in graph_module.graph.nodes:
                if sub.op == "placeholder":
                    continue
                if sub.op == "output":
                    return [self._read(n) for n in pytree.tree_leaves(sub.args[0])]
                self.env[sub] = self.lower_functional(sub)
        finally:
            self.gm = outer
        raise LoweringError("torch.cond branch graph has no output", None)

    def _check_against_meta(self, node: torch.fx.Node, result) -> None:
        """A lowering must produce exactly the shapes and dtypes PyTorch computed;
        catching a mismatch here names the op instead of failing later in XLA."""
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor) and isinstance(result, ir.Value):
            _check_value(node, result, val)
        elif isinstance(val, (tuple, list)) and isinstance(result, (tuple, list)):
            for r, v in zip(result, val):
                if isinstance(v, torch.Tensor) and isinstance(r, ir.Value):
                    _check_value(node, r, v)


def _val(arg):
    return arg.meta.get("val") if isinstance(arg, torch.fx.Node) else arg


def _check_value(node: torch.fx.Node, value: ir.Value, val: torch.Tensor) -> None:
    t = ir.RankedTensorType(value.type)
    if list(t.shape) != [int(s) for s in val.shape] or dtype_of(t) != val.dtype:
        raise LoweringError(
            f"internal error: lowering produced {t} but PyTorch expects "
            f"{list(val.shape)} {val.dtype}; please report this", node
        )


def _normalize_result(result):
    if isinstance(result, ir.OpView):
        result = result.operation
    if isinstance(result, ir.Operation):
        results = list(result.results)
        return results[0] if len(results) == 1 else tuple(results)
    if isinstance(result, list):
        return tuple(result)
    return result


def import_graph(
    gm: torch.fx.GraphModule,
    *,
    context: ir.Context | None = None,
    func_name: str = "main",
    symbol_bounds=None,
    functional: bool = True,
    process_groups: ProcessGroups | None = None,
) -> ImportedGraph:
    """Imports an ATen-level FX graph whose nodes carry `meta['val']`. Raises
    `LoweringError` (naming the op and the user's source line) when a node cannot be
    lowered. A graph with symbolic sizes needs `symbol_bounds` ({sympy symbol: bound});
    it is lowered at its bounds (importer/dynamic.py). `functional=False` accepts views and
    in-place / out= ops (written storage becomes `!torchtpu.ref` references; see
    compiler/importer/mutation.py). Storage-addressing ops (`as_strided`) are first pointed
    at their input's storage root (importer/storage_views.py). Collectives are lowered
    with `process_groups`, the facts of the groups they name (the frontend builds them:
    `torch_tpu.spmd.process_groups_of(gm)`)."""
    rebase_storage_views(gm)
    return FxImporter(gm, context, func_name, symbol_bounds, functional, process_groups).run()
