"""How an exported program is called: the module's argument names, each argument's tree
structure and leaves (dtype, shape, dynamic dims and their ranges), so that
`ep(ids, attention_mask=m)` binds as the original module did and a wrong call is an error
that names the argument. Plain data, saved as JSON (no pickle)."""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.utils._pytree as pytree

# Python scalars torch.export specializes the program on: still @main arguments (0-d
# tensors), but a call must pass the value the program was exported with.
_CONSTANT_TYPES = (int, float, bool)


@dataclass(frozen=True)
class SymbolSpec:
    """A size symbol of the exported program (torch.export's `s27`): the name users gave
    it (the `Dim`'s, `seq`) and its range [min, bound compiled for]."""

    label: str
    low: int
    high: int

    def to_json(self) -> dict:
        return {"label": self.label, "min": self.low, "max": self.high}

    @staticmethod
    def from_json(data: dict) -> SymbolSpec:
        return SymbolSpec(str(data["label"]), int(data["min"]), int(data["max"]))


@dataclass(frozen=True)
class SizeExpr:
    """An affine size `sum(coeff * symbol) + const` (torch.export's derived dims are
    affine: `Dim + int`, `Dim - int`, `int * Dim`). Plain JSON when saved: reading it back
    evaluates nothing (no sympy parsing of untrusted text)."""

    terms: tuple[tuple[str, int], ...]  # (symbol, coefficient), sorted by symbol
    const: int = 0

    @staticmethod
    def from_sympy(expr) -> SizeExpr | None:
        """The affine form of a sympy size expression, or None when it is not affine."""
        import sympy

        expr = sympy.expand(expr)
        symbols = sorted(expr.free_symbols, key=str)
        if not symbols:
            return None
        poly = sympy.Poly(expr, *symbols)
        if poly.total_degree() > 1 or not all(c.is_Integer for c in poly.coeffs()):
            return None
        terms = tuple((str(s), int(poly.coeff_monomial(s))) for s in symbols)
        return SizeExpr(terms, int(poly.coeff_monomial(1)))

    def describe(self, labels: dict[str, str]) -> str:
        """`seq`, `2*seq`, `seq + 1` in the symbols' user names."""
        parts = []
        for sym, coeff in self.terms:
            name = labels.get(sym, sym)
            parts.append(name if coeff == 1 else f"{coeff}*{name}")
        text = " + ".join(parts)
        if self.const:
            text += f" {'+' if self.const > 0 else '-'} {abs(self.const)}"
        return text

    def to_json(self) -> dict:
        return {"terms": {sym: coeff for sym, coeff in self.terms}, "const": self.const}

    @staticmethod
    def from_json(data: dict) -> SizeExpr:
        terms = tuple(sorted((str(sym), int(c)) for sym, c in data["terms"].items()))
        if not terms or any(c == 0 for _, c in terms):
            raise ValueError(f"malformed size expression {data!r}")
        return SizeExpr(terms, int(data.get("const", 0)))


@dataclass(frozen=True)
class LeafSpec:
    """One leaf of an argument: a tensor (dtype, shape; `dynamic` maps a dim to its
    [min, max] range) or a constant baked into the program."""

    kind: str  # "tensor" | "constant"
    dtype: str = ""  # torch dtype attribute name ("float32")
    shape: tuple[int, ...] = ()
    dynamic: dict[int, tuple[int, int]] = field(default_factory=dict)
    value: Any = None
    # What each dynamic dim was exported as (`seq`, `2*seq`, `seq + 1`): the constraints
    # torch.export recorded between dims, checked at every call (`check_constraints`).
    # Absent for a dim whose size is not affine in the symbols (range check only) and in
    # manifests written before constraints were recorded.
    sizes: dict[int, SizeExpr] = field(default_factory=dict)

    def describe(self) -> str:
        if self.kind == "constant":
            return f"constant {self.value!r}"
        dims = [
            f"{self.dynamic[d][0]}..{self.dynamic[d][1]}" if d in self.dynamic else str(size)
            for d, size in enumerate(self.shape)
        ]
        return f"{self.dtype}[{', '.join(dims)}]"

    def to_json(self) -> dict:
        if self.kind == "constant":
            return {"kind": "constant", "value": self.value}
        data = {"kind": "tensor", "dtype": self.dtype, "shape": list(self.shape),
                "dynamic": {str(d): list(r) for d, r in self.dynamic.items()}}
        if self.sizes:
            data["sizes"] = {str(d): e.to_json() for d, e in self.sizes.items()}
        return data

    @staticmethod
    def from_json(data: dict) -> LeafSpec:
        if data["kind"] == "constant":
            return LeafSpec("constant", value=data["value"])
        if data["kind"] != "tensor":
            raise ValueError(f"unknown leaf kind {data['kind']!r}")
        dynamic = {int(d): (int(r[0]), int(r[1])) for d, r in data["dynamic"].items()}
        sizes = {int(d): SizeExpr.from_json(e) for d, e in data.get("sizes", {}).items()}
        if not set(sizes) <= set(dynamic):
            raise ValueError(f"size expressions for static dims {sorted(set(sizes) - set(dynamic))}")
        return LeafSpec("tensor", str(data["dtype"]), tuple(int(s) for s in data["shape"]), dynamic, sizes=sizes)


