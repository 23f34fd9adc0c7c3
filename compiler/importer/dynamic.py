"""Importing graphs with symbolic sizes (bounded dynamism).

PyTorch traces a dynamic dimension as a sympy symbol (`s0`) in the `SymInt`s of node
metadata. The importer lowers such a graph *at its bounds*:

* an entry argument with symbolic dims has type `tensor<?x...>` and a `torchtpu.bounds`
  argument attribute (the bound of each dim, -1 for static dims); its sizes are read with
  `stablehlo.get_dimension_size` and its value is re-typed at its bound with
  `stablehlo.set_dimension_size` (the padded layout, dynamic size attached);
* every rule sees metadata at the bounds (`bound_metas`), so rules build static shapes;
* every result with symbolic dims is re-marked with `set_dimension_size` to its logical
  size, computed from the symbols (`size_value`), so XLA's dynamic padder knows it even
  after ops whose size inference it lacks (reduce_window scans, iota, constants);
* a `SymInt` node becomes a `SymSize`: its bound as an int, its run-time value attached;
* a result with symbolic dims is returned as `tensor<?x...>` through `set_dimension_size`
  (the passes `torchtpu-annotate-bounds` and `torchtpu-materialize-bounds` take it from
  there).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import sympy
import torch
import torch.fx
import torch.utils._pytree as pytree

from torch_tpu.core import attributes

from ..context import ir, stablehlo
from ..dtypes import tensor_type
from ..lowering import DynamicFallback
from .. import ir as hlo
from ..lowering.symsize import SymSize, dynamic_import, static_layout

BOUNDS_ATTR = attributes.BOUNDS
_SYMBOLIC_VAL = "torchtpu_symbolic_val"


def _is_symbolic_int(s) -> bool:
    return isinstance(s, torch.SymInt) and not isinstance(_expr(s), sympy.Integer)


def _expr(s):
    return s.node.expr


def has_symbolic_shapes(gm: torch.fx.GraphModule) -> bool:
    for node in gm.graph.nodes:
        if node.op != "placeholder":
            continue
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor) and any(_is_symbolic_int(s) for s in val.shape):
            return True
        if _is_symbolic_int(val):
            return True
    return False


def graph_symbols(gm: torch.fx.GraphModule) -> dict[sympy.Symbol, Any]:
    """The free symbols of the graph's inputs, each with one SymInt that mentions it (for
    the ShapeEnv and the current hint)."""
    found: dict[sympy.Symbol, Any] = {}
    for node in gm.graph.nodes:
        if node.op != "placeholder":
            continue
        val = node.meta.get("val")
        sizes = list(val.shape) if isinstance(val, torch.Tensor) else [val]
        for s in sizes:
            if _is_symbolic_int(s):
                for sym in _expr(s).free_symbols:
                    found.setdefault(sym, s)
    return found


class DynamicShapes:
    """Symbol bounds and run-time values for one import."""

    def __init__(self, gm: torch.fx.GraphModule, symbol_bounds: Mapping[sympy.Symbol, int]) -> None:
        from torch.utils._sympy.value_ranges import ValueRanges

        self.gm = gm
        self.bounds = dict(symbol_bounds)
        self._ranges = {sym: ValueRanges(0, b) for sym, b in self.bounds.items()}
        self._pinned = pinned_sizes(gm)
        self._bound_of: dict[Any, int] = {}  # sympy expr -> bound (asked per node and result)
        self._values: dict[Any, ir.Value] = {}  # sympy expr -> 0-d i64 value
        self._i32: dict[Any, ir.Value] = {}

    # -- bounds -----------------------------------------------------------------------------
    def bound(self, expr, node: torch.fx.Node | None = None) -> int:
        from torch.utils._sympy.value_ranges import bound_sympy

        if isinstance(expr, (int, sympy.Integer)):
            return int(expr)
        known = self._bound_of.get(expr)
        if known is not None:
            return known
        missing = expr.free_symbols - self._ranges.keys()
        if missing:
            raise DynamicFallback(
                f"no bound for symbolic size(s) {sorted(map(str, missing))} in {expr}: the size "
                "is not derived from an input's size; mark the input dimension dynamic with a "
                "max (torch_tpu.mark_dynamic(x, dim, max=...))",
                node,
            )
        upper = bound_sympy(expr, self._ranges).upper
        value = _finite_int(upper)
        pinned = self._pinned_value(expr)
        if pinned is not None:
            value = pinned if value is None else min(value, pinned)
        if value is None:
            raise DynamicFallback(f"the bound of symbolic size {expr} is not finite ({upper})", node)
        self._bound_of[expr] = value
        return value

    def _pinned_value(self, expr) -> int | None:
        """The constant the guards fix `expr` to (it may differ from a pinned expression
        by a constant: the guard `Eq(s0 + s1, 15)` pins `s0 + s1 + 1` to 16)."""
        if not self._pinned:
            return None
        expanded = sympy.expand(expr)
        for pinned, value in self._pinned.items():
            offset = sympy.expand(expanded - pinned)
            if isinstance(offset, sympy.Integer):
                return value + int(offset)
        return None

    def size_bound(self, s, node=None) -> int:
        return self.bound(_expr(s), node) if _is_symbolic_int(s) else int(s)

    def dynamic_dims(self, val) -> list[int]:
        if not isinstance(val, torch.Tensor):
            return []
        return [d for d, s in enumerate(val.shape) if _is_symbolic_int(s)]

    def touches_dynamic(self, node: torch.fx.Node) -> bool:
        """Whether `node` reads or makes a value with a dynamic (padded) dim, or reads a
        symbolic scalar (a size used as a value): then its lowering must declare what
        padding does to it (lowering/registry.py, `Padding`)."""

        def symbolic(val) -> bool:
            if isinstance(val, torch.Tensor):
                return bool(self.dynamic_dims(val))
            if isinstance(val, (torch.SymInt, torch.SymFloat, torch.SymBool)):
                return not val.node.is_constant() and not isinstance(_expr(val), sympy.Number)
            if isinstance(val, (tuple, list)):
                return any(symbolic(v) for v in val)
            return False

        if any(symbolic(self.symbolic_val(a)) for a in node.all_input_nodes):
            return True
        leaves = pytree.tree_leaves((node.args, node.kwargs))
        return any(symbolic(a) for a in leaves) or symbolic(self.symbolic_val(node))

    def bound_shape(self, val, node=None) -> list[int]:
        return [self.size_bound(s, node) for s in val.shape]

    def _to_bounds(self, val, node):
        if isinstance(val, torch.Tensor):
            if not self.dynamic_dims(val) and not any(_is_symbolic_int(s) for s in val.stride()):
                return val
            shape = self.bound_shape(val, node)
            # Strides follow the padded layout: recompute them for the bound shape in the
            # order of the symbolic strides (a transposed view stays transposed).
            order = sorted(range(val.dim()), key=lambda d: (self._stride_hint(val.stride()[d]), d))
            strides = [0] * val.dim()
            running = 1
            for d in order:
                strides[d] = running
                running *= max(shape[d], 1)
            return torch.empty_strided(shape, strides, dtype=val.dtype, device="meta")
        if isinstance(val, torch.SymInt):
            return self.size_bound(val, node)
        if isinstance(val, (tuple, list)):
            return type(val)(self._to_bounds(v, node) for v in val)
        return val

    @staticmethod
    def _stride_hint(s) -> int:
        if isinstance(s, torch.SymInt):
            hint = s.node.hint if hasattr(s.node, "hint") else None
            return int(hint) if hint is not None else 1 << 40
        return int(s)

    @contextlib.contextmanager
    def bound_metas(self) -> Iterator[None]:
        """Rules read metadata at the bounds while the graph is imported; the symbolic
        metadata is restored afterwards."""
        touched = []
        try:
            for node in self.gm.graph.nodes:
                if "val" not in node.meta:
                    continue
                original = node.meta["val"]
                node.meta[_SYMBOLIC_VAL] = original
                node.meta["val"] = self._to_bounds(original, node)
                touched.append(node)
            yield
        finally:
            for node in touched:
                node.meta["val"] = node.meta.pop(_SYMBOLIC_VAL)

    @staticmethod
    def symbolic_val(node: torch.fx.Node):
        return node.meta.get(_SYMBOLIC_VAL, node.meta.get("val"))

    # -- run-time values -----------------------------------------------------------------
    def register(self, sym, value_i64: ir.Value) -> None:
        self._values.setdefault(sym, value_i64)

    def knows(self, sym) -> bool:
        return sym in self._values

    def size_value(self, expr, node=None) -> ir.Value:
        """The run-time value of a size expression as a 0-d i64 tensor (built at the
        current insertion point, cached)."""
        if isinstance(expr, int):
            expr = sympy.Integer(expr)
        cached = self._values.get(expr)
        if cached is not None:
            return cached
        value = _emit(expr, self._values, node)
        self._values[expr] = value
        return value

    def size_i32(self, expr, node=None) -> ir.Value:
        cached = self._i32.get(expr)
        if cached is None:
            cached = self._i32[expr] = stablehlo.ConvertOp(
                tensor_type([], torch.int32), self.size_value(expr, node)
            ).result
        return cached

    def sym_size(self, s, node=None) -> SymSize:
        expr = _expr(s)
        return SymSize(self.bound(expr, node), self.size_value(expr, node), expr)

    def cut_to_bounds(self, node: torch.fx.Node, result):
        """A rule's result laid out beyond its dims' bounds (a `cat` of pieces at their own
        bounds, whose sizes' sum the guards pin: `pinned_sizes`) cut to the bounds: the
        logical entries come first in a padded layout, so only padding is cut."""
        return each_tensor_result(result, self.symbolic_val(node), lambda r, v: self._cut(r, v, node))

    def _cut(self, value: ir.Value, val: torch.Tensor, node) -> ir.Value:
        for d in self.dynamic_dims(val):
            bound = self.bound(_expr(val.shape[d]), node)
            if ir.RankedTensorType(value.type).shape[d] > bound:
                value = _cut_to_bound(value, d, bound)
        return value

    def mark(self, value: ir.Value, val, node=None) -> ir.Value:
        """Attaches the logical sizes of `val`'s symbolic dims to `value` (typed at its
        bounds)."""
        for d in self.dynamic_dims(val):
            size = self.size_i32(_expr(val.shape[d]), node)
            value = stablehlo.SetDimensionSizeOp(value, size, d, results=[value.type]).result
        return value

    def mark_result(self, value: ir.Value, val, node=None) -> ir.Value:
        """Like `mark`, typing the marked dims `?` (a function result)."""
        t = ir.RankedTensorType(value.type)
        shape = list(t.shape)
        for d in self.dynamic_dims(val):
            shape[d] = ir.ShapedType.get_dynamic_size()
            size = self.size_i32(_expr(val.shape[d]), node)
            result_type = ir.RankedTensorType.get(shape, t.element_type)
            value = stablehlo.SetDimensionSizeOp(value, size, d, results=[result_type]).result
        return value


def each_tensor_result(result, symbolic, fn: Callable[[ir.Value, torch.Tensor], ir.Value]):
    """`fn(value, val)` on each of a node's tensor results (one value, or a tuple beside its
    symbolic metadata); other results as they are."""
    if isinstance(symbolic, torch.Tensor) and isinstance(result, ir.Value):
        return fn(result, symbolic)
    if isinstance(symbolic, (tuple, list)) and isinstance(result, tuple):
        return tuple(
            fn(r, v) if isinstance(v, torch.Tensor) and isinstance(r, ir.Value) else r
            for r, v in zip(result, symbolic)
        ) + result[len(symbolic):]
    return result


def _cut_to_bound(value: ir.Value, dim: int, bound: int) -> ir.Value:
    """The first `bound` entries of `value`'s padded layout along `dim` (made static there
    first: XLA's dynamic padder would otherwise slice the logical size)."""
    with dynamic_import():
        value = static_layout(value)
    return hlo.slice_in_dim(value, dim, 0, bound)


