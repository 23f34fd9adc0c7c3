"""torchtpu-decompose-views: complex views and view chains -> a canonical small set."""

from __future__ import annotations

from math import prod

from typing import Any

import numpy as np

from ..context import ir
from ..dialect import ref_tensor_type
from ..dialect.view_ops import VIEW_OPS, build_view, diagonal_length
from .base import Pass, ops_named, register_pass

# torch and what loads it (the view semantics, torch dtypes) are bound on the pass's first
# run (`_load`): listing the pass (`torchtpu-opt --help`) must not import torch (3 s).
torch: Any = None
dtype_of: Any = None
tensor_type: Any = None
attrs_of: Any = None
overlap_reason: Any = None
view_shapes: Any = None


def _load() -> None:
    global torch, dtype_of, tensor_type, attrs_of, overlap_reason, view_shapes
    if torch is None:
        import torch as torch_module

        from ..dtypes import dtype_of, tensor_type
        from .view_semantics import attrs_of, overlap_reason, view_shapes

        torch = torch_module


@register_pass
class DecomposeViewsPass(Pass):
    argument = "torchtpu-decompose-views"
    summary = "Rewrite diagonal/unfold/as_strided and view chains into simple views or gather_view"
    description = (
        "Brings every view of a reference into the canonical set `slice`, `select`, "
        "`permute`, `reshape`, `expand`, `view_dtype`, `gather_view`: `diagonal` becomes "
        "permute + reshape + strided slice; `unfold` with step == size becomes slice + "
        "reshape + permute; `as_strided` becomes reshape + slices + permute + expand when "
        "its strides describe a non-overlapping sub-block of the storage. Otherwise the "
        "view becomes a `gather_view` holding the static row-major positions it reads. "
        "Chains fold: squeeze/unsqueeze become reshape, reshape-of-reshape and "
        "permute-of-permute compose, alias disappears, gather_view absorbs the views below "
        "it that keep row-major order. A `torchtpu.store` through a chain containing a "
        "view that maps two elements to one storage location (expand, overlapping windows "
        "or strides) is rewritten into one writable gather_view when the chain as a whole "
        "picks distinct elements (`x.expand(2, 3)[0]`), and is a located error otherwise: "
        "the write has no defined result."
    )
    follows_calls = False

    def run(self, op: ir.Operation) -> None:
        _load()
        targets = ops_named(op, *_REWRITES)
        stores = ops_named(op, "torchtpu.store")
        for view in targets:
            with ir.InsertionPoint(view), view.location:
                replacement = _REWRITES[view.name](view)
            if replacement is not None:
                view.results[0].replace_all_uses_with(replacement)
                view.erase()
        for store in stores:
            self._check_store(store)
        _erase_dead_views(op)

    def _check_store(self, store: ir.Operation) -> None:
        """A store through a chain containing an overlapping view (expand, repeated
        gather indices) is still defined when the views above it pick distinct elements
        (`x.expand(2, 3)[0] = v`): the chain from that view's source up to the store
        then becomes one writable gather_view. Otherwise the write is an error."""
        chain: list[ir.Operation] = []  # from the store's reference down to the root
        ref = store.operands[0]
        while not isinstance(ref.owner, ir.Block):
            owner = ref.owner.operation
            if owner.name not in VIEW_OPS:
                break
            chain.append(owner)
            ref = owner.operands[0]
        for depth in range(len(chain) - 1, -1, -1):  # the overlap closest to the root first
            view = chain[depth]
            reason = overlap_reason(view)
            if reason is None:
                continue
            source = view.operands[0]
            positions = _compose_positions(list(reversed(chain[: depth + 1])), source)
            if positions is None or len(np.unique(positions)) != positions.size:
                self.error(store, f"unsupported overlapping write: {reason}; clone() the view "
                                  "before writing to it", notes=[(view.location, "through this view")])
                return
            with ir.InsertionPoint(store), store.location:
                target = _gather(chain[0], source, np.array(positions, order="C"))
            store.operands[0] = target
            return


def _compose_positions(views: list[ir.Operation], source: ir.Value) -> np.ndarray | None:
    """Row-major positions in `source` of the elements seen through `views` (innermost
    first), or None when one of them is not a simple view."""
    positions = _positions(source).numpy()
    for view in views:
        if view.name == "torchtpu.gather_view":
            positions = positions.reshape(-1)[attrs_of(view)["indices"]]
        elif view.name in _NUMPY_VIEWS:
            positions = _numpy_view(view, positions)
        else:
            return None
    return positions


def _erase_dead_views(root: ir.Operation) -> None:
    """Removes view ops whose result is unused (the decompositions leave some behind;
    canonicalize cannot, since it does not know torchtpu ops are pure)."""
    dead: list[ir.Operation] = []

    def visit(inner: ir.Operation) -> ir.WalkResult:
        inner = inner.operation
        if inner.name in VIEW_OPS and not list(inner.results[0].uses):
            dead.append(inner)
        return ir.WalkResult.ADVANCE

    while True:
        dead.clear()
        root.walk(visit)
        if not dead:
            return
        for view in dead:
            view.erase()


