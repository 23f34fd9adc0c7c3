"""The `torchtpu` op table. Adding an op is one `TORCHTPU.op(OpSpec(...))` entry here;
its verifier and its section of docs/reference/dialect.md follow from it."""

from __future__ import annotations

from ..context import ir
from .spec import (
    TORCHTPU,
    AnyRankedTensor,
    Operand,
    OpSpec,
    Ref,
    Result,
    VerifyError,
    ref_tensor_type,
)


def _same_tensor_type(ref_type: ir.Type, value_type: ir.Type, what: str) -> None:
    tensor = ref_tensor_type(ref_type)
    if tensor != value_type:
        raise VerifyError(f"{what} type {value_type} does not match the referenced type {tensor}")


def _verify_load(op: ir.Operation, attrs: dict) -> None:
    """the result type is the referenced tensor type"""
    _same_tensor_type(op.operands[0].type, op.results[0].type, "result")


def _verify_store(op: ir.Operation, attrs: dict) -> None:
    """the stored value's type is the referenced tensor type"""
    _same_tensor_type(op.operands[0].type, op.operands[1].type, "stored value")


TORCHTPU.op(
    OpSpec(
        "load",
        summary="Reads the current value of a reference.",
        description=(
            "`%v = torchtpu.load %ref` yields the tensor value stored in `%ref` at this "
            "point of the program. Its type is the referenced tensor type."
        ),
        operands=(Operand("ref", Ref),),
        results=(Result("value", AnyRankedTensor),),
        traits=frozenset({"reads"}),
        verify=_verify_load,
    )
)

TORCHTPU.op(
    OpSpec(
        "store",
        summary="Overwrites the value of a reference.",
        description=(
            "`torchtpu.store %ref, %value` replaces the contents of `%ref` (and, through "
            "aliasing, of every view of the same storage) with `%value`, which must have "
            "the referenced tensor type."
        ),
        operands=(Operand("ref", Ref), Operand("value", AnyRankedTensor)),
        traits=frozenset({"writes"}),
        verify=_verify_store,
    )
)
