"""Indexing with a 0-d integer tensor (`k_cache[:, pos] = x`, `pos = torch.tensor(p)`).

PyTorch treats a 0-d integer tensor index as a Python int: it reads the value
(`.item()`), so tracing meets a data-dependent size (`GuardOnDataDependentSymNode`).
The same index as a 1-element tensor is advanced indexing, which traces with the value
unknown and lowers to a gather / scatter at a run-time position. So the Dynamo graph
is rewritten before tracing:

    x[a..., t, b...]       ->  x[a..., t.reshape(1), b...].squeeze(p)
    x[a..., t, b...] = v   ->  x[a..., t.reshape(1), b...] = v.expand(S).unsqueeze(p)

where S is the shape of the original selection and p is the position of t's dim in the
result of the 1-element form (PyTorch keeps the dim of adjacent advanced indices in
place and puts that of separated ones first). Several 0-d indices share that one dim.
Only indices whose other items are slices, ints, None and Ellipsis, on tensors of static
shape, are rewritten; anything else is left as it was.
"""

from __future__ import annotations

import operator

import torch
import torch.fx

_BASIC = (slice, int, type(None), type(Ellipsis))


def _val(node):
    return node.meta.get("example_value", node.meta.get("val")) if isinstance(node, torch.fx.Node) else None


def _is_scalar_index(item) -> bool:
    val = _val(item)
    return (isinstance(val, torch.Tensor) and val.dim() == 0 and not val.dtype.is_floating_point
            and not val.dtype.is_complex and val.dtype != torch.bool)


def _plan(node: torch.fx.Node):
    """(tensor node, index items, positions of the 0-d indices, result position p, shape S
    of the original selection), or None when the rewrite does not apply."""
    x, index = node.args[0], node.args[1]
    x_val = _val(x)
    if not isinstance(x_val, torch.Tensor) or any(not isinstance(s, int) for s in x_val.shape):
        return None
    items = list(index) if isinstance(index, tuple) else [index]
    scalar = [k for k, item in enumerate(items) if _is_scalar_index(item)]
    if not scalar or not all(isinstance(item, _BASIC) for i, item in enumerate(items) if i not in scalar):
        return None
    meta = torch.empty(tuple(x_val.shape), device="meta")
    try:
        shape = tuple(meta[tuple(0 if i in scalar else item for i, item in enumerate(items))].shape)
    except (IndexError, RuntimeError, TypeError):
        return None
    if scalar != list(range(scalar[0], scalar[-1] + 1)):
        return x, items, scalar, 0, shape  # separated advanced indices: their dim goes first
    # Adjacent: their dim stays in place, after the result dims of the items before
    # them (slices and None give one each, an Ellipsis the dims no other item consumes).
    consumed = sum(1 for i, item in enumerate(items) if i in scalar or isinstance(item, (slice, int)))
    p = 0
    for item in items[:scalar[0]]:
        if isinstance(item, (slice, type(None))):
            p += 1
        elif item is Ellipsis:
            p += x_val.dim() - consumed
    return x, items, scalar, p, shape


def rewrite_scalar_tensor_indices(gm: torch.fx.GraphModule) -> int:
    """Rewrites getitem / setitem with a 0-d integer tensor index; returns how many."""
    graph = gm.graph
    changed = 0
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target not in (operator.getitem, operator.setitem):
            continue
        plan = _plan(node)
        if plan is None:
            continue
        x, items, scalar, p, shape = plan
        with graph.inserting_before(node):
            ones = {k: graph.call_function(torch.reshape, (items[k], (1,))) for k in scalar}
            index = tuple(ones.get(i, item) for i, item in enumerate(items))
            if node.target is operator.getitem:
                picked = graph.call_function(operator.getitem, (x, index))
                with graph.inserting_after(picked):
                    result = graph.call_function(torch.squeeze, (picked, p))
                node.replace_all_uses_with(result)
            else:
                value = node.args[2]
                if isinstance(value, torch.fx.Node) and isinstance(_val(value), torch.Tensor):
                    value = graph.call_method("expand", (value, shape))
                    value = graph.call_method("unsqueeze", (value, p))
                result = graph.call_function(operator.setitem, (x, index, value))
                node.replace_all_uses_with(result)
        graph.erase_node(node)
        changed += 1
    if changed:
        gm.recompile()
    return changed
