"""The one place that decides which ATen ops are decomposed before lowering.

PyTorch's core-ATen decomposition table rewrites non-core ops into core ops. We use it
for every op *without* a direct lowering; ops we lower directly (softmax, layer norm,
addmm, attention, ...) stay whole, because a direct lowering gives XLA a better program
than the decomposition does.

A few ops' fake (meta) kernels give another result dtype than their eager kernels when
their tensor operands' dtypes differ (`threshold_backward(int64 grad, float32 input)`:
meta int64, eager float32). A traced graph follows the meta kernel, downstream ops
included, and the importer's check against the metadata cannot see it, so these ops
are rewritten while tracing: operands cast to their promoted dtype (where meta and eager
agree), the op, the result cast to eager's dtype. Equal operand dtypes leave the op as
it is (`NotImplemented`).

PyTorch's recurrent cells hand an accelerator's gates to fused kernels that exist for CUDA
only (`_thnn_fused_lstm_cell`, `_thnn_fused_gru_cell` and their backward ops): those are
decomposed too (`rnn_cells.py`), so `nn.LSTM` and `nn.GRU` run on the tpu device; and so
are the inference fast path's fused ops of `nn.TransformerEncoderLayer` and
`nn.MultiheadAttention` (`transformer_fast_path.py`), whose kernels are CPU's and CUDA's,
and `nn.SyncBatchNorm`'s statistics kernels (`sync_batch_norm.py`, CUDA's only).
`torch.amp.GradScaler`'s ops and the `fused=True` optimizers' update ops have CPU kernels,
but run there they move every gradient (and parameter and state) through the host at each
step: they are decomposed too (`grad_scaling.py`, `fused_optimizers.py`). So are the
backward ops of the margin losses, the weight-norm backward, `nn.Embedding(max_norm=)`'s
row renormalization and `F.rrelu` (CPU and CUDA kernels only: `margin_losses.py`,
`parameter_norms.py`, `randomized_relu.py`), and `multilabel_margin_loss_forward`, whose
decomposition in PyTorch's table sums the hinge terms of target positions after a -1.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

from .registry import LOWERINGS
from .fused_optimizers import DECOMPOSITIONS as FUSED_OPTIMIZER_DECOMPOSITIONS
from .grad_scaling import DECOMPOSITIONS as GRAD_SCALING_DECOMPOSITIONS
from .margin_losses import DECOMPOSITIONS as MARGIN_LOSS_DECOMPOSITIONS
from .parameter_norms import DECOMPOSITIONS as PARAMETER_NORM_DECOMPOSITIONS
from .randomized_relu import DECOMPOSITIONS as RRELU_DECOMPOSITIONS
from .rnn_cells import DECOMPOSITIONS as RNN_CELL_DECOMPOSITIONS
from .sync_batch_norm import DECOMPOSITIONS as SYNC_BATCH_NORM_DECOMPOSITIONS
from .transformer_fast_path import DECOMPOSITIONS as FAST_PATH_DECOMPOSITIONS

# Ops PyTorch runs for an accelerator through kernels of other devices only, GradScaler's
# and the fused optimizers', whose CPU kernels would move every gradient through the host,
# and one PyTorch decomposes wrongly (`multilabel_margin_loss_forward`, margin_losses.py).
DEVICE_DECOMPOSITIONS = {**RNN_CELL_DECOMPOSITIONS, **FAST_PATH_DECOMPOSITIONS, **SYNC_BATCH_NORM_DECOMPOSITIONS,
                         **GRAD_SCALING_DECOMPOSITIONS, **MARGIN_LOSS_DECOMPOSITIONS,
                         **PARAMETER_NORM_DECOMPOSITIONS, **RRELU_DECOMPOSITIONS, **FUSED_OPTIMIZER_DECOMPOSITIONS}

aten = torch.ops.aten


@functools.lru_cache(maxsize=1)
def _core_table() -> dict:
    from torch._decomp import core_aten_decompositions

    return dict(core_aten_decompositions().items())


# op: (eager's result dtype: "promoted", or the position of the argument whose dtype it
# is; positions of the tensor operands). Found by comparing eager and meta kernels on
# mixed dtypes (test/python/lowering/test_eager_dtypes.py keeps the list complete).
EAGER_RESULT_DTYPE: dict = {
    aten.huber_loss.default: (0, (0, 1)),
    aten.soft_margin_loss.default: (0, (0, 1)),
    aten.normal.Tensor_Tensor: (0, (0, 1)),
    aten.threshold_backward.default: ("promoted", (0, 1)),
    aten.mish_backward.default: (1, (0, 1)),
    aten.mse_loss_backward.default: (1, (0, 1, 2)),
    aten.smooth_l1_loss_backward.default: (1, (0, 1, 2)),
    aten.soft_margin_loss_backward.default: (1, (0, 1, 2)),
}


def _usual(op) -> Callable:
    """What tracing does with `op` without the eager-dtype rewrite: the core-ATen
    decomposition when the op has no lowering, else the op itself (NotImplemented)."""
    if op in _core_table() and op not in LOWERINGS:
        return _core_table()[op]
    return lambda *args, **kwargs: NotImplemented


def _with_eager_dtype(op, result, operands: tuple[int, ...]) -> Callable:
    def decomposed(*args, **kwargs):
        tensors = [args[i] for i in operands if i < len(args) and isinstance(args[i], torch.Tensor)]
        if len({t.dtype for t in tensors}) <= 1:
            return _usual(op)(*args, **kwargs)
        from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND, elementwise_dtypes

        _, promoted = elementwise_dtypes(*tensors, type_promotion_kind=ELEMENTWISE_TYPE_PROMOTION_KIND.DEFAULT)
        wanted = promoted if result == "promoted" else args[result].dtype
        cast = [a.to(promoted) if i in operands and isinstance(a, torch.Tensor) else a for i, a in enumerate(args)]
        return op(*cast, **kwargs).to(wanted)

    return decomposed


def decomposition_table() -> dict:
    """Decompositions for aot_autograd / make_fx / torch.export: PyTorch's core-ATen table
    minus every op that has a lowering of its own, plus the eager-dtype rewrites."""
    return _ours(_core_table())


def _ours(core: dict) -> dict:
    """`core` minus every op that has a lowering of its own, plus the eager-dtype rewrites
    and the device's own decompositions (unless a lowering was registered for an op)."""
    table = {op: fn for op, fn in core.items() if op not in LOWERINGS}
    table.update({op: _with_eager_dtype(op, *rule) for op, rule in EAGER_RESULT_DTYPE.items()})
    table.update({op: fn for op, fn in DEVICE_DECOMPOSITIONS.items() if op not in LOWERINGS})
    return table


