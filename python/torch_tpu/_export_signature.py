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
class LeafSpec:
    """One leaf of an argument: a tensor (dtype, shape; `dynamic` maps a dim to its
    [min, max] range) or a constant baked into the program."""

    kind: str  # "tensor" | "constant"
    dtype: str = ""  # torch dtype attribute name ("float32")
    shape: tuple[int, ...] = ()
    dynamic: dict[int, tuple[int, int]] = field(default_factory=dict)
    value: Any = None

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
        return {"kind": "tensor", "dtype": self.dtype, "shape": list(self.shape),
                "dynamic": {str(d): list(r) for d, r in self.dynamic.items()}}

    @staticmethod
    def from_json(data: dict) -> LeafSpec:
        if data["kind"] == "constant":
            return LeafSpec("constant", value=data["value"])
        if data["kind"] != "tensor":
            raise ValueError(f"unknown leaf kind {data['kind']!r}")
        dynamic = {int(d): (int(r[0]), int(r[1])) for d, r in data["dynamic"].items()}
        return LeafSpec("tensor", str(data["dtype"]), tuple(int(s) for s in data["shape"]), dynamic)


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
        return inputs

    def to_json(self) -> dict:
        return {"args": [a.to_json() for a in self.args], "out_spec": self.out_spec}

    @staticmethod
    def from_json(data: dict) -> ExportSignature:
        return ExportSignature(tuple(ArgSpec.from_json(a) for a in data["args"]), str(data["out_spec"]))


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
        if leaf.dim() != len(leaf_spec.shape) or any(
            not _size_fits(int(size), d, leaf_spec) for d, size in enumerate(leaf.shape)
        ):
            raise ValueError(
                f"{who}: {where} must have shape {leaf_spec.describe()}, got {list(leaf.shape)}"
                + ("" if not leaf_spec.dynamic else " (a dynamic dim outside its exported range: "
                   "export again with a larger max in dynamic_shapes)")
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
    for a constant), `ranges` maps a size symbol to its (min, max)."""
    if not isinstance(value, torch.Tensor):
        if not isinstance(value, _CONSTANT_TYPES):
            raise TypeError(
                f"torch_tpu.export: a {type(value).__name__} input is baked into the program as a "
                "constant, and only int/float/bool constants can be described; pass a tensor"
            )
        return LeafSpec("constant", value=value)
    shape, dynamic = [], {}
    fake_shape = placeholder_val.shape if isinstance(placeholder_val, torch.Tensor) else value.shape
    for d, size in enumerate(fake_shape):
        if isinstance(size, torch.SymInt):
            lo, hi = _expr_range(size.node.expr, ranges)
            dynamic[d] = (lo, hi)
            shape.append(hi)
        else:
            shape.append(int(size))
    return LeafSpec("tensor", str(value.dtype).removeprefix("torch."), tuple(shape), dynamic)


def _expr_range(expr, ranges: dict) -> tuple[int, int]:
    """[min, max] of a size expression (`s0`, or a derived one such as `2*s0`) over its
    symbols' ranges, as `_dynamic` bounds derived sizes."""
    if expr in ranges:
        return ranges[expr]
    from torch.utils._sympy.value_ranges import ValueRanges, bound_sympy

    vr = bound_sympy(expr, {s: ValueRanges(*r) for s, r in ranges.items()})
    return int(vr.lower), int(vr.upper)
