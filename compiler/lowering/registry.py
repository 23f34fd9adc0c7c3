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

import enum
from dataclasses import dataclass
from dataclasses import replace as _replace
from typing import TYPE_CHECKING, Any, Callable, Protocol

import torch
import torch.fx
import torch.utils._pytree

from ..context import ir

if TYPE_CHECKING:
    from ..process_groups import ProcessGroups


class Padding(enum.Enum):
    """What a padded operand does to a lowering (bounded dynamism,
    docs/explanation/bounded-dynamism.md). A graph with a dynamic dim is lowered at its
    bound: tensors are padded buffers whose logical size travels as a
    `set_dimension_size` mark. Every lowering declares its class; the importer lowers a
    node that has a dynamic operand or result only through a lowering whose class says
    that is right (`dynamic_lowering`). `meaning` says what each class is."""

    SAFE = "safe"
    MASKED = "masked"
    COUNT = "count"
    INDEX = "index"
    SIZE = "size"
    MOVEMENT = "movement"
    WINDOW = "window"
    PREFIX = "prefix"
    EAGER = "eager"

    @property
    def meaning(self) -> str:
        return _PADDING_MEANING[self]


_PADDING_MEANING = {
    Padding.SAFE: "Each logical output element reads only logical input elements, at positions that do "
    "not depend on where a dynamic dim ends (elementwise ops, transposes, broadcasts, fills, "
    "gathers at given indices): the ordinary rule is right and padding stays in the padding.",
    Padding.MASKED: "Reads across a dynamic dim in a way XLA's dynamic padder masks (reductions, dot "
    "contractions, concatenation): the ordinary rule is right. Checked against eager by "
    "test/python/frontend/test_bounded_dynamism_opinfo.py.",
    Padding.COUNT: "Divides by an element count (mean, variance, normalizations, mean losses): its rule "
    "uses the run-time count, or falls back.",
    Padding.INDEX: "Carries indices or positions (argmax, scatter, index_put, bucketize, embedding_bag): "
    "indices must be logical and padded positions must never win or be written.",
    Padding.SIZE: "Uses a size as a value (resampling scales, attention scale, linspace, arange with a "
    "symbolic start).",
    Padding.MOVEMENT: "Moves data across the padded boundary (reshape, slice, flip, split, pad, sort).",
    Padding.WINDOW: "Sliding windows along a dim (pooling, convolution): right along static dims; along "
    "a dynamic one the windows straddle the boundary.",
    Padding.PREFIX: "A scan: valid outputs read only a valid prefix, so its rule runs on the padded "
    "buffer as a static one.",
    Padding.EAGER: "A documented limit: with a dynamic operand the op runs in PyTorch eager.",
}


# Classes whose ordinary rule is right on padded buffers as is.
PADDING_SAFE_AS_IS = frozenset({Padding.SAFE, Padding.MASKED})


@dataclass(frozen=True)
class Lowering:
    op: Any  # torch._ops.OpOverload or a Python callable (operator.getitem, ...)
    fn: Callable
    family: str
    # What padding does to the op (None: undeclared, so a dynamic operand falls back).
    padding: Padding | None = None
    # The rule used when an operand or the result has a dynamic dim; returns
    # NotImplemented where the ordinary rule is right (the dynamic dims are not the
    # ones the op works along). Declared at the registration: `lowers(..., dynamic_rule=)`.
    dynamic_rule: Callable | None = None
    # For a rule whose meaning is not in the compiler's own code (a jax_op's StableHLO):
    # `identity(record) -> str` names what it lowers to, so compile-cache keys (which
    # cover the compiler's code, not users') change when it does (`lowering_identity`).
    identity: Callable | None = None
    # Where the rule was registered ("file:line (name)"), for the duplicate error;
    # `add_lowering` fills it from the rule's definition when not given.
    site: str = ""


