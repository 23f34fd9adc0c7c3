"""`check_direct`: numerical checks of overloads that make_fx never leaves in a graph.

CompositeImplicit overloads (`var.dim`, `rms_norm`, ...) are rewritten while tracing, so
`harness.check` cannot reach their lowerings; hand-built or exported graphs may still
hold them. This builds the one-node graph by hand, with eager results as metadata.
"""

from __future__ import annotations

import operator

import torch
import torch.utils._pytree as pytree
from harness import execute
from torch_tpu.compiler.importer import import_graph


def check_direct(op, *args, rtol=None, atol=None, **kwargs):
    """Lowers `op(*args, **kwargs)` as a one-node FX graph (tensor args, also those in
    lists, become inputs), runs it on XLA:CPU and compares every output with eager."""
    actual, expected = run_direct(op, *args, **kwargs)
    for a, e in zip(pytree.tree_leaves(actual), pytree.tree_leaves(expected)):
        torch.testing.assert_close(a, e, rtol=rtol, atol=atol, equal_nan=True)


def run_direct(op, *args, **kwargs):
    """(lowered results, eager results) of `op(*args, **kwargs)` as a one-node FX graph,
    for a caller that compares only part of them (an output eager leaves uninitialized)."""
    graph = torch.fx.Graph()
    # Tensors, also inside lists (the `_foreach_*` ops' Tensor[] arguments), become inputs.
    tensors = [a for a in pytree.tree_leaves(args) if isinstance(a, torch.Tensor)]
    inputs = []
    for i, t in enumerate(tensors):
        placeholder = graph.placeholder(f"t{i}")
        placeholder.meta["val"] = t
        inputs.append(placeholder)
    feed = iter(inputs)
    node_args = pytree.tree_map(lambda a: next(feed) if isinstance(a, torch.Tensor) else a, args)
    expected = op(*args, **kwargs)
    node = graph.call_function(op, node_args, kwargs)
    node.meta["val"] = expected
    if isinstance(expected, (tuple, list)):
        items = []
        for i, e in enumerate(expected):
            item = graph.call_function(operator.getitem, (node, i))
            item.meta["val"] = e
            items.append(item)
        graph.output(tuple(items))
    else:
        graph.output(node)
    return execute(import_graph(torch.fx.GraphModule({}, graph)), tensors), expected
