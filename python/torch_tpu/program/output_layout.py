"""Outputs with eager's strides.

A compiled program returns dense row-major buffers, and a bounded-dynamic program returns
them padded to their bounds, so narrowing an output back to its size leaves a strided view
of the padded buffer (`torch.cat` gave strides (256, 4, 1) where eager's are (40, 4, 1)).
Such a tensor breaks `.view(...)` (HF Llama's `logits.view(-1, vocab)`) and changes the
strides Dynamo guards on when an output feeds the next compiled call (a recompile). Each
output is therefore laid out as eager lays it out: the dimension order recorded in the FX
output node's `meta['val']` strides, row-major where that is unknown or not dense.
"""

from __future__ import annotations

import torch
import torch.fx
import torch.utils._pytree as pytree

# A layout: the logical dims from outermost to innermost (as `torch.empty_permuted`
# takes them); None is row-major; ANY keeps whatever the result has (outputs no user sees).
ANY = "any"
Layout = tuple[int, ...] | str | None
# gm.meta key: how many leading outputs the user sees. aot_autograd's forward graphs end
# with the activations saved for the backward, which only our own backward graph reads:
# their layout does not matter, and restriding them would copy every training step.
VISIBLE_OUTPUTS = "torch_tpu_visible_outputs"


def output_layouts(gm: torch.fx.GraphModule, count: int) -> list[Layout]:
    """The layout of each of the graph's `count` output leaves (row-major when the FX
    output does not say, e.g. leaves that are not tensors)."""
    output = next((n for n in reversed(gm.graph.nodes) if n.op == "output"), None)
    if output is None:
        return [None] * count
    sources = pytree.tree_leaves(output.args[0])
    if len(sources) != count:
        return [None] * count
    visible = gm.meta.get(VISIBLE_OUTPUTS, count) if hasattr(gm, "meta") else count
    layouts: list[Layout] = []
    for i, source in enumerate(sources):
        val = source.meta.get("val") if isinstance(source, torch.fx.Node) else None
        if i >= visible:
            layouts.append(ANY)
        else:
            layouts.append(_layout_of(val) if isinstance(val, torch.Tensor) else None)
    return layouts


def _hint(value) -> int | None:
    if isinstance(value, torch.SymInt):
        hint = value.node.hint
        return int(hint) if hint is not None else None
    return int(value)


def _layout_of(val: torch.Tensor) -> Layout:
    """The dim order of a dense tensor's strides (at the traced sizes' hints); None when
    it is row-major, unknown (no hints) or not dense (overlapping/expanded: eager's own
    op then returned a view we do not reproduce, and row-major is the honest copy)."""
    try:
        sizes = [_hint(s) for s in val.shape]
        strides = [_hint(s) for s in val.stride()]
    except Exception:  # noqa: BLE001 - sparse/nested tensors have no strides
        return None
    if None in sizes or None in strides:
        return None
    dims = [d for d in range(len(sizes)) if sizes[d] != 1]
    order = sorted(dims, key=lambda d: (-strides[d], d))
    expected = 1
    for d in reversed(order):
        if strides[d] != expected:
            return None  # not dense: row-major
        expected *= sizes[d]
    if order == dims:
        return None
    # Size-1 dims go where row-major would put them (outermost first, in order).
    ones = [d for d in range(len(sizes)) if sizes[d] == 1]
    return tuple(ones + order)


def apply_layout(value: torch.Tensor, layout: Layout) -> torch.Tensor:
    """`value` with the given layout: itself when it has it already, else a copy."""
    if layout is ANY:
        return value
    if layout is None:
        return value.contiguous()
    if _has_layout(value, layout):
        return value
    out = torch.empty_permuted(value.shape, layout, dtype=value.dtype, device=value.device)
    return out.copy_(value)


def _has_layout(value: torch.Tensor, layout: tuple[int, ...]) -> bool:
    expected = 1
    for d in reversed(layout):
        if value.shape[d] != 1 and value.stride(d) != expected:
            return False
        expected *= value.shape[d]
    return True