class LoweringTable(dict):
    """The table of lowerings: a dict that tells its subscribers which overload's entry
    changed (added, replaced or removed). Entries are written by `add_lowering` (the one
    writer, which refuses a second lowering of an op unless told to replace it); tests
    may patch entries as in any dict. Users of the table that remember what it did
    not hold -- the eager device's plan cache ("no lowering: run on CPU"), its kernel
    registrations, the tracing decomposition table -- subscribe, so a lowering registered
    after they looked an op up (`torch_tpu.register_lowering`, a `jax_op`'s first trace)
    is found at the op's next call. Reads are plain dict reads."""

    def __init__(self) -> None:
        super().__init__()
        self._subscribers: list[Callable[[Any], None]] = []

    def subscribe(self, callback: Callable[[Any], None]) -> None:
        """`callback(op)` runs after each change of `op`'s entry (idempotent per callback)."""
        if callback not in self._subscribers:
            self._subscribers.append(callback)

    def _changed(self, op: Any) -> None:
        for callback in list(self._subscribers):
            callback(op)

    def __setitem__(self, op: Any, lowering: "Lowering") -> None:
        super().__setitem__(op, lowering)
        self._changed(op)

    def __delitem__(self, op: Any) -> None:
        super().__delitem__(op)
        self._changed(op)

    def pop(self, op: Any, *default: Any) -> Any:
        present = op in self
        value = super().pop(op, *default)
        if present:
            self._changed(op)
        return value

    def setdefault(self, op: Any, default: Any = None) -> Any:
        if op not in self:
            self[op] = default
        return self[op]

    def update(self, *args: Any, **kwargs: Any) -> None:
        for op, lowering in dict(*args, **kwargs).items():
            self[op] = lowering

    def __ior__(self, other: Any) -> "LoweringTable":
        self.update(other)
        return self

    def popitem(self) -> tuple:
        op, value = super().popitem()
        self._changed(op)
        return op, value

    def clear(self) -> None:
        ops = list(self)
        super().clear()
        for op in ops:
            self._changed(op)


LOWERINGS: LoweringTable = LoweringTable()
# Result-metadata rules for overloads whose PyTorch meta kernel accepts less than their
# lowering and CPU kernel do (aten._grouped_mm's meta kernel takes bfloat16 only), or gives
# other result shapes than the CPU kernel (batch norm's saved statistics in inference mode,
# embedding_bag's auxiliary results): called like the op on meta tensors, they return its
# result's metadata as the CPU kernel would. The eager device plans an op with them instead
# of the meta kernel (its results are CPU eager's); compiled graphs keep the meta kernel's,
# which aot_autograd traced with.
METADATA_RULES: dict[Any, Callable] = {}
# The rules that also give Dynamo's fake tensors on the tpu device their results (tracing a
# graph on tpu tensors): rules that accept more than PyTorch's meta kernel and agree with it
# wherever both accept, so a graph traced with them is the one the meta kernel would give.
# transformers calls `torch.nn.functional.grouped_mm` on tpu tensors in float32, which the
# meta kernel refuses before any backend sees the graph.
TRACING_RULES: set = set()


def metadata_rule(*ops: Any, tracing: bool = False) -> Callable[[Callable], Callable]:
    def register(fn: Callable) -> Callable:
        for op in ops:
            METADATA_RULES[op] = fn
            if tracing:
                TRACING_RULES.add(op)
        return fn

    return register


def _overloads(op: Any) -> list:
    if isinstance(op, torch._ops.OpOverloadPacket):
        return [getattr(op, o) for o in op.overloads()]
    return [op]


def _lowered_overloads(op: Any) -> list:
    """The lowered overloads of `op` (an OpOverloadPacket: those of its overloads that
    have a lowering, at least one; an OpOverload: itself, which must have one)."""
    targets = _overloads(op)
    if isinstance(op, torch._ops.OpOverloadPacket):
        targets = [t for t in targets if t in LOWERINGS]
    if not targets or any(t not in LOWERINGS for t in targets):
        raise ValueError(f"padding declared for {op}, which has no lowering")
    return targets


_LOWERING_PACKAGE = __name__.rpartition(".")[0]


def family_of(module: str) -> str:
    """The family of the lowerings defined in `module`: the module or package right under
    this package (`lowering/linalg/qr.py` and `lowering/linalg/lu.py` are both `linalg`,
    `lowering/losses.py` is `losses`); a module elsewhere (a test's rule) is its own name."""
    inside = module.removeprefix(_LOWERING_PACKAGE + ".")
    return inside.split(".")[0] if inside != module else module.rsplit(".", 1)[-1]


def definition_site(fn: Callable) -> str:
    """`file:line (qualified name)` of where `fn` is defined (a `functools.partial`'s or
    a bound method's function)."""
    target = getattr(fn, "func", fn)
    target = getattr(target, "__func__", target)
    code = getattr(target, "__code__", None)
    name = getattr(target, "__qualname__", None) or repr(target)
    if code is None:
        return name
    return f"{code.co_filename}:{code.co_firstlineno} ({name})"


