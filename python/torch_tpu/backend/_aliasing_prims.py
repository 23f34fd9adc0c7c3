"""PyTorch primitives (`torch.ops.prims.*`) that return a view in a user's graph.

aot_autograd's functionalization rejects every non-ATen operator whose output carries an
alias annotation (`prims::squeeze(Tensor(a) a, int[] dimensions) -> Tensor(a)`: "custom
(non-ATen) operator whose output has alias annotations"), and the importer has no
lowerings for prims. Each prim carries its own ATen implementation (`impl_aten`:
`torch.squeeze`, `a.view(a.shape)`, `torch.permute`...), so the Dynamo graph calls that
instead; aot_autograd (or the torchtpu capture) then traces it into ATen views, which
functionalize and lower like any other.
"""

from __future__ import annotations

import logging

import torch
import torch.fx

log = logging.getLogger("torch_tpu")


def _aliasing_prim(target) -> torch._ops.OpOverload | None:
    """The prims overload `target` names when its result aliases an argument, else None."""
    if isinstance(target, torch._ops.OpOverloadPacket):
        overloads = target.overloads()
        target = getattr(target, overloads[0]) if len(overloads) == 1 else None
    if not isinstance(target, torch._ops.OpOverload) or target.namespace != "prims":
        return None
    if not any(r.alias_info is not None for r in target._schema.returns):
        return None
    return target


def decompose_aliasing_prims(gm: torch.fx.GraphModule) -> int:
    """Points every aliasing prim of `gm` at its ATen implementation; returns how many
    nodes changed."""
    changed = 0
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        prim = _aliasing_prim(node.target)
        impl = getattr(prim, "impl_aten", None) if prim is not None else None
        if impl is None:
            continue
        log.debug("torch_tpu: %s in the graph runs as its ATen implementation", prim)
        node.target = impl
        changed += 1
    if changed:
        gm.recompile()
    return changed
