"""torchtpu-elide-roundings: a 16-bit intermediate result read back in float32 is read unrounded.

Each op of a bfloat16 (or float16) graph rounds its result to that dtype, and the lowerings
spell it so: the op computes in float32 (PyTorch's opmath) and converts its result to
bfloat16; the next op converts it back to float32. Between two ops that XLA fuses into one
kernel that round trip is all the 16-bit dtype still does.

`torch.compile`'s own compiler drops these roundings: inductor computes a fused kernel's
16-bit intermediates in float32 and rounds only what it stores, unless
`torch._inductor.config.emulate_precision_casts` is set. This pass is that rule for
StableHLO: `convert(convert(x : f32 -> bf16) -> f32)` becomes `x`, for float16 likewise, the
narrowing convert staying for its other users (what the graph stores or returns is still
rounded once). The results are closer to the exact values, and differ from eager's by the
last bit where an intermediate rounding would have carried.

It is inductor's semantics, not a speed-up. The 21st session took the round trip inside the
matrix products that recompute SiLU for the cause of their slowness against JAX's (0.195 ms
against 0.144 for the down projection's fusion); on the chip without it (22nd session) that
fusion still ran 0.193 ms, with JAX's tiling, and the 4-layer training step took 17.10 ms
against 17.02 with every rounding kept (v5e, 4 x 512 tokens). Keeping the roundings of
values that more than one op reads (stored in 16 bits rather than widened to float32) was
slower still: 17.26 ms.

Roundings inductor keeps are kept too:

* a cast the user wrote (`x.to(torch.bfloat16).float()`: `aten._to_copy`,
  `prims.convert_element_type`, ... -- the ATen op the importer names in the convert's
  location): an explicit rounding is the program's meaning, not an intermediate's;
* a rounding whose value reaches a comparison through elementwise ops (`silu(x) * y > 0.5`):
  an unrounded value can fall on the other side of a tie, which no tolerance absorbs;
* what a lowering rounds on purpose: a constant or a 0-dim value narrowed and widened again
  is a scalar rounded to the tensor's dtype before it is used (PyTorch's kernels round
  `alpha` and the scalar of `x + 0.3` so), as is a broadcast of one.
"""

from __future__ import annotations

from ..context import ir
from ..diagnostics import location_name
from ..ir import element_type_of
from ._partition_rules import ELEMENTWISE
from .base import Pass, defining_op, operation_of, ops_named, register_pass

# The 16-bit float types whose roundings inductor does not emulate, and the type they are
# computed in.
NARROW_TYPES = ("bf16", "f16")
WIDE_TYPE = "f32"
# ATen ops whose conversion is a cast the user wrote (the importer names the op in each
# MLIR op's location; overloads after the last dot).
_EXPLICIT_CASTS = frozenset({
    "aten._to_copy", "aten.to", "aten._autocast_to_reduced_precision", "aten.type_as",
    "prims.convert_element_type", "aten.copy", "aten.copy_",
})
# Ops through which a value reaches a comparison elementwise: the partitioner's elementwise
# ops, and the shape ops (they move elements, not change them). A path through anything else
# ends: what a reduction or a product computes from a value is not that value's tie.
_ELEMENTWISE = ELEMENTWISE | frozenset({
    "stablehlo.broadcast_in_dim", "stablehlo.reshape", "stablehlo.transpose",
    "chlo.erf", "chlo.erf_inv", "chlo.tan", "chlo.asin", "chlo.acos", "chlo.atan",
})
# How many ops a search for a comparison visits from one rounding: paths longer than a fused
# chain of pointwise ops are not followed (the answer is then "no comparison").
_SEARCH_LIMIT = 256


def _is_scalar_rounding(source: ir.Value) -> bool:
    """`source` is a constant, a 0-dim value or a broadcast of one: rounding it is a
    scalar's rounding that the op's definition asks for, not an intermediate's."""
    if not ir.ShapedType(source.type).rank:
        return True
    producer = defining_op(source)
    if producer is None:
        return False
    if producer.name == "stablehlo.constant":
        return True
    if producer.name == "stablehlo.broadcast_in_dim":
        return _is_scalar_rounding(producer.operands[0])
    return False


def is_explicit_cast(narrow: ir.Operation) -> bool:
    name = location_name(narrow.location)
    return name is not None and name.rsplit(".", 1)[0] in _EXPLICIT_CASTS


def reaches_comparison(value: ir.Value) -> bool:
    """Whether `value` flows into a `stablehlo.compare` through elementwise ops."""
    pending, visited = [value], 0
    while pending and visited < _SEARCH_LIMIT:
        for use in pending.pop().uses:
            user = operation_of(use.owner)
            visited += 1
            if user.name == "stablehlo.compare":
                return True
            if user.name in _ELEMENTWISE:
                pending.extend(user.results)
    return False


def _elidable(widen: ir.Operation) -> ir.Value | None:
    """The float32 value a widening `convert` re-reads through an implicit 16-bit rounding
    that inductor would not emulate, if any."""
    narrow = defining_op(widen.operands[0])
    if narrow is None or narrow.name != "stablehlo.convert":
        return None
    source = narrow.operands[0]
    if source.type != widen.result.type:  # (shape and element type, dynamic dims included)
        return None
    if str(element_type_of(source)) != WIDE_TYPE or str(element_type_of(narrow.result)) not in NARROW_TYPES:
        return None
    if _is_scalar_rounding(source) or is_explicit_cast(narrow) or reaches_comparison(widen.result):
        return None
    return source


@register_pass
class ElideRoundingsPass(Pass):
    argument = "torchtpu-elide-roundings"
    summary = "Read 16-bit intermediates that are widened again without their rounding"
    description = (
        "Replaces `convert(convert(x : f32 -> bf16|f16) -> f32)` with `x`: an op's 16-bit "
        "result read back in float32 by the next op is read unrounded, as inductor computes "
        "fused 16-bit intermediates (`torch._inductor.config.emulate_precision_casts` off, its "
        "default). The narrowing convert stays where something else reads it (a stored or "
        "returned result is rounded once). Kept as inductor keeps them: casts the user wrote "
        "(the convert's location names `aten._to_copy`, `prims.convert_element_type`, ...), "
        "roundings whose value reaches a `stablehlo.compare` through elementwise ops, and "
        "constants, 0-dim values and broadcasts of them (a scalar rounded to the tensor's "
        "dtype is part of the op's definition). "
        "`torch.compile(backend=\"tpu\")` runs it unless that inductor setting is on."
    )

    def run(self, op: ir.Operation) -> None:
        narrowings: list[ir.Operation] = []
        for widen in ops_named(op, "stablehlo.convert"):
            source = _elidable(widen)
            if source is None:
                continue
            narrow = defining_op(widen.operands[0])
            if narrow not in narrowings:  # (two widenings may read one; compared while alive)
                narrowings.append(narrow)
            widen.result.replace_all_uses_with(source)
            widen.erase()
        for narrow in narrowings:
            if not list(narrow.result.uses):
                narrow.erase()