@dataclass(frozen=True)
class ArgSpec:
    """One argument of the exported call: its name, whether it was passed by keyword, its
    pytree structure (`treespec_dumps`) and its leaves."""

    name: str
    keyword: bool
    tree: str
    leaves: tuple[LeafSpec, ...]

    def to_json(self) -> dict:
        return {"name": self.name, "keyword": self.keyword, "tree": self.tree,
                "leaves": [leaf.to_json() for leaf in self.leaves]}

    @staticmethod
    def from_json(data: dict) -> ArgSpec:
        leaves = tuple(LeafSpec.from_json(leaf) for leaf in data["leaves"])
        return ArgSpec(str(data["name"]), bool(data["keyword"]), str(data["tree"]), leaves)


@dataclass(frozen=True)
class ExportSignature:
    args: tuple[ArgSpec, ...]
    out_spec: str  # treespec_dumps of the user outputs
    # The size symbols the leaves' `sizes` refer to (empty for a static program, and in
    # manifests written before constraints were recorded).
    symbols: dict[str, SymbolSpec] = field(default_factory=dict)

    def describe(self) -> str:
        """`(ids: int64[2, 1..64], *, attention_mask: float32[2, 1..64])`"""
        parts: list[str] = []
        starred = False
        for arg in self.args:
            if arg.keyword and not starred:
                parts.append("*")
                starred = True
            leaves = ", ".join(leaf.describe() for leaf in arg.leaves)
            parts.append(f"{arg.name}: {leaves}" if len(arg.leaves) == 1 else f"{arg.name}: ({leaves})")
        return "(" + ", ".join(parts) + ")"

    def flatten_call(self, args: tuple, kwargs: dict, who: str = "exported program") -> list[Any]:
        """Binds a call as Python binds the original module's forward, checks each
        argument against its spec, and returns the program's tensor inputs in order."""
        bound: dict[str, Any] = {}
        if len(args) > len(self.args):
            # Arguments exported as keywords may also come positionally, as the forward's
            # parameters they are.
            raise TypeError(
                f"{who}: takes at most {len(self.args)} positional arguments {self.describe()}, got {len(args)}"
            )
        for spec, value in zip(self.args, args):
            bound[spec.name] = value
        names = {a.name for a in self.args}
        for key, value in kwargs.items():
            if key not in names:
                raise TypeError(f"{who}: unexpected keyword argument '{key}'; expected {self.describe()}")
            if key in bound:
                raise TypeError(f"{who}: got multiple values for argument '{key}'; expected {self.describe()}")
            bound[key] = value
        missing = [a.name for a in self.args if a.name not in bound]
        if missing:
            raise TypeError(
                f"{who}: missing argument{'s' if len(missing) > 1 else ''} "
                f"{', '.join(repr(m) for m in missing)}; expected {self.describe()}"
            )
        inputs: list[Any] = []
        for spec in self.args:
            inputs.extend(_check_argument(spec, bound[spec.name], who))
        self.check_constraints(inputs, who)
        return inputs

    def check_constraints(self, inputs: list[Any], who: str = "exported program") -> None:
        """Checks what torch.export recorded between the dynamic dims of the call's leaves
        (`inputs`, in `flatten_call`'s order): a `Dim` shared by two dims (also two dims of
        one input) gives them one size, a derived dim (`2*seq`, `seq + 1`) is that function
        of its root, and each symbol stays in its range. The padded program passes one size
        per dim and would silently cut or zero-pad a dim that disagrees, so a call that
        breaks a constraint is an error naming both dims."""
        if not self.symbols:
            return
        labels = {sym: spec.label for sym, spec in self.symbols.items()}
        dims: list[tuple[str, int, int, SizeExpr]] = []  # (where, dim, size, expression)
        values = iter(inputs)
        for arg in self.args:
            for k, leaf in enumerate(arg.leaves):
                value = next(values)
                where = f"argument '{arg.name}'" + (f" (leaf {k})" if len(arg.leaves) > 1 else "")
                for d, expr in sorted(leaf.sizes.items()):
                    dims.append((where, d, int(value.shape[d]), expr))
        # Bind each symbol from the first dim that determines it alone (as torch.export's
        # own call check unifies them), solving affine sizes (`2*seq` = 10 gives seq = 5).
        bound: dict[str, tuple[int, str]] = {}  # symbol -> (value, the dim that set it)
        progress = True
        while progress:
            progress = False
            for where, d, size, expr in dims:
                unbound = [(sym, c) for sym, c in expr.terms if sym not in bound]
                if len(unbound) != 1:
                    continue
                sym, coeff = unbound[0]
                rest = size - expr.const - sum(c * bound[s][0] for s, c in expr.terms if s in bound)
                text = expr.describe(labels)
                if rest % coeff:
                    raise ValueError(
                        f"{who}: {where} dim {d} has size {size}, but it was exported as {text}, "
                        f"which no integer {labels.get(sym, sym)} gives; pass a size of the form {text}"
                    )
                plain = expr.terms == ((sym, 1),) and not expr.const
                bound[sym] = (rest // coeff, f"{where} dim {d}" + ("" if plain else f" (size {size} = {text})"))
                progress = True
        for where, d, size, expr in dims:
            if any(sym not in bound for sym, _ in expr.terms):
                continue  # a symbol no dim determines alone: its range was checked per leaf
            want = expr.const + sum(c * bound[sym][0] for sym, c in expr.terms)
            if want != size:
                given = "; ".join(
                    f"{labels.get(sym, sym)} = {bound[sym][0]} from {bound[sym][1]}" for sym, _ in expr.terms
                )
                text = expr.describe(labels)
                plain = len(expr.terms) == 1 and expr.terms[0][1] == 1 and not expr.const
                raise ValueError(
                    f"{who}: {where} dim {d} has size {size}, but it was exported as "
                    f"{text}{'' if plain else f' = {want}'} ({given}): a shared or derived Dim in "
                    f"dynamic_shapes, which torch.export compiled the program for; pass sizes that "
                    f"agree"
                )
        for sym, (value, source) in bound.items():
            spec = self.symbols.get(sym)
            if spec is not None and not spec.low <= value <= spec.high:
                raise ValueError(
                    f"{who}: {spec.label} = {value} (from {source}) is outside its exported range "
                    f"[{spec.low}, {spec.high}]; " + _range_advice(value, spec.low, spec.high)
                )

    def to_json(self) -> dict:
        data = {"args": [a.to_json() for a in self.args], "out_spec": self.out_spec}
        if self.symbols:
            data["symbols"] = {sym: spec.to_json() for sym, spec in self.symbols.items()}
        return data

    @staticmethod
    def from_json(data: dict) -> ExportSignature:
        symbols = {str(sym): SymbolSpec.from_json(spec) for sym, spec in data.get("symbols", {}).items()}
        signature = ExportSignature(
            tuple(ArgSpec.from_json(a) for a in data["args"]), str(data["out_spec"]), symbols
        )
        unknown = {sym for a in signature.args for leaf in a.leaves for e in leaf.sizes.values()
                   for sym, _ in e.terms} - set(symbols)
        if unknown:
            raise ValueError(f"size expressions name unknown symbols {sorted(unknown)}")
        return signature


def _range_advice(size: int, low: int, high: int) -> str:
    """What to do about a size outside [low, high]: below the min, a larger size or an
    export with a smaller min; above the max, a smaller size or a larger max."""
    if size < low:
        return f"pass a size of at least {low}, or export again with a smaller min in dynamic_shapes"
    return f"pass a size of at most {high}, or export again with a larger max in dynamic_shapes"


def _check_argument(spec: ArgSpec, value: Any, who: str) -> list[Any]:
    leaves, tree = pytree.tree_flatten(value)
    expected_tree = pytree.treespec_loads(spec.tree)
    if tree != expected_tree:
        raise TypeError(
            f"{who}: argument '{spec.name}' has structure {tree}, but the program was exported "
            f"with {expected_tree}"
        )
    inputs = []
    for k, (leaf, leaf_spec) in enumerate(zip(leaves, spec.leaves)):
        where = f"argument '{spec.name}'" + (f" (leaf {k})" if len(spec.leaves) > 1 else "")
        if leaf_spec.kind == "constant":
            if isinstance(leaf, torch.Tensor) or leaf != leaf_spec.value:
                raise ValueError(
                    f"{who}: {where} was exported as the constant {leaf_spec.value!r} (baked into "
                    f"the program), got {leaf!r}; export again to change it"
                )
            inputs.append(leaf)
            continue
        if not isinstance(leaf, torch.Tensor):
            raise TypeError(f"{who}: {where} must be a tensor {leaf_spec.describe()}, got {type(leaf).__name__}")
        dtype = str(leaf.dtype).removeprefix("torch.")
        if dtype != leaf_spec.dtype:
            raise TypeError(f"{who}: {where} must have dtype {leaf_spec.dtype}, got {dtype}")
        misfit = None if leaf.dim() != len(leaf_spec.shape) else next(
            (d for d, size in enumerate(leaf.shape) if not _size_fits(int(size), d, leaf_spec)), None
        )
        if leaf.dim() != len(leaf_spec.shape) or misfit is not None:
            advice = ""
            if misfit in leaf_spec.dynamic:
                size, (low, high) = int(leaf.shape[misfit]), leaf_spec.dynamic[misfit]
                advice = (f" (dim {misfit} is dynamic, exported for sizes {low}..{high}: "
                          f"{_range_advice(size, low, high)})")
            raise ValueError(
                f"{who}: {where} must have shape {leaf_spec.describe()}, got {list(leaf.shape)}{advice}"
            )
        inputs.append(leaf)
    return inputs


def _size_fits(size: int, dim: int, spec: LeafSpec) -> bool:
    if dim in spec.dynamic:
        lo, hi = spec.dynamic[dim]
        return lo <= size <= hi
    return size == spec.shape[dim]


def argument_names(module: torch.nn.Module, num_positional: int) -> list[str]:
    """Names of the first `num_positional` arguments of `module.forward` (`args[i]` for
    those taken by `*args`)."""
    names: list[str] = []
    try:
        params = list(inspect.signature(module.forward).parameters.values())
    except (TypeError, ValueError):
        params = []
    for p in params:
        if len(names) == num_positional:
            break
        if p.kind == inspect.Parameter.VAR_POSITIONAL:
            names.extend(f"{p.name}[{i}]" for i in range(num_positional - len(names)))
        elif p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD):
            names.append(p.name)
    names.extend(f"args[{i}]" for i in range(len(names), num_positional))
    return names