# -- rewrites (each returns the replacement reference, or None to keep the op) ------------
def _type(op: ir.Operation, shape) -> ir.RankedTensorType:
    return tensor_type(list(shape), dtype_of(ref_tensor_type(op.results[0].type)))


_RESHAPES = ("torchtpu.reshape", "torchtpu.squeeze", "torchtpu.unsqueeze")


def _reshape(op, source: ir.Value, shape) -> ir.Value:
    """reshape(source), folded through reshapes below it (row-major order is kept)."""
    while not isinstance(source.owner, ir.Block) and source.owner.operation.name in _RESHAPES:
        source = source.owner.operation.operands[0]
    if list(ref_tensor_type(source.type).shape) == list(shape):
        return source
    return build_view("reshape", source, _type(op, shape))


def _permute(op, source: ir.Value, perm) -> ir.Value:
    perm = [int(p) for p in perm]
    if perm == list(range(len(perm))):
        return source
    shape = list(ref_tensor_type(source.type).shape)
    return build_view("permute", source, _type(op, [shape[p] for p in perm]), permutation=perm)


def _slice(op, source: ir.Value, dim: int, start: int, limit: int, step: int) -> ir.Value:
    shape = list(ref_tensor_type(source.type).shape)
    if start == 0 and limit == shape[dim] and step == 1:
        return source
    out = list(shape)
    out[dim] = max(0, (limit - start + step - 1) // step)
    return build_view("slice", source, _type(op, out), dim=dim, start=start, limit=limit, step=step)


def _gather(op, source: ir.Value, indices: np.ndarray) -> ir.Value:
    return build_view("gather_view", source, _type(op, indices.shape), indices=indices.astype(np.int64))


def _positions(source: ir.Value) -> torch.Tensor:
    shape = list(ref_tensor_type(source.type).shape)
    return torch.arange(prod(shape), dtype=torch.int64).reshape(shape)


def _diagonal(op: ir.Operation) -> ir.Value:
    a = attrs_of(op)
    source = op.operands[0]
    shape, _ = view_shapes(op)
    d1, d2, offset = a["dim1"], a["dim2"], a["offset"]
    rest = [d for d in range(len(shape)) if d not in (d1, d2)]
    rows, cols = shape[d1], shape[d2]
    permuted = _permute(op, source, rest + [d1, d2])
    flat = _reshape(op, permuted, [shape[d] for d in rest] + [rows * cols])
    length = diagonal_length(rows, cols, offset)
    if length == 0:
        return _slice(op, flat, len(rest), 0, 0, 1)
    start = offset if offset >= 0 else -offset * cols
    step = cols + 1
    return _slice(op, flat, len(rest), start, start + (length - 1) * step + 1, step)


def _unfold(op: ir.Operation) -> ir.Value:
    a = attrs_of(op)
    source = op.operands[0]
    shape, out = view_shapes(op)
    dim, size, step = a["dimension"], a["size"], a["step"]
    if shape and size == step and size > 0:
        windows = out[dim]
        cut = _slice(op, source, dim, 0, windows * size, 1)
        split = _reshape(op, cut, shape[:dim] + [windows, size] + shape[dim + 1 :])
        rank = len(shape) + 1
        perm = [d for d in range(rank) if d != dim + 1] + [dim + 1]
        return _permute(op, split, perm)
    positions = _positions(source)
    if not shape:
        positions = positions.reshape(1)
        dim = 0
    return _gather(op, source, positions.unfold(dim, size, step).numpy())


def _as_strided(op: ir.Operation) -> ir.Value:
    a = attrs_of(op)
    source = op.operands[0]
    _, out = view_shapes(op)
    strides, offset = a["strides"], a["storage_offset"]
    simple = _as_strided_simple(op, source, out, strides, offset)
    if simple is not None:
        return simple
    positions = _positions(source).reshape(-1)
    return _gather(op, source, torch.as_strided(positions, out, strides, offset).numpy())


def _as_strided_simple(op, source: ir.Value, out: list[int], strides: list[int], offset: int):
    """Storage[offset + sum(i_k * s_k)] as reshape/slice/permute/expand of the flat
    storage, when the non-broadcast dims address a non-overlapping sub-block."""
    n = prod(ref_tensor_type(source.type).shape)
    if prod(out) == 0:
        return None
    kept = [d for d in range(len(out)) if out[d] != 1 and strides[d] != 0]
    order = sorted(kept, key=lambda d: -strides[d])
    for outer, inner in zip(order, order[1:]):
        if strides[outer] % strides[inner] or strides[outer] < out[inner] * strides[inner]:
            return None
    if not order:
        cur = _slice(op, _reshape(op, source, [n]), 0, offset, offset + 1, 1)
        return _finish(op, cur, [], [], out, strides)
    first = order[0]
    span = out[first] * strides[first]
    if offset + span > n:
        return None
    flat = _reshape(op, source, [n])
    cur = _slice(op, flat, 0, offset, offset + span, 1)
    cur = _reshape(op, cur, [out[first], strides[first]])
    sizes = [out[first]]
    for prev, d in zip(order, order[1:]):
        outer_len = strides[prev] // strides[d]
        cur = _reshape(op, cur, sizes + [outer_len, strides[d]])
        cur = _slice(op, cur, len(sizes), 0, out[d], 1)
        sizes.append(out[d])
    cur = _slice(op, cur, len(sizes), 0, 1, 1)  # the innermost stride's first element
    cur = _reshape(op, cur, sizes)
    return _finish(op, cur, order, sizes, out, strides)


def _finish(op, cur: ir.Value, order: list[int], sizes: list[int], out: list[int], strides: list[int]) -> ir.Value:
    """From dims in `order` (by decreasing stride) to the result: restore the dim order,
    re-insert size-1 dims and broadcast stride-0 dims."""
    kept_sorted = sorted(order)
    cur = _permute(op, cur, [order.index(d) for d in kept_sorted])
    with_ones = [out[d] if d in order else 1 for d in range(len(out))]
    cur = _reshape(op, cur, with_ones)
    if with_ones != list(out):
        cur = build_view("expand", cur, _type(op, out))
    return cur


def _squeeze_like(op: ir.Operation) -> ir.Value:
    _, out = view_shapes(op)
    return _reshape(op, op.operands[0], out)


def _reshape_chain(op: ir.Operation):
    _, out = view_shapes(op)
    source = op.operands[0]
    if list(ref_tensor_type(source.type).shape) == out:
        return source
    if not isinstance(source.owner, ir.Block) and source.owner.operation.name in _RESHAPES:
        return _reshape(op, source, out)
    return None


def _permute_chain(op: ir.Operation):
    perm = attrs_of(op)["permutation"]
    if perm == list(range(len(perm))):
        return op.operands[0]
    owner = op.operands[0].owner
    if hasattr(owner, "name") and owner.name == "torchtpu.permute":
        inner = attrs_of(owner.operation)["permutation"]
        return _permute(op, owner.operands[0], [inner[p] for p in perm])
    return None


def _gather_chain(op: ir.Operation):
    indices = attrs_of(op)["indices"]
    owner = op.operands[0].owner
    if not hasattr(owner, "name"):
        return None
    if owner.name in ("torchtpu.reshape", "torchtpu.squeeze", "torchtpu.unsqueeze", "torchtpu.alias"):
        return _gather(op, owner.operands[0], indices)  # row-major order is unchanged
    if owner.name == "torchtpu.gather_view":
        inner = attrs_of(owner.operation)["indices"].reshape(-1)
        return _gather(op, owner.operands[0], inner[indices])
    return None


def _numpy_view(op: ir.Operation, indices: np.ndarray) -> np.ndarray:
    """The simple view `op` applied to an array (the positions a gather_view reads)."""
    a = attrs_of(op)
    _, out = view_shapes(op)
    name = op.name
    if name == "torchtpu.slice":
        index = [slice(None)] * indices.ndim
        index[a["dim"]] = slice(a["start"], a["limit"], a["step"])
        return indices[tuple(index)]
    if name == "torchtpu.select":
        return np.take(indices, a["index"], axis=a["dim"])
    if name == "torchtpu.permute":
        return np.transpose(indices, a["permutation"])
    if name == "torchtpu.expand":
        return np.broadcast_to(indices, out)
    return indices.reshape(out)  # reshape, squeeze, unsqueeze, alias


_NUMPY_VIEWS = frozenset({
    "torchtpu.slice", "torchtpu.select", "torchtpu.permute", "torchtpu.expand", "torchtpu.reshape",
    "torchtpu.squeeze", "torchtpu.unsqueeze", "torchtpu.alias",
})


def _compose_over_gather(rewrite):
    """A simple view of a gather_view is one gather_view: its positions are the view of
    the inner positions (so chains over irregular views stay one gather)."""

    def apply(op: ir.Operation):
        owner = op.operands[0].owner
        if not isinstance(owner, ir.Block) and owner.operation.name == "torchtpu.gather_view":
            inner = attrs_of(owner.operation)["indices"]
            return _gather(op, owner.operation.operands[0], np.array(_numpy_view(op, inner), order="C"))
        return rewrite(op)

    return apply


_REWRITES = {
    "torchtpu.diagonal": _diagonal,
    "torchtpu.unfold": _unfold,
    "torchtpu.as_strided": _as_strided,
    "torchtpu.squeeze": _squeeze_like,
    "torchtpu.unsqueeze": _squeeze_like,
    "torchtpu.alias": lambda op: op.operands[0],
    "torchtpu.reshape": _reshape_chain,
    "torchtpu.permute": _permute_chain,
    "torchtpu.gather_view": _gather_chain,
    "torchtpu.slice": lambda op: None,
    "torchtpu.select": lambda op: None,
    "torchtpu.expand": lambda op: None,
}
for _name in ("torchtpu.slice", "torchtpu.select", "torchtpu.expand", "torchtpu.squeeze",
              "torchtpu.unsqueeze", "torchtpu.reshape", "torchtpu.permute"):
    _REWRITES[_name] = _compose_over_gather(_REWRITES[_name])
