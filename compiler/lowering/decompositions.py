"""The one place that decides which ATen ops are decomposed before lowering.

PyTorch's core-ATen decomposition table rewrites non-core ops into core ops. We use it
for every op *without* a direct lowering; ops we lower directly (softmax, layer norm,
addmm, attention, ...) stay whole, because a direct lowering gives XLA a better program
than the decomposition does.
"""

from __future__ import annotations

import functools

import torch

from .registry import LOWERINGS

aten = torch.ops.aten


@functools.lru_cache(maxsize=1)
def _core_table() -> dict:
    from torch._decomp import core_aten_decompositions

    return dict(core_aten_decompositions().items())


def decomposition_table() -> dict:
    """Decompositions for aot_autograd / make_fx / torch.export: PyTorch's core-ATen table
    minus every op that has a lowering of its own."""
    return {op: fn for op, fn in _core_table().items() if op not in LOWERINGS}


def is_decomposed(op) -> bool:
    return op in _core_table() and op not in LOWERINGS