def leaf_spec(value: Any, placeholder_val: Any, ranges: dict) -> LeafSpec:
    """The spec of one input leaf; `placeholder_val` is the graph's fake value for it (None
    for a constant), `ranges` maps a size symbol to its (min, max). Each dynamic dim keeps
    its size expression in the graph's symbols (`SizeExpr`), the constraints between dims."""
    if not isinstance(value, torch.Tensor):
        if not isinstance(value, _CONSTANT_TYPES):
            raise TypeError(
                f"torch_tpu.export: a {type(value).__name__} input is baked into the program as a "
                "constant, and only int/float/bool constants can be described; pass a tensor"
            )
        return LeafSpec("constant", value=value)
    shape, dynamic, sizes = [], {}, {}
    fake_shape = placeholder_val.shape if isinstance(placeholder_val, torch.Tensor) else value.shape
    for d, size in enumerate(fake_shape):
        if isinstance(size, torch.SymInt):
            lo, hi = _expr_range(size.node.expr, ranges)
            dynamic[d] = (lo, hi)
            shape.append(hi)
            expr = SizeExpr.from_sympy(size.node.expr)
            if expr is not None:
                sizes[d] = expr
        else:
            shape.append(int(size))
    return LeafSpec("tensor", str(value.dtype).removeprefix("torch."), tuple(shape), dynamic, sizes=sizes)


def _expr_range(expr, ranges: dict) -> tuple[int, int]:
    """[min, max] of a size expression (`s0`, or a derived one such as `2*s0`) over its
    symbols' ranges, as `_dynamic` bounds derived sizes."""
    if expr in ranges:
        return ranges[expr]
    from torch.utils._sympy.value_ranges import ValueRanges, bound_sympy

    vr = bound_sympy(expr, {s: ValueRanges(*r) for s, r in ranges.items()})
    return int(vr.lower), int(vr.upper)