class DuplicateLoweringError(ValueError):
    """A second lowering of an op that has one, without `replace=True`."""


def add_lowering(lowering: Lowering, *, replace: bool = False) -> Lowering:
    """Writes `lowering` into the table: the one writer of `LOWERINGS` (the `lowers`
    decorator, `declare_padding`, `torch_tpu.register_lowering` and `jax_op` all write
    through it). An op has one lowering: a second one is a `DuplicateLoweringError`
    naming both registration sites, unless `replace` says the new entry replaces the
    old (a re-registered user rule, a padding class declared after the rule).
    Returns the entry as stored (its `site` filled in)."""
    if not lowering.site:
        lowering = _replace(lowering, site=definition_site(lowering.fn))
    existing = LOWERINGS.get(lowering.op)
    if existing is not None and not replace:
        raise DuplicateLoweringError(
            f"{lowering.op} has two lowerings: {existing.site or existing.family} (family "
            f"{existing.family}) and {lowering.site} (family {lowering.family}); an op has one lowering -- "
            "remove one of them, or pass replace=True where the second is registered to replace the first")
    LOWERINGS[lowering.op] = lowering
    return lowering


def lowers(
    *ops: Any, dynamic: Padding | None = None, dynamic_rule: Callable | None = None, replace: bool = False,
    identity: Callable | None = None,
) -> Callable[[Callable], Callable]:
    """Registers `fn` as the lowering of each of `ops` (OpOverloads; an OpOverloadPacket
    registers all of its overloads), with its padding class `dynamic` (`Padding`) and,
    for a class whose ordinary rule is not right on padded buffers, its `dynamic_rule`
    (`Lowering.dynamic_rule`; the factories of `padded.py` make the common ones). A
    second lowering of an overload is an error unless `replace` (`add_lowering`).
    `identity` (`Lowering.identity`): for a rule whose result also depends on code
    outside the compiler (a kernel offered through `core.kernel_slots`)."""
    if dynamic_rule is not None and (dynamic is None or dynamic in PADDING_SAFE_AS_IS):
        what = dynamic.value if dynamic is not None else "no"
        raise ValueError(f"a dynamic rule for {', '.join(map(str, ops))} with {what} padding class: "
                         "declare the class the rule handles (registry.Padding)")

    def register(fn: Callable) -> Callable:
        # functools.partial rules report the module of the function they specialise.
        family = family_of(getattr(fn, "func", fn).__module__)
        for op in ops:
            for target in _overloads(op):
                add_lowering(Lowering(target, fn, family, dynamic, dynamic_rule, identity), replace=replace)
        return fn

    return register


def declare_padding(padding: Padding, *ops: Any, family: str | None = None) -> None:
    """Declares the padding class of lowerings already registered: each of `ops`, or
    (with `family`) every lowering of that family module still undeclared — for families
    that are uniformly of one class (pure elementwise ones). An op without a lowering,
    or declared twice with different classes, is an error (a dead or conflicting entry).
    A dynamic rule is declared at the registration (`lowers(..., dynamic_rule=)`)."""
    targets = [t for op in ops for t in _lowered_overloads(op)]
    if family is not None:
        targets += [op for op, low in LOWERINGS.items() if low.family == family and low.padding is None]
    for target in targets:
        low = LOWERINGS[target]
        if low.padding is not None and low.padding is not padding:
            raise ValueError(f"{target} declared {low.padding.name} and {padding.name}")
        add_lowering(_replace(low, padding=padding), replace=True)  # the same rule, now with its class


def require_padding_as_is(lowering: Lowering, ctx: "LoweringContext") -> None:
    """For callers that run a lowering's ordinary rule on a node with a dynamic operand
    outside `dynamic_lowering` (in-place forms, effectful wrappers): only a class whose
    ordinary rule is right on padded buffers is allowed; anything else runs in eager."""
    if lowering.padding not in PADDING_SAFE_AS_IS:
        what = lowering.padding.value if lowering.padding is not None else "undeclared"
        raise ctx.dynamic_limit(f"the in-place or wrapped form of a '{what}' op with a dynamic (padded) operand")


class DynamicLimit(str):
    """The reason of a fallback that is a documented limit of bounded dynamism (not a
    missing lowering): the fallback log says so instead of asking for a report."""


