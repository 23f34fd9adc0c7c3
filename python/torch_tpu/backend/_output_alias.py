"""Graph outputs that share storage with a graph input or with each other, on the
`functionalize="torchtpu"` path (docs/explanation/views.md).

In eager, `x.add_(1)` returns `x` itself, `x.view(-1)` / `x[1:]` / `x.t()` return views of
`x`'s storage, and `y[0], y[1]` of a tensor `y` made in the function share `y`'s
storage. A compiled program returns fresh buffers, so this module plans, at capture time
(the ATen graph traced on fake tensors), how to give the caller the same aliasing:

* an output that is an input, possibly through in-place ops that return their written
  argument (`add_`, `copy_`, `out=`), is the caller's tensor object itself;
* an output that otherwise shares an input's storage is `input.as_strided(size, stride,
  offset)`, with the metadata PyTorch computed for it (`meta['val']`), taken after the
  written inputs got their new values;
* outputs sharing the storage of one tensor created in the graph (its *base*) are
  `as_strided` views of the base, which becomes one extra result of the program; so is
  a single output that is a view of such a base (`(x * 2).diagonal()`,
  `y.as_strided(...)`), so that its strides and storage offset are eager's.

Those outputs are not computed by the program: their leaf in the output structure is
replaced by a constant, so XLA drops the work only they needed.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx
import torch.utils._pytree as pytree
from torch.multiprocessing.reductions import StorageWeakRef

from torch_tpu.compiler.importer.mutation import METADATA_INPLACE, written_args

log = logging.getLogger("torch_tpu")

# Stands for an aliased output in the program's output structure (a constant leaf).
_PLACEHOLDER_LEAF = 0


@dataclass(frozen=True)
class AliasedOutput:
    """How output leaf `leaf` is rebuilt from the caller's input `input_index` (source
    "input") or from the program's extra result `base_index` (source "base")."""

    leaf: int
    source: str
    index: int
    is_source: bool  # the output is the input / base object itself
    size: tuple[int, ...] = ()
    stride: tuple[int, ...] = ()
    byte_offset: int = 0  # storage offset in bytes, relative to the source's own
    dtype: torch.dtype | None = None

    def view_of(self, source: torch.Tensor) -> torch.Tensor:
        """This output as a view of `source`'s storage (its new value)."""
        start = source.storage_offset() * source.element_size() + self.byte_offset
        if self.dtype == source.dtype:
            return source.as_strided(self.size, self.stride, start // source.element_size())
        # A dtype view (`x.view(torch.int32)`, `view_as_real`): the same bytes, read as
        # the output's dtype; sizes, strides and offset are in its elements.
        itemsize = torch.empty((), dtype=self.dtype).element_size()
        return torch.empty(0, dtype=self.dtype, device=source.device).set_(
            source.untyped_storage(), start // itemsize, self.size, self.stride)


@dataclass(frozen=True)
class OutputAliasPlan:
    aliased: tuple[AliasedOutput, ...]
    bases: int  # extra results appended after the original outputs

    def rebuild(self, leaves: list, tree, args) -> Any:
        """The output structure the caller sees: `leaves`/`tree` are the program's
        flattened outputs (original structure, then the bases)."""
        original, bases = pytree.tree_unflatten(leaves, tree)
        flat, spec = pytree.tree_flatten(original)
        for alias in self.aliased:
            source = args[alias.index] if alias.source == "input" else bases[alias.index]
            flat[alias.leaf] = source if alias.is_source else alias.view_of(source)
        return pytree.tree_unflatten(flat, spec)


def _storage(val: Any) -> StorageWeakRef | None:
    if isinstance(val, torch.Tensor) and not val.is_sparse:
        return StorageWeakRef(val.untyped_storage())
    return None


def _through_inplace(node: torch.fx.Node) -> torch.fx.Node:
    """The tensor an in-place / out= op returns (its written argument), repeatedly: what
    `x.add_(1).mul_(2)` returns is `x`."""
    while node.op == "call_function" and node.target not in METADATA_INPLACE:
        names = written_args(node.target)
        if not names:
            break
        schema = node.target._schema
        bound = dict(zip((a.name for a in schema.arguments), node.args))
        bound.update(node.kwargs)
        written = bound.get(names[0])
        if not isinstance(written, torch.fx.Node):
            break
        node = written
    return node


def _byte_offset(val: torch.Tensor) -> int:
    return val.storage_offset() * val.element_size()


def _owns_storage(val: torch.Tensor) -> bool:
    """Whether `val` is its storage's whole, contiguous, offset-0 owner (so the program's
    result for it holds the same storage layout)."""
    return (val.is_contiguous() and val.storage_offset() == 0
            and val.numel() * val.element_size() == val.untyped_storage().nbytes())


def plan_output_aliases(gm: torch.fx.GraphModule) -> OutputAliasPlan | None:
    """Finds aliased outputs in the captured graph and rewrites its output node (aliased
    leaves become constants, bases become extra results). None when nothing aliases."""
    graph = gm.graph
    output = next(n for n in graph.nodes if n.op == "output")
    leaves, spec = pytree.tree_flatten(output.args[0])
    if any(isinstance(leaf, torch.fx.Node) and isinstance(leaf.meta.get("val"), (list, tuple))
           for leaf in leaves):
        # A multi-result node returned whole flattens differently in the importer.
        log.debug("torch_tpu: output aliasing not restored: the graph returns a multi-result node")
        return None
    inputs: dict[StorageWeakRef, tuple[int, torch.fx.Node]] = {}
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    for index, node in enumerate(placeholders):
        ref = _storage(node.meta.get("val"))
        if ref is not None:
            inputs.setdefault(ref, (index, node))

    aliased: list[AliasedOutput] = []
    internal: dict[StorageWeakRef, list[int]] = {}
    for position, leaf in enumerate(leaves):
        if not isinstance(leaf, torch.fx.Node):
            continue
        val = leaf.meta.get("val")
        ref = _storage(val)
        if ref is None:
            continue
        if ref in inputs:
            index, node = inputs[ref]
            source_val = node.meta["val"]
            aliased.append(AliasedOutput(
                position, "input", index, _through_inplace(leaf) is node, tuple(val.shape),
                tuple(val.stride()), _byte_offset(val) - _byte_offset(source_val), val.dtype))
        else:
            internal.setdefault(ref, []).append(position)

    bases: list[torch.fx.Node] = []
    for ref, positions in internal.items():
        if len(positions) == 1 and _owns_storage(leaves[positions[0]].meta["val"]):
            continue  # the whole owner of its storage, alone: a fresh result is the same
        base = _base_node(graph, ref)
        if base is None:
            log.debug("torch_tpu: outputs %s share a graph-internal storage with no contiguous "
                      "owner; returned as separate tensors", positions)
            continue
        for position in positions:
            val = leaves[position].meta["val"]
            aliased.append(AliasedOutput(position, "base", len(bases), leaves[position] is base,
                                         tuple(val.shape), tuple(val.stride()),
                                         _byte_offset(val), val.dtype))
        bases.append(base)
    if not aliased:
        return None
    for alias in aliased:
        leaves[alias.leaf] = _PLACEHOLDER_LEAF
    output.args = ((pytree.tree_unflatten(leaves, spec), tuple(bases)),)
    gm.recompile()
    return OutputAliasPlan(tuple(sorted(aliased, key=lambda a: a.leaf)), len(bases))


def _base_node(graph: torch.fx.Graph, ref: StorageWeakRef) -> torch.fx.Node | None:
    """The first node whose value is the whole contiguous owner of storage `ref`."""
    for node in graph.nodes:
        val = node.meta.get("val")
        storage = _storage(val)  # (StorageWeakRef == None raises)
        if node.op == "call_function" and storage is not None and storage == ref and _owns_storage(val):
            return node
    return None
