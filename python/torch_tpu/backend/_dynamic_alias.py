"""Outputs of a bounded-dynamic graph that are views of an input or of another output:
given eager's view metadata, evaluated at the call's sizes.

aot_autograd does not trust a compiler with aliasing: for an output that is a view of a
graph input (`x.expand_as(y)`, `torch.flatten(x, 1)`, `torch.broadcast_tensors(x, y)`,
the pieces of `x.chunk(2)`) or of another output, it rebuilds the view from the real base
after the compiled call (`gen_alias_from_base`). With static shapes it replays the view
functions recorded while tracing; when they take symbolic sizes it rebuilds the view from
the compiled output's own metadata instead: from its `_base` when it is a view, else by
`base.as_strided(out.size(), out.stride(), out.storage_offset())`.

A bounded program returns dense buffers padded to their bounds, narrowed to the logical
sizes (`_dynamic.narrow_to_sizes`). Such an output was a view of the padded buffer, so
aot_autograd reshaped the caller's input to the *padded* shape first -- PyTorch's
"setStorage: ... out of bounds" -- and without that `_base` it would still have read the
output's dense strides and zero offset, not the expand's zero strides or a chunk's
offset. So each such output is returned as the view eager returns:
`base.as_strided(size, stride, offset)` with the sizes, strides and storage offset of the
FX output's `meta['val']` (sympy expressions of the graph's size symbols) evaluated at the
call's sizes. The program's own result for it is not used. Only the outputs the user sees
of forward and inference graphs are planned (a backward graph's gradients and the saved
activations are not rebuilt by aot_autograd), and only where the base is laid out as
eager's at run time; otherwise the program's result stays (a narrowed padded buffer whose
metadata aot_autograd would misread, as before).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import sympy
import torch
import torch.fx
import torch.utils._pytree as pytree

from ._output_alias import _storage
from ..program.output_layout import VISIBLE_OUTPUTS

log = logging.getLogger("torch_tpu")

# gm.meta key: True for graphs whose aliased outputs aot_autograd rebuilds after the call
# (forward and inference graphs; a backward graph's gradients are returned as they are).
ALIASES_REPLAYED = "torch_tpu_aliases_replayed"


def _expr(value) -> sympy.Expr:
    return value.node.expr if isinstance(value, torch.SymInt) else sympy.Integer(int(value))


@dataclass(frozen=True)
class SymbolicView:
    """Output leaf `leaf` is a view of input `index` (source "input") or of output leaf
    `index` (source "output"): sizes, strides and a storage offset in elements relative to
    the source's own, as expressions of the size symbols."""

    leaf: int
    source: str
    index: int
    size: tuple[sympy.Expr, ...]
    stride: tuple[sympy.Expr, ...]
    offset: sympy.Expr
    source_size: tuple[sympy.Expr, ...]
    source_stride: tuple[sympy.Expr, ...]

    def view_of(self, source: torch.Tensor, symbols: Mapping[sympy.Symbol, int]) -> torch.Tensor | None:
        """The view of `source`, or None where `source` is not laid out as eager's (then
        the view's metadata would address other elements)."""
        def values(exprs) -> list[int]:
            return [int(e.xreplace(symbols)) for e in exprs]

        if list(source.shape) != values(self.source_size) or [
                st for sz, st in zip(source.shape, source.stride()) if sz != 1] != [
                st for sz, st in zip(values(self.source_size), values(self.source_stride)) if sz != 1]:
            return None
        return source.as_strided(values(self.size), values(self.stride),
                                 source.storage_offset() + int(self.offset.xreplace(symbols)))


def plan_views(gm: torch.fx.GraphModule, count: int, sourced: set[sympy.Symbol]) -> tuple[SymbolicView, ...]:
    """The output leaves (of `count`) that share an input's storage, or the storage another
    output leaf owns whole, with the metadata to rebuild each. Left out (returned as the
    program computed them, as before): dtype views, and views whose metadata needs a
    symbol no input size gives (`sourced`)."""
    if not gm.meta.get(ALIASES_REPLAYED):
        return ()
    output = next((n for n in reversed(gm.graph.nodes) if n.op == "output"), None)
    if output is None:
        return ()
    leaves = pytree.tree_leaves(output.args[0])
    if len(leaves) != count:
        return ()
    # Outputs past the visible ones are activations saved for the backward: aot_autograd
    # replays no view of them, and they keep the program's layout.
    leaves = leaves[:gm.meta.get(VISIBLE_OUTPUTS, count)]
    owners: dict = {}
    for index, node in enumerate(n for n in gm.graph.nodes if n.op == "placeholder"):
        ref = _storage(node.meta.get("val"))
        if ref is not None:
            owners.setdefault(ref, ("input", index, node.meta["val"]))
    for position, leaf in enumerate(leaves):
        val = leaf.meta.get("val") if isinstance(leaf, torch.fx.Node) else None
        ref = _storage(val)
        if ref is not None and ref not in owners and _owns(val):
            owners[ref] = ("output", position, val)
    views = []
    for position, leaf in enumerate(leaves):
        val = leaf.meta.get("val") if isinstance(leaf, torch.fx.Node) else None
        ref = _storage(val)
        if ref is None or ref not in owners:
            continue
        source, index, source_val = owners[ref]
        if source == "output" and index == position:
            continue  # the owner itself
        if val.dtype != source_val.dtype:
            continue  # a dtype view: as_strided cannot make one
        view = SymbolicView(position, source, index, tuple(_expr(s) for s in val.shape),
                            tuple(_expr(s) for s in val.stride()),
                            _expr(val.storage_offset()) - _expr(source_val.storage_offset()),
                            tuple(_expr(s) for s in source_val.shape), tuple(_expr(s) for s in source_val.stride()))
        free = set().union(*(e.free_symbols for e in (
            *view.size, *view.stride, view.offset, *view.source_size, *view.source_stride)))
        if not free <= sourced:
            log.debug("torch_tpu: output %d aliases %s %d with sizes no input gives; returned as computed",
                      position, source, index)
            continue
        views.append(view)
    return tuple(views)


def _owns(val: torch.Tensor) -> bool:
    """Whether `val` is dense at storage offset 0 over its whole storage: the layout the
    runtime gives the program's result for it (eager's dim order, `_output_layout`)."""
    # Hints, never int(): int() of a SymInt would specialize the size (a guard).
    sizes = [_hint(s) for s in val.shape]
    strides = [_hint(s) for s in val.stride()]
    offset, nbytes = _hint(val.storage_offset()), _hint(val.untyped_storage().nbytes())
    if None in sizes or None in strides or offset is None or nbytes is None:
        return False
    numel = 1
    for s in sizes:
        numel *= s
    if offset != 0 or numel * val.element_size() != nbytes:
        return False
    expected = 1
    for d in sorted((d for d in range(len(sizes)) if sizes[d] != 1), key=lambda d: (strides[d], d)):
        if strides[d] != expected:
            return False
        expected *= sizes[d]
    return True


def _hint(value) -> int | None:
    if isinstance(value, torch.SymInt):
        hint = value.node.hint
        return int(hint) if hint is not None else None
    return int(value)


def rebuild(leaves: list, views: Sequence[SymbolicView], args: Sequence, symbols: Mapping[sympy.Symbol, int]) -> list:
    """`leaves` with each planned view rebuilt from its source (inputs first: an output
    view's source is an output leaf that is not itself a view)."""
    for view in views:
        source = args[view.index] if view.source == "input" else leaves[view.index]
        rebuilt = view.view_of(source, symbols)
        if rebuilt is not None:
            leaves[view.leaf] = rebuilt
    return leaves
