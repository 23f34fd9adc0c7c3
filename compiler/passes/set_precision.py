"""torchtpu-set-precision: precision_config on matrix ops from the precision mode."""

from __future__ import annotations

from torch_tpu.core import attributes

from ..context import ir
from .base import Option, Pass, register_pass

# PyTorch's float32 matmul precision names -> StableHLO precision values. "medium" is
# one bf16 pass on the TPU matrix unit (TPUs' default), "high" three, "highest" six.
MODE_TO_PRECISION = {"medium": "DEFAULT", "high": "HIGH", "highest": "HIGHEST"}
MATRIX_OPS = ("stablehlo.dot_general", "stablehlo.dot", "stablehlo.convolution")
# A lowering whose algorithm needs its own precision (linear algebra is never computed
# in reduced-precision passes) marks the op with this unit attribute; the pass keeps
# that op's precision_config even with override=true, and removes the marker.
FIXED_PRECISION = attributes.FIXED_PRECISION
# The mode is PyTorch's *float32* matmul precision (`torch.set_float32_matmul_precision`):
# it governs products of f32 (and complex64) operands only; a bf16, f16 or integer
# product keeps the precision it has (unset: the backend's default, as in JAX).
_MODE_ELEMENT_TYPES = ("f32", "complex<f32>")


def _takes_the_mode(op: ir.Operation) -> bool:
    """Whether the precision mode governs `op`: one of its operands holds f32 or complex64."""
    return any(str(ir.ShapedType(v.type).element_type) in _MODE_ELEMENT_TYPES for v in op.operands)


def _has_explicit_precision(op: ir.Operation) -> bool:
    """True when `op` carries a precision other than DEFAULT for some operand: DEFAULT
    means "the backend's choice", so a config of DEFAULTs says nothing and is replaced."""
    if "precision_config" not in op.attributes:
        return False
    config = ir.ArrayAttr(op.attributes["precision_config"])
    return any(str(p) != "#stablehlo<precision DEFAULT>" for p in config)


@register_pass
class SetPrecisionPass(Pass):
    argument = "torchtpu-set-precision"
    summary = "Set precision_config on dot_general/dot/convolution from the precision mode"
    description = (
        "Implements `torch.set_float32_matmul_precision` for XLA: each "
        "`stablehlo.dot_general`, `stablehlo.dot` and `stablehlo.convolution` gets "
        "`precision_config` = [P, P] with P = DEFAULT (medium), HIGH (high) or HIGHEST "
        "(highest) when an operand is f32 or complex64: the mode is PyTorch's float32 matmul "
        "precision, and bf16, f16 or integer products keep the precision they have. A "
        "precision_config that is all DEFAULT (\"the backend's choice\", "
        "which JAX writes on every dot and convolution) counts as unset. Ops that already "
        "carry an explicit HIGH or HIGHEST keep it unless `override=true`; ops marked `torchtpu.fixed_precision` (set by lowerings whose "
        "algorithm needs its own precision, such as linear algebra) always keep it, and "
        "the marker is removed."
    )
    options = (
        Option("mode", str, "medium", "matmul precision mode", choices=tuple(MODE_TO_PRECISION)),
        Option("override", bool, False, "replace precision_config already present"),
    )

    def run(self, op: ir.Operation) -> None:
        context = op.context
        precision = ir.Attribute.parse(f"#stablehlo<precision {MODE_TO_PRECISION[self.mode]}>", context)
        config = ir.ArrayAttr.get([precision, precision], context)

        def visit(inner: ir.Operation) -> ir.WalkResult:
            inner = inner.operation
            if inner.name in MATRIX_OPS:
                if FIXED_PRECISION in inner.attributes:
                    del inner.attributes[FIXED_PRECISION]
                elif _takes_the_mode(inner) and (self.override or not _has_explicit_precision(inner)):
                    inner.attributes["precision_config"] = config
            return ir.WalkResult.ADVANCE

        op.walk(visit)


# Custom calls that run a kernel compiled from its own source (Pallas' Mosaic kernels on the
# TPU, Triton and Mosaic GPU kernels): the products inside were traced under the precision
# mode in effect (`jax_op`, the flash-attention kernels) and no pass reaches them, so a
# program holding one depends on the mode as a program with a float32 product does.
_KERNEL_CALL_TARGETS = ("tpu_custom_call", "__gpu$xla.gpu.triton", "triton_kernel_call_ffi")
_KERNEL_CALL_PREFIXES = ("mosaic_gpu",)


def _is_kernel_call(op: ir.Operation) -> bool:
    if op.name != "stablehlo.custom_call" or "call_target_name" not in op.attributes:
        return False
    target = ir.StringAttr(op.attributes["call_target_name"]).value
    return target in _KERNEL_CALL_TARGETS or target.startswith(_KERNEL_CALL_PREFIXES)


def precision_dependent(op: ir.Operation) -> bool:
    """Whether what `op` computes depends on the precision mode: it holds a matrix op on
    f32 or complex64 operands, or a compiled kernel's custom call (traced under the mode).
    Callers that cache compiled programs key only those programs by the mode."""
    found = False

    def visit(inner: ir.Operation) -> ir.WalkResult:
        nonlocal found
        inner = inner.operation
        if (inner.name in MATRIX_OPS and _takes_the_mode(inner)) or _is_kernel_call(inner):
            found = True
            return ir.WalkResult.INTERRUPT
        return ir.WalkResult.ADVANCE

    op.walk(visit)
    return found
