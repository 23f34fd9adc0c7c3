"""torchtpu-narrow-opmath: a 16-bit op that a lowering spelled in float32 is a 16-bit op again.

PyTorch's kernels compute a bfloat16 (or float16) op in float32 ("opmath") and round its
result, and the lowerings spell that: `convert(add(convert(a : bf16 -> f32), convert(b) ) ->
bf16)`. The float32 spelling decides where the value is rounded, and so, once
`torchtpu-elide-roundings` has read the intermediates unrounded, what XLA stores: a value that
several kernels read (the residual stream, its gradient) is written in float32, twice the bytes
that inductor or JAX write for it.

This pass gives that decision back to XLA. An elementwise op in float32 whose operands are
16-bit values widened (or constants and broadcasts exact in 16 bits) and whose only users round
its result to that 16-bit type becomes the op on the 16-bit type: `add(a, b) : bf16`. Its
meaning is the same -- XLA computes a 16-bit arithmetic op in float32 and rounds the result,
the float32 form's value -- and XLA's fusion then decides what is stored: a kernel writes 16
bits, as inductor's kernels and JAX's programs do. Inside a kernel XLA may keep a 16-bit
result in float32 (its excess-precision rule: XLA:TPU computes fused 16-bit ops in float32,
marked with their original type) or round each as eager does (XLA:CPU, measured). On the v5e a
4-layer Llama training step went from 16.78 to 16.61 ms of device time (the residual stream and
its gradient written in bfloat16).

An operand that is itself a float32 result rounded by a lowering (SiLU's, RMSNorm's) keeps its
op in float32: `torchtpu-elide-roundings`, which runs next, reads that operand unrounded, as
inductor does -- only values that were 16-bit before any float32 computation (arguments,
matrix products, other 16-bit ops) make a 16-bit op.

Only arithmetic whose float32 result, rounded once, is what any XLA backend computes for the
16-bit op (add, subtract, multiply, divide, negate, abs, maximum, minimum); transcendental
ops stay in float32 (a backend may evaluate them natively in 16 bits, less accurately than
PyTorch's kernels). Roundings the user wrote, and roundings whose value reaches a comparison,
stay as `torchtpu-elide-roundings` keeps them: the op is not narrowed.
"""

from __future__ import annotations

import struct

import numpy as np

from ..context import ir
from ..ir import element_type_of, tensor_type
from .base import Pass, defining_op, operation_of, ops_named, register_pass
from .elide_roundings import NARROW_TYPES, WIDE_TYPE, is_explicit_cast, reaches_comparison

# Elementwise arithmetic whose 16-bit form every XLA backend computes as the float32 op rounded
# once (the float32 form's meaning); transcendental ops are left in float32.
_NARROWABLE = frozenset("stablehlo." + n for n in (
    "add", "subtract", "multiply", "divide", "negate", "abs", "maximum", "minimum",
))


def _exact_in(value: float, narrow: str) -> bool:
    """Whether float32 `value` is exactly representable in the 16-bit type `narrow`."""
    if value != value:  # NaN: its payload is not worth a rule
        return False
    if narrow == "bf16":  # bfloat16 is float32's upper half
        return struct.unpack("<I", struct.pack("<f", value))[0] & 0xFFFF == 0
    return float(np.float16(value)) == value


def _exact_splat(constant: ir.Operation, narrow: ir.Type) -> float | None:
    """The value of a splat float constant that `narrow` holds exactly, else None (another
    constant, a dense_resource blob, a value `narrow` would round)."""
    attr = constant.attributes["value"]  # (the bindings hand back the attribute's own class)
    if not isinstance(attr, ir.DenseFPElementsAttr) or not attr.is_splat:
        return None
    value = ir.FloatAttr(attr.get_splat_value()).value
    return value if _exact_in(value, str(narrow)) else None


def _narrowed_operand(value: ir.Value, narrow: ir.Type) -> ir.Value:
    """The 16-bit value that float32 `value`, which `_is_widened` accepted, widens: the
    converted value, or the constant or broadcast rebuilt in `narrow` before `value`'s
    definition."""
    producer = defining_op(value)
    if producer.name == "stablehlo.convert":
        return producer.operands[0]
    shape = ir.RankedTensorType(value.type).shape
    with ir.InsertionPoint(producer), producer.location:
        if producer.name == "stablehlo.constant":
            splat = ir.DenseElementsAttr.get_splat(tensor_type(shape, narrow),
                                                   ir.FloatAttr.get(narrow, _exact_splat(producer, narrow)))
            return ir.Operation.create("stablehlo.constant", results=[splat.type], attributes={"value": splat}).result
        inner = _narrowed_operand(producer.operands[0], narrow)  # a broadcast_in_dim
        return ir.Operation.create("stablehlo.broadcast_in_dim", results=[tensor_type(shape, narrow)],
                                   operands=[inner], attributes=dict(producer.attributes)).result