def dynamic_lowering(lowering: Lowering, ctx: "LoweringContext", *args, **kwargs):
    """Lowers a node that has an operand or result with a dynamic (padded) dim: its
    dynamic rule, else its ordinary rule where its class says that is right, else a
    fallback to PyTorch eager (an undeclared lowering is never trusted with padding)."""
    if lowering.dynamic_rule is not None:
        result = lowering.dynamic_rule(ctx, *args, **kwargs)
        if result is not NotImplemented:
            return result
        return lowering.fn(ctx, *args, **kwargs)
    if lowering.padding is Padding.SAFE:
        # Padding stays in the padding, so the rule runs on static layouts: XLA's dynamic
        # padder has nothing to do (and cannot reject what it does not support, such as
        # the while loops of igamma); the importer re-marks the result's sizes.
        from .symsize import static_layout

        args, kwargs = torch.utils._pytree.tree_map(
            lambda a: static_layout(a) if isinstance(a, ir.Value) else a, (args, kwargs)
        )
        return lowering.fn(ctx, *args, **kwargs)
    if lowering.padding is Padding.MASKED:
        return lowering.fn(ctx, *args, **kwargs)
    if lowering.padding is None:
        raise LoweringError(
            "its lowering declares no padding class (compiler/lowering/registry.py, Padding), "
            "so it is not trusted with a dynamic (padded) dimension; it runs in PyTorch eager "
            "(mark the dimension static to compile it)",
            ctx.node,
        )
    raise ctx.dynamic_limit(
        f"an op of padding class '{lowering.padding.value}' with a dynamic (padded) dimension"
    )


def lookup(target: Any) -> Lowering | None:
    return LOWERINGS.get(target)


def lowering_identity(record: "OpRecord") -> str:
    """What a compile-cache key must add for `record`'s op besides its name: "" for the
    compiler's own rules (the toolchain fingerprint covers their code), the rule's
    `identity` for rules defined outside the compiler."""
    lowering = LOWERINGS.get(record.target)
    if lowering is None or lowering.identity is None:
        return ""
    return lowering.identity(record)


class LoweringError(Exception):
    """An op that could not be lowered. `node` is the FX node (None for an op lowered
    without a graph: then `where` names the op); the message names the op and the
    user's source line."""

    def __init__(self, message: str, node: torch.fx.Node | None = None, where: str | None = None) -> None:
        self.node = node
        self.reason = message
        if node is not None:
            from ..fx_locations import describe_node

            message = f"{describe_node(node)}: {message}"
        elif where is not None:
            message = f"{where}: {message}"
        super().__init__(message)


class UnsupportedOpError(LoweringError):
    """No lowering is registered for the node's target."""


class DynamicFallback(LoweringError):
    """A documented limit of bounded dynamism: the node runs in PyTorch eager."""

    def __init__(self, message: str, node: torch.fx.Node | None = None) -> None:
        super().__init__(message, node)
        self.reason = DynamicLimit(message)


@dataclass(frozen=True)
class OpRecord:
    """One op to lower, independent of any FX graph: its overload, the metadata of its
    arguments (tensors as fake/meta tensors, everything else as the Python value) and of
    its result. FX nodes, wrapped ops (`with_effects`), in-place ops lowered through
    their functional form and eager device ops all lower from such a record."""

    target: Any
    args: tuple = ()
    kwargs: dict = None  # type: ignore[assignment]
    val: Any = None
    # How errors name the op (its user's source line when known).
    where: str = ""

    @classmethod
    def of_node(cls, node: torch.fx.Node, val: Any = None, *, use_node_val: bool = True) -> "OpRecord":
        def meta(a):
            return a.meta.get("val") if isinstance(a, torch.fx.Node) else a

        args, kwargs = torch.fx.node.map_arg((node.args, dict(node.kwargs)), meta)
        if use_node_val:
            val = node.meta.get("val")
        return cls(node.target, tuple(args), kwargs, val, node.name)

    def arg_meta(self, position: int):
        return self.args[position]


class DynamicSizes(Protocol):
    """The graph's bounded-dynamism facts a rule may ask for (the importer's
    `DynamicShapes`, compiler/importer/dynamic.py): a node's symbolic metadata, the
    dynamic dims of a metadata value, and run-time sizes as 0-d values built at the
    insertion point."""

    def symbolic_val(self, node: torch.fx.Node) -> Any: ...

    def dynamic_dims(self, val: Any) -> list[int]: ...

    def size_value(self, expr: Any, node: torch.fx.Node | None = None) -> ir.Value: ...

    def size_i32(self, expr: Any, node: torch.fx.Node | None = None) -> ir.Value: ...


