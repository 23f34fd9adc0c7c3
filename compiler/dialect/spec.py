"""Declarative op specifications for the `torchtpu` dialect.

An op is one `OpSpec` entry: name, operands, results, attributes, traits, a summary
and an optional extra verifier. The verifier pass and `docs/reference/dialect.md` are
both derived from these entries, so they cannot drift apart.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable, Optional

from ..context import ir

DIALECT = "torchtpu"


# --------------------------------------------------------------------------------------
# Types
# --------------------------------------------------------------------------------------
_REF = re.compile(r"^ref<(.*)>$", re.S)


def ref_tensor_type(t: ir.Type) -> Optional[ir.RankedTensorType]:
    """The tensor type inside `!torchtpu.ref<tensor<...>>`, or None if `t` is not a
    well-formed reference type."""
    if not isinstance(t, ir.OpaqueType) or t.dialect_namespace != DIALECT:
        return None
    match = _REF.match(t.data)
    if match is None:
        return None
    text = match.group(1)
    if not text.strip():
        # jaxlib 0.10.2: ir.Type.parse("") segfaults (found by test_opt_fuzz.py on
        # `!torchtpu.ref<>`), so an empty parameter never reaches it.
        return None
    try:
        inner = ir.Type.parse(text, t.context)
    except (ir.MLIRError, ValueError):
        return None
    return inner if isinstance(inner, ir.RankedTensorType) else None


def make_ref_type(tensor_type: ir.RankedTensorType) -> ir.Type:
    return ir.Type.parse(f"!{DIALECT}.ref<{tensor_type}>", tensor_type.context)


KNOWN_TYPES = {"ref": "`!torchtpu.ref<tensor<...>>`: a mutable tensor (storage that views alias)"}


@dataclass(frozen=True)
class TypeConstraint:
    """A predicate on an operand/result type, with the words used in diagnostics."""

    description: str
    check: Callable[[ir.Type], bool]


AnyRankedTensor = TypeConstraint(
    "ranked tensor", lambda t: isinstance(t, ir.RankedTensorType)
)
Ref = TypeConstraint("!torchtpu.ref<tensor<...>>", lambda t: ref_tensor_type(t) is not None)
RefOrTensor = TypeConstraint(
    "ranked tensor or !torchtpu.ref", lambda t: AnyRankedTensor.check(t) or Ref.check(t)
)


# --------------------------------------------------------------------------------------
# Attributes
# --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class AttrKind:
    description: str
    check: Callable[[ir.Attribute], bool]
    to_python: Callable[[ir.Attribute], object] = lambda a: a


def _is_int(a: ir.Attribute) -> bool:
    return isinstance(a, ir.IntegerAttr)


def _is_i64_array(a: ir.Attribute) -> bool:
    return isinstance(a, ir.DenseI64ArrayAttr)


I64 = AttrKind("64-bit integer", _is_int, lambda a: ir.IntegerAttr(a).value)
I64Array = AttrKind("array<i64: ...>", _is_i64_array, lambda a: list(ir.DenseI64ArrayAttr(a)))
String = AttrKind("string", lambda a: isinstance(a, ir.StringAttr), lambda a: ir.StringAttr(a).value)
Bool = AttrKind("bool", lambda a: isinstance(a, ir.BoolAttr), lambda a: ir.BoolAttr(a).value)
TypeAttrKind = AttrKind("type", lambda a: isinstance(a, ir.TypeAttr), lambda a: ir.TypeAttr(a).value)


def _dense_i64(a: ir.Attribute):
    import numpy as np

    return np.array(ir.DenseIntElementsAttr(a), dtype=np.int64)


DenseIndexArray = AttrKind(
    "dense<...> : tensor<...xi64>",
    lambda a: isinstance(a, ir.DenseIntElementsAttr)
    and ir.IntegerType(ir.ShapedType(a.type).element_type).width == 64,
    _dense_i64,
)


def StringEnum(*values: str) -> AttrKind:
    return AttrKind(
        "one of " + ", ".join(f'"{v}"' for v in values),
        lambda a: isinstance(a, ir.StringAttr) and ir.StringAttr(a).value in values,
        lambda a: ir.StringAttr(a).value,
    )


# --------------------------------------------------------------------------------------
# Ops
# --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Operand:
    name: str
    type: TypeConstraint
    variadic: bool = False


@dataclass(frozen=True)
class Result:
    name: str
    type: TypeConstraint


@dataclass(frozen=True)
class Attr:
    name: str
    kind: AttrKind
    optional: bool = False
    doc: str = ""


# Traits are plain strings; the set is closed so a typo is caught at import time.
TRAITS = {
    "pure": "no side effects; may be removed when unused",
    "view": "result aliases (part of) the first operand's storage",
    "reads": "reads the storage of a reference operand",
    "writes": "writes the storage of a reference operand",
}


class VerifyError(Exception):
    """Raised by an op's extra verifier; the message completes "'torchtpu.x' op ..."."""


@dataclass(frozen=True)
class OpSpec:
    name: str  # without the dialect prefix, e.g. "load"
    summary: str
    operands: tuple[Operand, ...] = ()
    results: tuple[Result, ...] = ()
    attributes: tuple[Attr, ...] = ()
    traits: frozenset[str] = frozenset()
    description: str = ""
    # Extra checks beyond arity, types and attributes. Receives the operation and the
    # attributes converted to Python values; raises VerifyError.
    verify: Optional[Callable[[ir.Operation, dict], None]] = None
    num_regions: int = 0

    def __post_init__(self) -> None:
        unknown = set(self.traits) - TRAITS.keys()
        if unknown:
            raise ValueError(f"{self.full_name}: unknown traits {sorted(unknown)}")
        variadic = [o for o in self.operands if o.variadic]
        if len(variadic) > 1:
            raise ValueError(f"{self.full_name}: at most one variadic operand group")

    @property
    def full_name(self) -> str:
        return f"{DIALECT}.{self.name}"


@dataclass
class Dialect:
    name: str
    ops: dict[str, OpSpec] = field(default_factory=dict)

    def op(self, spec: OpSpec) -> OpSpec:
        if spec.full_name in self.ops:
            raise ValueError(f"op {spec.full_name} declared twice")
        self.ops[spec.full_name] = spec
        return spec

    def lookup(self, full_name: str) -> Optional[OpSpec]:
        return self.ops.get(full_name)


TORCHTPU = Dialect(DIALECT)
