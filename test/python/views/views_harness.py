"""Runs a function with views and in-place ops through the non-functional importer, the
view passes and the runtime, and compares with PyTorch eager: every output and every
input (the written ones must be updated in place)."""

from __future__ import annotations

import torch
from torch.fx.experimental.proxy_tensor import make_fx
from torch_tpu.backend._inplace import capture_aten, compile_inplace_graph


def trace(fn, *args) -> torch.fx.GraphModule:
    """ATen graph of `fn` without functionalization (fake inputs: nothing runs)."""
    return capture_aten(fn, list(args))


def check_against_eager(fn, *args, atol: float = 1e-5, rtol: float = 1e-5):
    """Compiles `fn` on copies of `args`; asserts outputs and the final value of every
    argument equal eager's. Returns the compiled graph."""
    eager_args = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
    ours = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
    expected = fn(*eager_args)
    compiled = compile_inplace_graph(trace(fn, *args), "test")
    got = compiled(*ours)
    assert_same(got, expected, atol, rtol, "output")
    for i, (a, b) in enumerate(zip(ours, eager_args)):
        if isinstance(a, torch.Tensor):
            assert_same(a, b, atol, rtol, f"argument {i}")
    return compiled


def assert_same(got, expected, atol, rtol, what) -> None:
    flat_got, _ = torch.utils._pytree.tree_flatten(got)
    flat_exp, _ = torch.utils._pytree.tree_flatten(expected)
    assert len(flat_got) == len(flat_exp), f"{what}: {len(flat_got)} leaves, expected {len(flat_exp)}"
    for g, e in zip(flat_got, flat_exp):
        if isinstance(e, torch.Tensor):
            assert g.shape == e.shape, f"{what}: shape {tuple(g.shape)} != {tuple(e.shape)}"
            # NaN where eager has NaN counts as equal: writes through an int32 view of float
            # storage can store NaN bit patterns.
            torch.testing.assert_close(g, e, atol=atol, rtol=rtol, equal_nan=True, msg=lambda m: f"{what}: {m}")
        else:
            assert g == e, f"{what}: {g} != {e}"


__all__ = ["check_against_eager", "make_fx", "trace"]
