"""Ops that address their input's *storage* read from the storage's root node.

`x.as_strided(size, stride, offset)` ignores `x`'s own sizes, strides and offset: the
arguments index the storage `x` shares with its base. When `x` is a view (`diagonal`,
`narrow`, `select`, a stepped slice, `expand`, `_unsafe_view`...), the view's value holds
only some of that storage, so neither a lowering nor an eager fallback given the view's
value can read what eager reads. aot_autograd's inference graphs keep such chains as
they are (`diagonal -> as_strided`), and so does the non-functional capture.

`rebase_storage_views` rewrites the input of every storage-addressing op to the
furthest node up the view chain that holds the same storage (a graph input, or the
tensor the graph created it from). The op's arguments stay valid unchanged, since they
were storage positions all along. The views it read through become dead and are
removed.
"""

from __future__ import annotations

import operator

import torch
import torch.fx
from torch.multiprocessing.reductions import StorageWeakRef

aten = torch.ops.aten

# Ops whose size/stride/storage_offset arguments are positions in the input's storage.
# (as_strided_scatter is not one: it writes into a clone of its input, which is a fresh
# storage laid out like the input.)
STORAGE_ADDRESSING = frozenset({
    aten.as_strided.default, aten.as_strided_copy.default, aten.as_strided_.default,
})


def _storage(node: torch.fx.Node) -> StorageWeakRef | None:
    val = node.meta.get("val")
    if isinstance(val, torch.Tensor) and not val.is_sparse and val.layout == torch.strided:
        return StorageWeakRef(val.untyped_storage())
    return None


def _source(node: torch.fx.Node) -> torch.fx.Node | None:
    """The node `node` was computed from (its first argument; for an element of a
    multi-result view such as `unbind(x)[1]`, the view's input)."""
    if node.op != "call_function" or not node.args:
        return None
    src = node.args[0]
    if node.target is operator.getitem and isinstance(src, torch.fx.Node) \
            and isinstance(src.meta.get("val"), (list, tuple)):
        src = src.args[0] if src.op == "call_function" and src.args else None
    return src if isinstance(src, torch.fx.Node) else None


def storage_root(node: torch.fx.Node) -> torch.fx.Node:
    """The furthest node up `node`'s chain of sources that shares its storage and its
    dtype. as_strided counts positions in elements of its input's dtype: the walk goes
    through dtype views of the same element size (`x.view(torch.int32).view(torch.float32)`)
    and stops at one that changes it."""
    storage = _storage(node)
    if storage is None:
        return node
    val = node.meta["val"]
    root = current = node
    while (src := _source(current)) is not None and _storage(src) == storage \
            and src.meta["val"].element_size() == val.element_size():
        current = src
        if current.meta["val"].dtype == val.dtype:
            root = current
    return root


def rebase_storage_views(gm: torch.fx.GraphModule) -> int:
    """Points every storage-addressing op at its input's storage root; returns how many
    ops changed. Idempotent."""
    changed = 0
    for node in gm.graph.nodes:
        if node.op != "call_function" or node.target not in STORAGE_ADDRESSING or not node.args:
            continue
        x = node.args[0]
        if not isinstance(x, torch.fx.Node):
            continue
        root = storage_root(x)
        if root is not x:
            node.args = (root, *node.args[1:])
            _erase_unused_chain(gm.graph, x, root)
            changed += 1
    if changed:
        gm.recompile()
    return changed


def _erase_unused_chain(graph: torch.fx.Graph, node: torch.fx.Node, root: torch.fx.Node) -> None:
    """Erases `node` and its sources up to `root` while nothing else uses them (only
    pure ops: the chain of a non-functional graph may hold in-place writes)."""
    while node is not root and not node.users and node.op == "call_function" and not node.is_impure():
        src = node.args[0] if isinstance(node.args[0], torch.fx.Node) else None
        graph.erase_node(node)
        if src is None:
            return
        node = src
