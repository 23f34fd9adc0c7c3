"""Why a node runs in PyTorch eager, said so that the user knows what to do.

A node falls back for one of a few reasons, and each asks for something different:

* no lowering: torch_tpu lacks the op; reporting it gets a lowering written;
* a symbolic scalar argument: a Python number that changes between calls is traced as a
  graph input, and the op's lowering needs its value at compile time;
* a bounded-dynamism limit: the op cannot work on padded (bounded-dynamic) dimensions, a
  documented limit, so there is nothing to report; static dimensions compile;
* a lowering error: the op's lowering rejected these particular arguments;
* a collective in a one-device graph (torch_tpu.spmd compiles those);
* the pass pipeline or XLA rejected the module at this op (`_recovery.py`);
* a custom op without a lowering whose implementation cannot be traced into ATen
  (`_custom_ops.py`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.fx
import torch.utils._pytree as pytree

from torch_tpu.compiler.lowering import DynamicFallback, LoweringError, UnsupportedOpError
from torch_tpu.compiler.lowering.registry import DynamicLimit

NO_LOWERING = "no lowering"
SYMBOLIC_SCALAR = "symbolic scalar argument"
DYNAMIC_SHAPE = "bounded-dynamism limit"
LOWERING_ERROR = "lowering error"
COLLECTIVE = "collective"
COMPILER_REJECTED = "rejected by the pass pipeline or XLA"
CUSTOM_OP = "untraceable custom op"


@dataclass(frozen=True)
class FallbackReason:
    kind: str
    detail: str = ""

    def explain(self, op: str) -> str:
        """The log line for op `op` running in eager for this reason."""
        if self.kind == NO_LOWERING:
            return (f"torch_tpu: {op} has no lowering; it runs in PyTorch eager. Please report the op "
                    "name to the torch_tpu issue tracker so it gets a lowering.")
        if self.kind == SYMBOLIC_SCALAR:
            return (f"torch_tpu: {op} cannot be compiled: {self.detail}; it runs in PyTorch eager. Pass "
                    "the value as a tensor, or let Dynamo specialize it (torch._dynamo.config."
                    "specialize_float = True, or specialize_int for ints: one compile per value).")
        if self.kind == DYNAMIC_SHAPE:
            return (f"torch_tpu: {op} cannot be compiled with bounded-dynamic shapes ({self.detail}); it "
                    "runs in PyTorch eager. This is a documented limit of bounded dynamism "
                    "(docs/explanation/bounded-dynamism.md); the op compiles when this dimension is "
                    "static (not marked dynamic).")
        if self.kind == COMPILER_REJECTED:
            return (f"torch_tpu: {op} cannot be compiled ({self.detail}); it runs in PyTorch eager and "
                    "the rest of the graph compiled. Set TORCH_TPU_DUMP_DIR to get the module, and "
                    "please report this message to the torch_tpu issue tracker.")
        if self.kind == CUSTOM_OP:
            return (f"torch_tpu: custom op {op} has no lowering and {self.detail}; it runs in PyTorch "
                    "eager. Make its implementation traceable (torch ops on its arguments only: no "
                    ".item(), .tolist(), numpy or data-dependent Python control flow), or give it a "
                    "lowering with @torch_tpu.register_lowering (docs/howto/write-a-lowering.md).")
        if self.kind == COLLECTIVE:
            return f"torch_tpu: {op} runs in PyTorch eager: {self.detail}."
        return (f"torch_tpu: {op} cannot be compiled: its lowering rejected these arguments ({self.detail}); "
                "it runs in PyTorch eager. If PyTorch eager accepts them, please report this message to "
                "the torch_tpu issue tracker.")

    def __str__(self) -> str:
        return f"{self.kind}: {self.detail}" if self.detail else self.kind


def unsupported(node: torch.fx.Node) -> FallbackReason:
    """A node whose target has no lowering (for `torch.cond`, which has one: the op in
    one of its branches that has none)."""
    if node.target is torch.ops.higher_order.cond:
        from torch_tpu.compiler.importer.fx_importer import cond_branches, is_supported

        for name, branch in cond_branches(node).items():
            inner = next((n for n in branch.graph.nodes if n.op == "call_function" and not is_supported(n)), None)
            if inner is not None:
                return FallbackReason(LOWERING_ERROR, f"its branch {name} holds {inner.target}, which has no lowering")
    return FallbackReason(NO_LOWERING)


def from_error(node: torch.fx.Node, err: LoweringError) -> FallbackReason:
    """The reason behind a lowering's failure on `node`."""
    if isinstance(err, DynamicFallback) or isinstance(err.reason, DynamicLimit):
        return FallbackReason(DYNAMIC_SHAPE, str(err.reason))
    if isinstance(err, UnsupportedOpError):
        return FallbackReason(NO_LOWERING, err.reason)
    scalars = symbolic_scalar_args(node)
    if scalars:
        names = ", ".join(f"{name} ({kind})" for name, kind in scalars)
        return FallbackReason(
            SYMBOLIC_SCALAR,
            f"argument {names} is a Python number traced as a symbolic value (it changed between "
            f"calls), and the lowering needs it at compile time: {err.reason}",
        )
    return FallbackReason(LOWERING_ERROR, err.reason)


def symbolic_scalar_args(node: torch.fx.Node) -> list[tuple[str, str]]:
    """(name, kind) of the arguments of `node` that are symbolic Python scalars: SymFloat,
    SymBool, or SymInt graph inputs that are not the size of an input tensor (aot_autograd
    passes the sizes of dynamic dimensions as SymInt inputs too)."""
    sizes = _input_size_symbols(node.graph)
    found = []
    for arg in pytree.tree_leaves((node.args, node.kwargs)):
        if not isinstance(arg, torch.fx.Node):
            continue
        val = arg.meta.get("val")
        if isinstance(val, (torch.SymFloat, torch.SymBool)) or (
            isinstance(val, torch.SymInt) and arg.op == "placeholder" and val.node.expr not in sizes
        ):
            found.append((arg.name, type(val).__name__))
    return found


def _input_size_symbols(graph: torch.fx.Graph) -> set:
    symbols = set()
    for p in graph.find_nodes(op="placeholder"):
        val = p.meta.get("val")
        if isinstance(val, torch.Tensor):
            symbols.update(s.node.expr for s in val.shape if isinstance(s, torch.SymInt))
    return symbols