def pinned_sizes(gm: torch.fx.GraphModule) -> dict[Any, int]:
    """Size expressions that the ShapeEnv's guards fix to a constant (`Eq(u0 + u1 + u2 +
    u3, 64)`: the pieces of a `split` whose sizes are graph inputs add up to the split
    dim). Dynamo checks its guards before every call, so such a size is that constant
    whenever the program runs; its bound is the constant, however loose the symbols'
    own bounds. Keys are expanded sympy expressions."""
    shape_env = next((s.node.shape_env for s in graph_symbols(gm).values()), None)
    pinned: dict[Any, int] = {}
    for guard in getattr(shape_env, "guards", None) or ():
        expr = getattr(guard, "expr", None)
        if not isinstance(expr, sympy.Eq):
            continue
        difference = sympy.expand(expr.lhs - expr.rhs)
        constant, symbolic = difference.as_independent(*difference.free_symbols, as_Add=True)
        if not symbolic.free_symbols or not isinstance(constant, sympy.Integer):
            continue
        if symbolic.could_extract_minus_sign():
            symbolic, constant = -symbolic, -constant
        if -constant >= 0:
            pinned[symbolic] = int(-constant)
    return pinned


def _emit(expr, known: Mapping[Any, ir.Value], node) -> ir.Value:
    """Builds a sympy integer expression over known symbols as i64 StableHLO scalar ops."""
    from torch.utils._sympy.functions import FloorDiv, Mod, PythonMod

    i64 = tensor_type([], torch.int64)

    def const(v: int) -> ir.Value:
        attr = ir.DenseElementsAttr.get_splat(
            i64, ir.IntegerAttr.get(ir.IntegerType.get_signless(64), int(v))
        )
        return stablehlo.ConstantOp(attr).result

    def rec(e) -> ir.Value:
        if e in known:
            return known[e]
        if isinstance(e, sympy.Integer):
            return const(int(e))
        if isinstance(e, sympy.Symbol):
            raise DynamicFallback(
                f"symbolic size {e} is not the size of any input of this graph; compile it "
                "with static shapes",
                node,
            )
        args = [rec(a) for a in e.args]
        if isinstance(e, sympy.Add):
            return _fold(stablehlo.AddOp, args)
        if isinstance(e, sympy.Mul):
            return _fold(stablehlo.MulOp, args)
        if isinstance(e, FloorDiv):
            # Sizes are non-negative, so truncating division is floor division.
            return stablehlo.DivOp(args[0], args[1]).result
        if isinstance(e, (Mod, PythonMod)):
            return stablehlo.RemOp(args[0], args[1]).result
        if isinstance(e, sympy.Max):
            return _fold(stablehlo.MaxOp, args)
        if isinstance(e, sympy.Min):
            return _fold(stablehlo.MinOp, args)
        raise DynamicFallback(
            f"symbolic size expression {e} ({type(e).__name__}) is not supported", node
        )

    return rec(expr)


