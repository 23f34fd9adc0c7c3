"""Ops that only check their inputs.

Compiled XLA programs cannot raise Python errors, so run-time checks of values (a
singular matrix in `linalg.inv`, say) are dropped: like PyTorch on accelerators with
`check_errors=False`, invalid inputs give inf/NaN results instead of an exception.
Checks of metadata were already done when the graph was traced.
"""

from __future__ import annotations

import torch

from .registry import declare_padding, lowers, Padding

aten = torch.ops.aten


@lowers(aten._linalg_check_errors.default)
def _linalg_check_errors(ctx, info, api_name, *, is_matrix):
    return None


@lowers(aten._assert_tensor_metadata.default)
def _assert_tensor_metadata(ctx, x, size=None, stride=None, dtype=None, **kwargs):
    return None


declare_padding(Padding.SAFE, family="checks")
