"""FX GraphModule (ATen IR, as aot_autograd or make_fx produce it) -> MLIR module with
`func.func @main`, built from the lowering table."""

from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx
import torch.utils._pytree as pytree

from ..context import func, ir, make_context, stablehlo
from ..lowering import LOWERINGS, LoweringContext, LoweringError, UnsupportedOpError
from ..lowering.helpers import array_constant
from ..dtypes import dtype_of, tensor_type
from .locations import node_location

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


@dataclass(frozen=True)
class OutputSpec:
    """One leaf of the graph's output: result `index` of @main, or a constant."""

    kind: str  # "tensor" | "constant"
    index: int = -1
    value: Any = None


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


def is_supported(node: torch.fx.Node) -> bool:
    """Whether the importer can lower `node` (used to partition graphs)."""
    if node.op != "call_function":
        return True
    if node.target is torch.ops.higher_order.with_effects:
        return node.args[1] in LOWERINGS
    return node.target in LOWERINGS or node.target is operator.getitem or node.target in _PYTHON_OPERATORS


class FxImporter:
    def __init__(self, gm: torch.fx.GraphModule, context: ir.Context | None = None, func_name: str = "main",
                 functional: bool = True):
        self.gm = gm
        self.functional = functional
        self.mutation = None  # MutationImporter in non-functional mode
        self.context = context or make_context()
        self.func_name = func_name
        self.env: dict[torch.fx.Node, Any] = {}
        self._block: ir.Block | None = None
        self._rng_state: ir.Value | None = None

    # -- random numbers: a threaded rng_bit_generator state seeded by an extra input -------
    def random_bits(self, shape, bits: int) -> ir.Value:
        """Random `ui{bits}` values of `shape`, advancing the graph's RNG state."""
        from ..dtypes import tensor_type as _tt

        state_type = _tt([2], torch.uint64)
        if self._rng_state is None:
            self._rng_state = self._block.add_argument(state_type, ir.Location.name("rng_state"))
        unsigned = {32: torch.uint32, 64: torch.uint64}[bits]
        algorithm = ir.Attribute.parse("#stablehlo<rng_algorithm DEFAULT>")
        op = stablehlo.RngBitGeneratorOp(state_type, _tt(list(shape), unsigned), algorithm, self._rng_state)
        self._rng_state = op.results[0]
        return op.results[1]

    def run(self) -> ImportedGraph:
        graph = self.gm.graph
        placeholders = [n for n in graph.nodes if n.op == "placeholder"]
        with self.context, ir.Location.unknown():
            inputs = [self._input_spec(n) for n in placeholders]
            module = ir.Module.create()
            arg_types = [tensor_type(spec.shape, spec.dtype) for spec in inputs]
            if not self.functional:
                from .mutation import MutationImporter

                self.mutation = MutationImporter(self, graph)
                arg_types = [self.mutation.input_type(n, t) for n, t in zip(placeholders, arg_types)]
            with ir.InsertionPoint(module.body):
                fn = func.FuncOp(self.func_name, ir.FunctionType.get(arg_types, []))
            arg_locs = [ir.Location.name(n.name) for n in placeholders]
            block = fn.body.blocks.append(*arg_types, arg_locs=arg_locs)
            self._block = block
            for node, arg in zip(placeholders, block.arguments):
                self.env[node] = arg if self.mutation is None else self.mutation.wrap_input(node, arg)
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
                        for value in leaves:
                            if isinstance(value, ir.Value):
                                outputs.append(OutputSpec("tensor", len(results)))
                                results.append(value)
                            else:
                                outputs.append(OutputSpec("constant", value=value))
                        with ir.Location.unknown():
                            func.ReturnOp(results)
                        break
                    count += 1
                    self.env[node] = self._lower(node)
            if self._rng_state is not None:
                inputs.append(InputSpec("rng_state", (2,), torch.uint64, role="rng_state"))
            fn.attributes["function_type"] = ir.TypeAttr.get(
                ir.FunctionType.get([a.type for a in block.arguments], [r.type for r in results])
            )
        mutated = [i for i, n in enumerate(placeholders) if self.mutation is not None and self.mutation.is_ref_input(n)]
        return ImportedGraph(module, self.context, inputs, outputs, tree, self.func_name, len(results), count, mutated)

    # -- nodes -----------------------------------------------------------------------------
    def _input_spec(self, node: torch.fx.Node) -> InputSpec:
        val = node.meta.get("val", node.meta.get("example_value"))
        if isinstance(val, torch.Tensor):
            return InputSpec(node.name, tuple(int(s) for s in val.shape), val.dtype)
        if val is None:
            raise LoweringError("graph input has no shape metadata (meta['val']); trace with make_fx or aot_autograd", node)
        return InputSpec(node.name, (), _scalar_dtype(val), is_scalar=True)

    def _read(self, node: torch.fx.Node):
        value = self.env[node]
        return value if self.mutation is None else self.mutation.read(value)

    def _map_arg(self, arg):
        return torch.fx.node.map_arg(arg, self._read)

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
        args = self._map_arg(node.args)
        kwargs = self._map_arg(node.kwargs)
        target = node.target
        if target is operator.getitem:
            return args[0][args[1]]
        if target is torch.ops.higher_order.with_effects:
            return self._lower_with_effects(node, args, kwargs)
        lowering = LOWERINGS.get(target)
        if lowering is None:
            if target in _PYTHON_OPERATORS and not any(isinstance(a, ir.Value) for a in pytree.tree_leaves((args, kwargs))):
                return target(*args, **kwargs)
            raise UnsupportedOpError("no lowering registered for this op", node)
        loc = node_location(node)
        with loc:
            try:
                result = lowering.fn(LoweringContext(node, loc, self), *args, **kwargs)
            except LoweringError as err:
                if err.node is None:
                    raise LoweringError(err.reason, node) from err
                raise
            except (ir.MLIRError, ValueError, TypeError, IndexError, NotImplementedError) as err:
                raise LoweringError(f"lowering failed: {type(err).__name__}: {err}", node) from err
        result = _normalize_result(result)
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
        ctx = _InnerContext(node, node_location(node), self, val[1] if isinstance(val, (tuple, list)) else None)
        with ctx.loc:
            result = lowering.fn(ctx, *inner_args, **kwargs)
        return (token, _normalize_result(result))

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


class _InnerContext(LoweringContext):
    """The context of an op wrapped in a higher-order op: its metadata is part of the
    wrapper node's."""

    def __init__(self, node, loc, importer, inner_val) -> None:
        super().__init__(node, loc, importer)
        self._inner_val = inner_val

    def meta(self, index=None):
        return self._inner_val if index is None else self._inner_val[index]


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


def import_graph(gm: torch.fx.GraphModule, *, context: ir.Context | None = None, func_name: str = "main",
                 functional: bool = True) -> ImportedGraph:
    """Imports an ATen-level FX graph whose nodes carry `meta['val']`. Raises
    `LoweringError` (naming the op and the user's source line) when a node cannot be
    lowered. `functional=False` accepts views and in-place / out= ops (written storage
    becomes `!torchtpu.ref` references; see compiler/importer/mutation.py)."""
    return FxImporter(gm, context, func_name, functional).run()
