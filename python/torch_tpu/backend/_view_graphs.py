"""Graphs that only take views of their inputs run as PyTorch eager code, not as a program.

`return loss.detach()` after a compiled `opt.step()`, `x.t()`, `h.view(b, s, -1)` on their own
make Dynamo graphs whose outputs all alias the graph's inputs. aot_autograd rebuilds such
outputs from the inputs itself (`OutputType.alias_of_input`): a program computing them would
compute nothing the caller keeps, yet reading its arguments waits for their values -- on tpu
tensors, a deferred training step's program runs at that read, with the gradients a loop
drops only at its next step still held, so it writes them all (one more output per parameter).
Eager view ops on tpu tensors read no value: they share the input's storage, as in eager.
"""

from __future__ import annotations

import operator

import torch
import torch.fx


def only_views(gm: torch.fx.GraphModule) -> bool:
    """Whether every op of `gm` is an ATen view op (its result aliases its input: `detach`,
    `view`, `t`, `slice`, `expand`, `as_strided`, ...) or an item of a view op's list
    (`split`, `unbind`), and it has at least one: nothing is computed, nothing written."""
    ops = [node for node in gm.graph.nodes if node.op not in ("placeholder", "output")]
    if not ops:
        return False  # (an empty graph: returning its inputs is the ordinary path's)
    for node in ops:
        if node.op != "call_function":
            return False
        if node.target is operator.getitem:
            continue
        if not isinstance(node.target, torch._ops.OpOverload) or not node.target.is_view:
            return False
    return True