def _rounding_users(op: ir.Operation) -> list[ir.Operation] | None:
    """The converts that round `op`'s float32 result to one 16-bit type, if they are its only
    users, none is a cast the user wrote and the value reaches no comparison; else None."""
    users = [operation_of(use.owner) for use in op.result.uses]
    if not users or any(u.name != "stablehlo.convert" for u in users):
        return None
    types = {str(element_type_of(u.result)) for u in users}
    if len(types) != 1 or types.pop() not in NARROW_TYPES:
        return None
    if any(is_explicit_cast(u) or reaches_comparison(u.result) for u in users):
        return None
    return users


def _narrow(op: ir.Operation) -> bool:
    """Rewrites `op` as its 16-bit form if it qualifies; whether it did."""
    if len(op.results) != 1 or str(element_type_of(op.result)) != WIDE_TYPE:
        return False
    users = _rounding_users(op)
    if users is None:
        return False
    narrow = element_type_of(users[0].result)
    if not all(_is_widened(v, narrow) for v in op.operands):
        return False
    operands = [_narrowed_operand(v, narrow) for v in op.operands]
    with ir.InsertionPoint(op), op.location:
        narrowed = ir.Operation.create(op.name, results=[users[0].result.type], operands=operands,
                                       attributes=dict(op.attributes))
    for user in users:
        user.result.replace_all_uses_with(narrowed.result)
        user.erase()
    op.erase()
    return True


def _is_rounding(value: ir.Value) -> bool:
    """Whether 16-bit `value` is a float32 computation's result rounded implicitly (a
    lowering's opmath rounding, not a cast the user wrote): `torchtpu-elide-roundings` reads
    such a value unrounded, so an op reading it stays in float32."""
    producer = defining_op(value)
    return (producer is not None and producer.name == "stablehlo.convert"
            and str(element_type_of(producer.operands[0])) == WIDE_TYPE and not is_explicit_cast(producer))


def _is_widened(value: ir.Value, narrow: ir.Type) -> bool:
    """Whether float32 `value` is a 16-bit `narrow` value widened: a `convert` of one that is
    not a lowering's rounding (`_is_rounding`), a splat constant `narrow` holds exactly, or a
    broadcast of either."""
    producer = defining_op(value)
    if producer is None:
        return False
    if producer.name == "stablehlo.convert":
        source = producer.operands[0]
        return element_type_of(source) == narrow and not _is_rounding(source)
    if producer.name == "stablehlo.constant":
        return _exact_splat(producer, narrow) is not None
    if producer.name == "stablehlo.broadcast_in_dim":
        return _is_widened(producer.operands[0], narrow)
    return False


@register_pass
class NarrowOpmathPass(Pass):
    argument = "torchtpu-narrow-opmath"
    summary = "Write 16-bit arithmetic spelled in float32 as the 16-bit op, so XLA decides what it rounds"
    description = (
        "Replaces `convert(op(convert(a : bf16 -> f32), ...) -> bf16)` with `op(a, ...) : bf16` "
        "for add, subtract, multiply, divide, negate, abs, maximum and minimum whose operands are "
        "widened 16-bit values, constants exact in 16 bits or broadcasts of them, and whose "
        "result is only rounded to that type (float16 likewise). The op's meaning is unchanged "
        "(the float32 result rounded once); XLA's excess-precision rule then keeps fused "
        "intermediates in float32 and rounds what a kernel writes. Casts the user wrote and "
        "roundings whose value reaches a `stablehlo.compare` are kept. "
        "`torch.compile(backend=\"tpu\")` runs it before `torchtpu-elide-roundings`."
    )

    def run(self, op: ir.Operation) -> None:
        # Post-order: an op's operands are narrowed before it, so a chain narrows in one walk.
        for candidate in ops_named(op, *_NARROWABLE):
            _narrow(candidate)
        # The widenings, broadcasts and constants the 16-bit ops replaced, users before producers.
        for dead in reversed(ops_named(op, "stablehlo.convert", "stablehlo.broadcast_in_dim", "stablehlo.constant")):
            if not list(dead.result.uses):
                dead.erase()
