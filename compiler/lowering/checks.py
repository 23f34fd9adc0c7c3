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


@lowers(aten._assert_scalar.default)
def _assert_scalar(ctx, condition, message):
    """A check that holds when the graph is traced costs nothing; one on a value read from
    tensor data (`torch._check(x.item() > 0)`, an unbacked size) would need that value on
    the host while the program runs: it cannot be compiled, and is refused by name."""
    if condition is True:
        return None
    if condition is False:
        raise ctx.fail(f"_assert_scalar fails for every input: {message}")
    raise ctx.fail(
        f"_assert_scalar checks a value read from tensor data while the program runs ({message}); a compiled "
        "XLA program cannot read a value back to check it. Move the .item() (or the data-dependent size) and "
        "its torch._check out of the compiled function, e.g. under torch.compiler.disable"
    )


declare_padding(Padding.SAFE, family="checks")