@functools.lru_cache(maxsize=1)
def _tracing_table() -> dict:
    from torch._decomp import _core_aten_decompositions_post_autograd

    return _ours(_core_aten_decompositions_post_autograd())


# The table leaves out the ops that have a lowering: one registered later (a user's
# `register_lowering` of a decomposed op) must drop the op's decomposition from it.
LOWERINGS.subscribe(lambda op: _tracing_table.cache_clear())


def tracing_decompositions() -> dict:
    """`decomposition_table()` for tracing (aot_autograd, make_fx), without the entries
    that only repeat what the dispatcher does while tracing: the core-ATen table's
    entries for CompositeImplicitAutograd ops run the op's own CompositeImplicitAutograd
    kernel, which tracing runs anyway for an op the table lacks (the Autograd key, or the
    proxy and functional modes' `decompose` under inference mode). Finding those ops
    scans every registered operator (~0.4-0.7 s CPU, once per process, measured in
    bench/first_call.py); this table costs ~20 ms. torch.export's `run_decompositions`
    preserves CompositeImplicitAutograd ops missing from its table, so export keeps
    `decomposition_table()`. A fresh dict per call: make_fx adds entries to its copy."""
    return dict(_tracing_table())


def is_decomposed(op) -> bool:
    return op in _core_table() and op not in LOWERINGS
