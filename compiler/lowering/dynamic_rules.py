"""Dynamic rules of the misc and pooling families not yet declared at their registrations
(those families are being split into modules; the rules move beside their lowerings with
the split). Attached with `registry.attach_dynamic_rule`, which rejects a rule for an
overload that has no ordinary lowering, or a second rule. Imported after every family
module. The rule factories are in padded.py."""

from __future__ import annotations

import torch

from .helpers import broadcast_to, convert, dtype, shape_of
from .padded import (
    arg_position,
    product,
    reject_spatial_dynamic,
    run_time_size,
    schema_arg,
    symbolic_arg,
    with_schema_arg,
)
from .padded import dynamic_dims as _dynamic_dims  # noqa: F401  (misc.py's glu rules)
from .registry import LOWERINGS, LoweringContext, Padding, attach_dynamic_rule
from ..context import stablehlo

aten = torch.ops.aten

_REDUCTION_MEAN, _REDUCTION_SUM = 1, 2


def _mean_loss_padded(ctx: LoweringContext, *args, **kwargs):
    """reduction='mean' of a loss (or its backward) over a dynamic input divides by the
    run-time element count: the rule runs with reduction='sum', then divides."""
    if schema_arg(ctx, args, kwargs, "reduction") != _REDUCTION_MEAN:
        return NotImplemented
    sym = symbolic_arg(ctx, arg_position(ctx, "self"))
    if not ctx.importer.dynamic.dynamic_dims(sym):
        return NotImplemented
    args, kwargs = with_schema_arg(ctx, args, kwargs, "reduction", _REDUCTION_SUM)
    total = LOWERINGS[ctx.node.target].fn(ctx, *args, **kwargs)
    count = product([run_time_size(ctx, s) for s in sym.shape])
    return stablehlo.DivOp(total, broadcast_to(convert(count, dtype(total)), shape_of(total))).result


for _name in (
    "mse_loss",
    "mse_loss_backward",
    "binary_cross_entropy",
    "binary_cross_entropy_backward",
    "binary_cross_entropy_with_logits",
    "smooth_l1_loss",
    "smooth_l1_loss_backward",
    "huber_loss",
    "huber_loss_backward",
    "soft_margin_loss",
    "soft_margin_loss_backward",
):
    attach_dynamic_rule(getattr(aten, _name).default, Padding.COUNT, _mean_loss_padded)


# Windows, pools and resampling along a dynamic spatial dim depend on where it ends; along
# the batch dim they are per sample (the upsampling ones use sizes as values: scales).
_WINDOWS = (
    "avg_pool1d", "avg_pool2d", "avg_pool3d", "avg_pool2d_backward", "avg_pool3d_backward",
    "max_pool2d_with_indices", "max_pool3d_with_indices",
    "max_pool2d_with_indices_backward", "max_pool3d_with_indices_backward",
    "adaptive_avg_pool1d", "_adaptive_avg_pool2d", "_adaptive_avg_pool3d",
    "_adaptive_avg_pool2d_backward", "_adaptive_avg_pool3d_backward",
    "adaptive_max_pool2d", "adaptive_max_pool3d",
    "adaptive_max_pool2d_backward", "adaptive_max_pool3d_backward",
)
for _op in [op for op in LOWERINGS if op.__name__.split(".")[0] in _WINDOWS]:
    attach_dynamic_rule(_op, Padding.WINDOW, reject_spatial_dynamic(_op))
for _op in [op for op in LOWERINGS if op.__name__.split(".")[0] in ("im2col", "col2im")]:
    attach_dynamic_rule(_op, Padding.MOVEMENT, reject_spatial_dynamic(_op))
for _op in [
    op
    for op in LOWERINGS
    if "upsample" in op.__name__ or op.__name__.split(".")[0] in ("grid_sampler_2d", "grid_sampler_2d_backward")
]:
    attach_dynamic_rule(_op, Padding.SIZE, reject_spatial_dynamic(_op))
