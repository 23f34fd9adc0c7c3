"""torchtpu-narrow-iotas: 64-bit integer iotas computed as 32-bit iotas, then converted.

PyTorch's indices are int64: `torch.arange(n)` and every position or index a lowering makes
(argmax, sort, scatter, masks) are 64-bit iotas in StableHLO. The TPU has no 64-bit integer
unit; XLA:TPU emulates such values as pairs of 32-bit words, and in a fused program a 64-bit
iota's values came out wrong on a TPU v5e: a tiny Llama compiled on tpu tensors, whose
attention mask transformers derives from `torch.arange` position ids (packed-sequence
detection: a `diff`, a `cumsum` and gathers over them), differed from CPU by 1.4e-2 relative,
with every op of it exact when run alone; its module with the iotas made this way was exact
on the chip. A 32-bit iota converted to 64 bits gives the same values wherever the iota
dimension has fewer than 2^31 elements (all others are left alone), and the conversion fuses
into the iota's users on every backend.
"""

from __future__ import annotations

from ..context import ir
from ..ir import convert, element_type_of, iota, shape_of
from .base import Pass, ops_named, register_pass

_I32_LIMIT = 2**31  # iota values 0 .. size-1 fit in int32 below this


def _dimension(op: ir.Operation) -> int:
    return ir.IntegerAttr(op.attributes["iota_dimension"]).value


def _narrowable(op: ir.Operation) -> bool:
    element = element_type_of(op.result)
    if element.typeid != ir.IntegerType.static_typeid or ir.IntegerType(element).width != 64:
        return False
    size = shape_of(op.result)[_dimension(op)]
    return not ir.ShapedType.is_dynamic_size(size) and size < _I32_LIMIT


@register_pass
class NarrowIotasPass(Pass):
    argument = "torchtpu-narrow-iotas"
    summary = "Compute 64-bit integer iotas as 32-bit iotas converted to 64 bits"
    description = (
        "Rewrites each `stablehlo.iota` of a 64-bit integer type (i64, ui64) whose iota "
        "dimension is static and has fewer than 2^31 elements as a `stablehlo.iota` of i32 "
        "followed by a `stablehlo.convert` to the original type: the same values, and no "
        "64-bit iota for XLA:TPU, which emulates 64-bit integers and computed a fused 64-bit "
        "iota's values wrongly on a TPU v5e (a compiled Llama's attention mask built from "
        "`torch.arange` positions). Other iotas are left as they are."
    )

    def run(self, op: ir.Operation) -> None:
        for wide in ops_named(op, "stablehlo.iota"):
            if not _narrowable(wide):
                continue
            with ir.InsertionPoint(wide), wide.location:
                narrow = iota(shape_of(wide.result), _dimension(wide), ir.IntegerType.get_signless(32))
                converted = convert(narrow, element_type_of(wide.result))
            wide.result.replace_all_uses_with(converted)
            wide.erase()
