"""aten._grouped_mm (compiler/lowering/grouped_mm.py) against PyTorch's CPU kernel, in each
of its layouts, float32 and bfloat16, with empty groups and rows past the last offset.

PyTorch's CPU kernel wants 16-byte-aligned strides, hence the multiples of 8 below."""

from __future__ import annotations

import pytest
import torch
from direct_graph import check_direct
from harness import check, lower_and_run

aten = torch.ops.aten
DTYPES = [torch.float32, torch.bfloat16]


def _tolerance(dtype):
    return {"rtol": 1.6e-2, "atol": 1e-2} if dtype == torch.bfloat16 else {"rtol": 1e-5, "atol": 1e-5}


def _offs(*ends):
    return torch.tensor(ends, dtype=torch.int32)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rows_grouped_2d_by_3d(dtype):
    # Group 1 is empty; every row is in a group (PyTorch leaves rows past offs[-1] unwritten).
    a, b = torch.randn(16, 8, dtype=dtype), torch.randn(3, 8, 16, dtype=dtype)
    check_direct(aten._grouped_mm.default, a, b, _offs(5, 5, 16), **_tolerance(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_columns_grouped_3d_by_2d(dtype):
    a, b = torch.randn(3, 8, 8, dtype=dtype), torch.randn(8, 24, dtype=dtype)
    check_direct(aten._grouped_mm.default, a, b, _offs(8, 8, 24), **_tolerance(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_contraction_grouped_2d_by_2d(dtype):
    # An empty group contracts nothing: zeros, as in PyTorch.
    a, b = torch.randn(8, 24, dtype=dtype), torch.randn(24, 8, dtype=dtype)
    check_direct(aten._grouped_mm.default, a, b, _offs(3, 3, 17, 24), **_tolerance(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_batched_3d_by_3d(dtype):
    a, b = torch.randn(4, 8, 16, dtype=dtype), torch.randn(4, 16, 8, dtype=dtype)
    check_direct(aten._grouped_mm.default, a, b, **_tolerance(dtype))


def test_rows_past_the_last_offset_are_zero_and_the_rest_match():
    a, b, offs = torch.randn(16, 8), torch.randn(2, 8, 8), _offs(4, 11)
    expected = torch._grouped_mm(a, b, offs)
    (actual,), _, _ = lower_and_run(lambda a, b, o: [aten._grouped_mm.default(a, b, o)],
                                    a.bfloat16(), b.bfloat16(), offs)
    torch.testing.assert_close(actual[:11].float(), expected[:11], rtol=2e-2, atol=5e-2)
    assert torch.equal(actual[11:], torch.zeros(5, 8, dtype=torch.bfloat16))


def test_an_inf_in_another_group_does_not_leak():
    a, b = torch.randn(8, 8), torch.randn(2, 8, 8)
    a[0, 0] = float("inf")  # row 0 is group 0's: group 1's product of it is inf, never used
    check_direct(aten._grouped_mm.default, a, b, _offs(4, 8))


def test_traced_through_the_public_function():
    # torch.nn.functional.grouped_mm traces to aten._grouped_mm (its meta wants bfloat16).
    a, b = torch.randn(16, 8, dtype=torch.bfloat16), torch.randn(2, 8, 16, dtype=torch.bfloat16)
    check(lambda a, b, o: torch.nn.functional.grouped_mm(a, b, offs=o), a, b, _offs(7, 16),
          ops=[aten._grouped_mm.default], **_tolerance(torch.bfloat16))


def test_a_bounded_dynamic_token_dim_compiles_strictly(monkeypatch):
    # Padding class MASKED: padded token rows lie past offs[-1], so they are in no group.
    monkeypatch.setenv("TORCH_TPU_STRICT", "1")
    torch._dynamo.reset()
    w = torch.randn(3, 8, 8, dtype=torch.bfloat16)

    def f(x, offs):
        return torch.nn.functional.grouped_mm(x, w, offs=offs).float().sum(-1)

    compiled = torch.compile(f, backend="tpu")
    for n in (3, 6, 11):
        x = torch.randn(n, 8, dtype=torch.bfloat16)
        offs = _offs(n // 3, n // 3, n)
        torch._dynamo.mark_dynamic(x, 0, min=2, max=32)
        torch.testing.assert_close(compiled(x, offs), f(x, offs), rtol=2e-2, atol=5e-2)
