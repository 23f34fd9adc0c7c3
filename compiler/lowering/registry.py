"""The lowering table: one rule per ATen overload (CONVENTIONS.md: "one rule per op,
grouped by family"). `docs/reference/ops.md` and the coverage report are generated
from `LOWERINGS`.

A rule is `fn(ctx, *args, **kwargs)`: tensor arguments arrive as `ir.Value`s, everything
else (ints, floats, lists, dtypes, None) as the Python values the FX node carries.
It returns an `ir.Value`, a tuple/list of them (multi-result ops), or a Python value
(ops such as `sym_size` that compute a static scalar). Rules run with the node's
location and the insertion point active, so helpers build ops without plumbing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.fx

from ..context import ir


@dataclass(frozen=True)
class Lowering:
    op: Any  # torch._ops.OpOverload or a Python callable (operator.getitem, ...)
    fn: Callable
    family: str


LOWERINGS: dict[Any, Lowering] = {}


def lowers(*ops: Any) -> Callable[[Callable], Callable]:
    """Registers `fn` as the lowering of each of `ops` (OpOverloads; an OpOverloadPacket
    registers all of its overloads)."""

    def register(fn: Callable) -> Callable:
        # functools.partial rules report the module of the function they specialise.
        family = getattr(fn, "func", fn).__module__.rsplit(".", 1)[-1]
        for op in ops:
            targets = (
                [getattr(op, o) for o in op.overloads()]
                if isinstance(op, torch._ops.OpOverloadPacket)
                else [op]
            )
            for target in targets:
                if target in LOWERINGS:
                    raise ValueError(f"{target} has two lowerings ({LOWERINGS[target].family}, {family})")
                LOWERINGS[target] = Lowering(target, fn, family)
        return fn

    return register


def lookup(target: Any) -> Lowering | None:
    return LOWERINGS.get(target)


class LoweringError(Exception):
    """A node that could not be lowered. `node` is the FX node; the message names the op
    and the user's source line."""

    def __init__(self, message: str, node: torch.fx.Node | None = None) -> None:
        self.node = node
        self.reason = message
        if node is not None:
            from ..importer.locations import describe_node

            message = f"{describe_node(node)}: {message}"
        super().__init__(message)


class UnsupportedOpError(LoweringError):
    """No lowering is registered for the node's target."""


@dataclass
class LoweringContext:
    """What a rule may ask about the node it lowers."""

    node: torch.fx.Node
    loc: ir.Location
    importer: Any = None  # the FxImporter; gives access to graph-level state

    def random_bits(self, shape, bits: int = 32) -> ir.Value:
        """Uniform random `ui32`/`ui64` bits of `shape` from the graph's threaded RNG state
        (the importer adds a `tensor<2xui64>` seed argument the caller supplies)."""
        return self.importer.random_bits(shape, bits)

    def meta(self, index: int | None = None):
        val = self.node.meta.get("val")
        if index is not None:
            val = val[index]
        return val

    def result_type(self, index: int | None = None) -> ir.RankedTensorType:
        from ..dtypes import tensor_type

        val = self.meta(index)
        if not isinstance(val, torch.Tensor):
            raise LoweringError(f"expected a tensor result, found {type(val).__name__}", self.node)
        return tensor_type(val.shape, val.dtype)

    def result_dtype(self, index: int | None = None) -> torch.dtype:
        return self.meta(index).dtype

    def result_shape(self, index: int | None = None) -> list[int]:
        return [int(s) for s in self.meta(index).shape]

    def arg_meta(self, position: int):
        arg = self.node.args[position]
        return arg.meta.get("val") if isinstance(arg, torch.fx.Node) else arg

    def fail(self, message: str) -> LoweringError:
        return LoweringError(message, self.node)
