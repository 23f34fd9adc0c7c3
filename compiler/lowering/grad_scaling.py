"""`torch.amp.GradScaler`'s two ops, on the device: unscaling the gradients while looking
for non-finite values, and updating the scale.

Run through the CPU fallback they copied every gradient to the host and back at each
`scaler.step` (and `scaler.update` waited for the device). Here they are elementwise ops on
the device, with no read of a value on the host: a step with an inf or NaN gradient is
still skipped by the optimizer wrapper, which reads `found_inf` itself.

Semantics are PyTorch's kernels' (aten/src/ATen/native/cuda/AmpKernels.cu): every gradient
is multiplied by `inv_scale`; `found_inf` becomes 1 when any gradient held a non-finite
value before unscaling, and is left as it was otherwise (it accumulates across calls). The
scale update backs off on `found_inf` and resets the growth tracker; otherwise, after
`growth_interval` clean steps in a row, it grows (only to a finite value).
"""

from __future__ import annotations

import torch

from .opmath import to_opmath

aten = torch.ops.aten


def non_finite_check_and_unscale(grads, found_inf, inv_scale):
    """`_amp_foreach_non_finite_check_and_unscale(grads, found_inf, inv_scale) ->
    (grads_out, found_inf_out)`: the functional form, which a compiled graph holds."""
    if not grads:
        return [], found_inf.clone()
    non_finite = torch.stack([~torch.isfinite(g).all() for g in grads]).any()
    found = torch.where(non_finite, torch.ones_like(found_inf), found_inf)
    # 16-bit floats multiplied in float32 and rounded once, as the kernels do.
    return [(to_opmath(g) * inv_scale).to(g.dtype) for g in grads], found


def non_finite_check_and_unscale_(grads, found_inf, inv_scale):
    """`_amp_foreach_non_finite_check_and_unscale_(grads, found_inf, inv_scale) -> ()`."""
    if not grads:
        return None
    unscaled, found = non_finite_check_and_unscale(grads, found_inf, inv_scale)
    found_inf.copy_(found)
    for g, value in zip(grads, unscaled):
        g.copy_(value)
    return None


def update_scale(scale, growth_tracker, found_inf, growth_factor, backoff_factor, growth_interval):
    """`_amp_update_scale(scale, growth_tracker, found_inf, ...) -> (scale, growth_tracker)`:
    the functional form."""
    found = found_inf.reshape(()) != 0
    successful = growth_tracker + 1
    grows = (~found) & (successful == growth_interval)
    grown = scale * growth_factor
    new_scale = torch.where(found, scale * backoff_factor,
                            torch.where(grows & torch.isfinite(grown), grown, scale))
    new_tracker = torch.where(found | grows, torch.zeros_like(growth_tracker), successful)
    return new_scale, new_tracker


def update_scale_(scale, growth_tracker, found_inf, growth_factor, backoff_factor, growth_interval):
    """`_amp_update_scale_(scale, growth_tracker, found_inf, ...) -> scale` (in place)."""
    new_scale, new_tracker = update_scale(scale, growth_tracker, found_inf, growth_factor, backoff_factor,
                                          growth_interval)
    scale.copy_(new_scale)
    growth_tracker.copy_(new_tracker)
    return scale


DECOMPOSITIONS = {
    aten._amp_foreach_non_finite_check_and_unscale_.default: non_finite_check_and_unscale_,
    aten._amp_foreach_non_finite_check_and_unscale.default: non_finite_check_and_unscale,
    aten._amp_update_scale_.default: update_scale_,
    aten._amp_update_scale.default: update_scale,
}