class RowLayouts(Protocol):
    """The graph's row-interleaved values (row_layout.py): `interleaved` maps a node to
    its `RowLayout`; `compacted(node)` is that node's compact value, built once."""

    interleaved: dict

    def compacted(self, node: torch.fx.Node) -> ir.Value: ...


class RandomSource(Protocol):
    """What gives random bits: the graph's threaded RNG state (importer/random_state.py)."""

    def random_bits(self, shape: Any, bits: int) -> ir.Value: ...


class LoweringContext:
    """What a rule may ask about the op it lowers: `record` (an `OpRecord`), the
    location, and for ops of an FX graph the node and the graph-level facts the importer
    hands over as typed fields (so rules never reach into the importer):

    * `dynamic`: the bounded-dynamism facts (`DynamicSizes`), None when the graph has
      no symbolic sizes;
    * `process_groups`: what the frontend found out about the process groups that
      collectives name (`compiler/process_groups.py`), None when none was given;
    * `row_layouts`: the row-interleaved values of a bounded-dynamic graph (`RowLayouts`);
    * `random_source`: where `random_bits` draws from.

    Rules that use only `meta`/`arg_meta`/`result_*`/`fail` lower without a graph
    (`compiler/importer/single_op.py`)."""

    def __init__(
        self,
        node: torch.fx.Node | None,
        loc: ir.Location,
        *,
        record: OpRecord | None = None,
        random_source: RandomSource | None = None,
        dynamic: DynamicSizes | None = None,
        process_groups: ProcessGroups | None = None,
        row_layouts: RowLayouts | None = None,
    ) -> None:
        self.node = node
        self.loc = loc
        self.random_source = random_source
        self.dynamic = dynamic
        self.process_groups = process_groups
        self.row_layouts = row_layouts
        self._record = record

    def for_record(self, record: OpRecord) -> "LoweringContext":
        """The context of `record`, an op a rule lowers through another op's rule (each
        element of a foreach op): this graph's facts and location, that op's metadata."""
        return LoweringContext(self.node, self.loc, record=record, random_source=self.random_source,
                               dynamic=self.dynamic, process_groups=self.process_groups,
                               row_layouts=self.row_layouts)

    @property
    def record(self) -> OpRecord:
        if self._record is None:
            # Built on first use: most rules of a graph never ask for argument metadata.
            self._record = OpRecord.of_node(self.node)
        return self._record

    def random_bits(self, shape, bits: int = 32) -> ir.Value:
        """Uniform random `ui32`/`ui64` bits of `shape` from the graph's threaded RNG state
        (the importer adds a `tensor<2xui64>` seed argument the caller supplies)."""
        if self.random_source is None:
            raise self.fail("a random op lowered without a graph has no seed to draw from")
        return self.random_source.random_bits(shape, bits)

    def meta(self, index: int | None = None):
        val = self.node.meta.get("val") if self._record is None else self._record.val
        if index is not None:
            val = val[index]
        return val

    def result_type(self, index: int | None = None) -> ir.RankedTensorType:
        from ..dtypes import tensor_type

        val = self.meta(index)
        if not isinstance(val, torch.Tensor):
            raise self.fail(f"expected a tensor result, found {type(val).__name__}")
        return tensor_type(val.shape, val.dtype)

    def result_dtype(self, index: int | None = None) -> torch.dtype:
        return self.meta(index).dtype

    def result_shape(self, index: int | None = None) -> list[int]:
        return [int(s) for s in self.meta(index).shape]

    def arg_meta(self, position: int):
        if self._record is None:
            arg = self.node.args[position]
            return arg.meta.get("val") if isinstance(arg, torch.fx.Node) else arg
        return self._record.arg_meta(position)

    def fail(self, message: str) -> LoweringError:
        return LoweringError(message, self.node, None if self._record is None else self._record.where)

    def dynamic_limit(self, what: str) -> "DynamicFallback":
        """The error of a documented bounded-dynamism limit: `what` is not supported over
        a dynamic dim, so the node runs in PyTorch eager."""
        return DynamicFallback(
            f"{what} is not supported with bounded dynamism; it runs in PyTorch eager "
            "(or mark the dimension static)",
            self.node,
        )
