"""Size queries (`sym_size`, `sym_stride`, `sym_numel`, `sym_storage_offset`).

On static shapes these fold to the Python integers PyTorch recorded in the argument's
metadata; rules that take sizes receive them as plain ints. A *symbolic* size never
reaches these rules: the importer turns every node whose value is a symbolic SymInt into
a `SymSize` (its bound, with its run-time value; see importer/dynamic.py).
"""

from __future__ import annotations

import math

import torch

from .registry import declare_padding, LoweringContext, lowers, Padding

aten = torch.ops.aten


def _static(ctx: LoweringContext, value) -> int:
    if isinstance(value, torch.SymInt):
        hint = value.node.maybe_as_int() if hasattr(value.node, "maybe_as_int") else None
        if hint is None:
            raise ctx.fail("internal error: a symbolic size reached a static size rule; please report this")
        return int(hint)
    return int(value)


@lowers(aten.sym_size.int)
def _sym_size(ctx, x, dim):
    meta = ctx.arg_meta(0)
    return _static(ctx, meta.shape[dim])


@lowers(aten.sym_numel.default)
def _sym_numel(ctx, x):
    meta = ctx.arg_meta(0)
    return math.prod(_static(ctx, s) for s in meta.shape)


@lowers(aten.sym_stride.int)
def _sym_stride(ctx, x, dim):
    meta = ctx.arg_meta(0)
    return _static(ctx, meta.stride()[dim])


@lowers(aten.sym_storage_offset.default)
def _sym_storage_offset(ctx, x):
    meta = ctx.arg_meta(0)
    return _static(ctx, meta.storage_offset())


@lowers(aten.sym_is_contiguous.default)
def _sym_is_contiguous(ctx, x, memory_format=torch.contiguous_format):
    meta = ctx.arg_meta(0)
    return bool(meta.is_contiguous(memory_format=memory_format))


# Sizes and strides of symbolic tensors are SymSizes (importer/dynamic.py).
declare_padding(Padding.SAFE, family="symbolic")