def _fold(op_class, values: list[ir.Value]) -> ir.Value:
    result = values[0]
    for v in values[1:]:
        result = op_class(result, v).result
    return result


def bounds_attr(bounds: list[int]) -> ir.Attribute:
    return ir.DenseI64ArrayAttr.get([int(b) for b in bounds])


def symbol_bounds_from(
    gm: torch.fx.GraphModule, policy: Callable[[int], int]
) -> dict[sympy.Symbol, int]:
    """Bounds of the graph's symbols: the max PyTorch knows for the symbol
    (`mark_dynamic(..., max=)`, ShapeEnv value ranges), else `policy(current size)`."""
    bounds: dict[sympy.Symbol, int] = {}
    for sym, s in graph_symbols(gm).items():
        shape_env = s.node.shape_env
        upper = None
        vr = shape_env.var_to_range.get(sym) if shape_env is not None else None
        if vr is not None:
            upper = _finite_int(vr.upper)
            if upper is not None and upper >= 2**31:
                upper = None
        values = (
            getattr(shape_env, "backed_var_to_val", None) or shape_env.var_to_val
            if shape_env is not None
            else {}
        )
        hint = values.get(sym)
        hint = int(hint) if hint is not None else 1
        bounds[sym] = upper if upper is not None else max(policy(hint), hint)
    return bounds


def _finite_int(x) -> int | None:
    """int(x) for a finite sympy/Python integer; None for infinities (int_oo, oo)."""
    if isinstance(x, (int, sympy.Integer)) and not isinstance(x, bool):
        return int(x)
    return None
