"""MLIR locations for FX nodes: the ATen op name around the user's source line, so a
diagnostic or a profile points at the model code (`loc("aten.addmm"("model.py":12:1))`).

Below both the importer and the lowering registry (whose errors name the node), so
neither imports the other for it."""

from __future__ import annotations

import torch
import torch.fx

from torch_tpu.core.user_frames import frames_of_trace, innermost_user

from .context import ir


def user_frame(stack_trace: str | None) -> tuple[str, int] | None:
    """The innermost frame of `stack_trace` that is user code (`core/user_frames.py`
    decides; the innermost frame if none is)."""
    frames = frames_of_trace(stack_trace)
    if not frames:
        return None
    return innermost_user(frames) or frames[-1]


def op_name(node: torch.fx.Node) -> str:
    target = node.target
    if isinstance(target, str):
        return target
    if isinstance(target, torch._ops.OpOverload):
        return str(target)  # "aten.add.Tensor", "aten.tanh.default"
    return getattr(target, "__name__", str(target))


def node_frame(node: torch.fx.Node) -> tuple[tuple[str, int] | None, bool]:
    """The user's source line for `node` and whether it is the node's own. Nodes that
    PyTorch's graph passes add have no stack trace (Dynamo's tensorify pass writes the
    float arithmetic of GPT-2's GELU under dynamic=True as `true_divide`, `scalar_tensor`
    nodes): they borrow the line of the nearest node that uses their result, else of the
    nearest one whose result they use, so an error about them still points at the model."""
    own = user_frame(node.meta.get("stack_trace"))
    if own is not None:
        return own, True
    for direction in ("users", "inputs"):
        seen = {node}
        frontier = [node]
        while frontier:
            nxt = []
            for n in frontier:
                for m in (n.users if direction == "users" else n.all_input_nodes):
                    if m in seen:
                        continue
                    seen.add(m)
                    frame = user_frame(m.meta.get("stack_trace"))
                    if frame is not None:
                        return frame, False
                    nxt.append(m)
            frontier = nxt
    return None, False


def node_location(node: torch.fx.Node) -> ir.Location:
    frame, _ = node_frame(node)
    child = ir.Location.file(frame[0], frame[1], 1) if frame else ir.Location.unknown()
    return ir.Location.name(op_name(node), childLoc=child)


def describe_node(node: torch.fx.Node) -> str:
    """`aten.addmm.default (node addmm_3) at model.py:12`, for error messages (`near
    model.py:12` for a node PyTorch added, from a neighbour's line: `node_frame`)."""
    frame, own = node_frame(node)
    where = f" {'at' if own else 'near'} {frame[0]}:{frame[1]}" if frame else ""
    return f"{op_name(node)} (node {node.name}){where}"
