"""`torch_tpu.register_lowering`: users' own lowerings, in the built-in table
(`compiler/lowering/registry.py`), with the same rule signature and context."""

from __future__ import annotations

import hashlib
from typing import Any, Callable

import torch

from torch_tpu.compiler.lowering import LOWERINGS, Lowering, Padding
from torch_tpu.compiler.lowering.registry import DuplicateLoweringError, add_lowering, family_of

# Overload -> the digest of the user's rule registered for it (its `Lowering.identity` keys
# the compile cache, so no program an earlier version of the rule built is reused).
_USER_RULES: dict[Any, str] = {}


def register_lowering(*ops: Any, dynamic: Padding | str | None = None,
                      replace: bool = False) -> Callable[[Callable], Callable]:
    """Registers the decorated function as the lowering of each of `ops` (OpOverloads,
    or OpOverloadPackets for all their overloads: `torch.ops.mylib.op.default`), so
    that graphs calling them compile with no fallback to PyTorch eager::

        @torch_tpu.register_lowering(torch.ops.mylib.scaled_add.default)
        def _(ctx, x, y, alpha):
            from torch_tpu.compiler import ir as hlo
            scale = hlo.splat(alpha, hlo.element_type_of(y), hlo.shape_of(y))
            return hlo.add(x, hlo.mul(y, scale))

    The rule is called as `fn(ctx, *args, **kwargs)` with the op's arguments: tensors
    as MLIR values (`jaxlib.mlir.ir.Value`, typed `tensor<...>`), everything else as
    the Python value the graph holds. It returns an MLIR value (a tuple of them for an
    op with several results), built with the StableHLO builders of
    `torch_tpu.compiler.ir` or `jaxlib.mlir.dialects.stablehlo`, which run at the op's
    location and insertion point. `ctx` (`torch_tpu.compiler.lowering.LoweringContext`)
    tells the rule about the op: `ctx.result_type(i)` (the MLIR tensor type of result
    `i`), `ctx.result_shape(i)`, `ctx.result_dtype(i)`, `ctx.meta(i)` (the result's fake
    tensor), `ctx.arg_meta(position)` (an argument's fake tensor or value), and
    `raise ctx.fail(message)` rejects these arguments (the op then runs in PyTorch
    eager, logged). See docs/howto/write-a-lowering.md.

    `dynamic` is the rule's padding class (`torch_tpu.compiler.lowering.Padding` or its
    name, such as "safe"), which says whether it is right on bounded-dynamic (padded)
    operands; without one, the op runs in eager when an operand has a dynamic dim.

    An op has one lowering: one that already has a lowering is an error naming both
    registration sites, unless `replace=True` (the rule then replaces the built-in or
    earlier one) or that lowering is an earlier registration of a function of the same
    name (a re-run notebook cell), which it replaces."""
    padding = Padding(dynamic) if isinstance(dynamic, str) else dynamic
    targets = [t for op in ops for t in _overloads(op)]

    def register(fn: Callable) -> Callable:
        family = family_of(getattr(fn, "func", fn).__module__)
        # The rule's code keys the compile cache (graphs and device ops alike), so an
        # edited rule never reuses a program an earlier version built.
        digest = _digest(fn)
        rules = [Lowering(target, fn, family, padding, identity=lambda record, d=digest: f"user:{d}")
                 for target in targets]
        for rule in rules:  # every check before any write: a refused call registers nothing
            existing = LOWERINGS.get(rule.op)
            if existing is not None and not (replace or _rerun(rule.op, existing, fn)):
                try:
                    add_lowering(rule)  # refuses it, naming both registration sites
                except DuplicateLoweringError as err:
                    raise DuplicateLoweringError(f"torch_tpu.register_lowering: {err}") from None
        for rule in rules:
            add_lowering(rule, replace=True)
        _USER_RULES.update((target, digest) for target in targets)
        return fn

    return register


def _overloads(op: Any) -> list:
    if isinstance(op, torch._ops.OpOverloadPacket):
        return [getattr(op, name) for name in op.overloads()]
    if isinstance(op, torch._ops.OpOverload):
        return [op]
    raise TypeError(f"torch_tpu.register_lowering: expected an operator such as torch.ops.mylib.my_op.default, "
                    f"got {op!r} ({type(op).__name__})")


def _rerun(target: Any, existing: Lowering, fn: Callable) -> bool:
    """Whether `fn` re-registers the user's rule of that name (a re-run notebook cell)."""
    return target in _USER_RULES and _same_name(existing.fn, fn)


def _same_name(a: Callable, b: Callable) -> bool:
    return (getattr(a, "__module__", None), getattr(a, "__qualname__", None)) == (
        getattr(b, "__module__", None), getattr(b, "__qualname__", None))


def _digest(fn: Callable) -> str:
    """The rule's code (bytecode and constants, nested functions included)."""
    code = getattr(getattr(fn, "func", fn), "__code__", None)
    if code is None:
        return repr(fn)
    h = hashlib.sha256()

    def add(c) -> None:
        h.update(c.co_code)
        for const in c.co_consts:
            if hasattr(const, "co_code"):
                add(const)
            else:
                h.update(repr(const).encode())
        h.update(repr(c.co_names).encode())

    add(code)
    return h.hexdigest()[:16]


