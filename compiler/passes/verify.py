"""torchtpu-verify: checks every `torchtpu` op against the dialect table."""

from __future__ import annotations

from ..context import ir
from ..dialect import verify_module
from .base import Pass, register_pass


@register_pass
class VerifyPass(Pass):
    argument = "torchtpu-verify"
    summary = "Check every torchtpu op and type against the dialect table"
    description = (
        "MLIR parses `torchtpu` ops generically (the dialect is unregistered), so their "
        "operand counts, types, attributes and op-specific rules are checked here, from "
        "the declarative table in `compiler/dialect/ops.py`. Every pipeline built by "
        "torch_tpu starts with this pass; each violation is a located error."
    )

    def run(self, op: ir.Operation) -> None:
        # verify_module reports with the op name already in the message; prefix the
        # pass name through our own engine view.
        before = len(self.engine.diagnostics)
        verify_module(op, self.engine)
        for diag in self.engine.diagnostics[before:]:
            diag.message = f"{self.argument}: {diag.message}"
