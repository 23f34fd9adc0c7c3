"""Every OpInfo entry that supports float32 on CPU (`op_db` and the `_foreach_*` lists),
through torch.compile(..., backend="tpu", fullgraph=True) with no fallback allowed
(TORCH_TPU_STRICT=1), compared against eager with OpInfo's tolerances.

Expected failures are listed, each with its reason, in opinfo_xfail.py; the xfail is
strict, so an op that starts to pass fails the run until it is removed from the list.
"""

from __future__ import annotations

import pytest
import torch
import torch.utils._pytree as pytree
from opinfo_cases import as_function, compare, float32_ops, op_id, samples, tolerances
from opinfo_xfail import BACKWARD_XFAIL, FORWARD_XFAIL

OPS = float32_ops(foreach=True)

# Ops whose result values are unspecified in PyTorch (uninitialized memory): only the
# shape and dtype can be compared, as PyTorch's own OpInfo tests do.
UNSPECIFIED_VALUES = {"empty", "empty_like", "empty_strided", "empty_permuted", "new_empty", "new_empty_strided"}


def _compare_metadata(actual, expected) -> None:
    a_leaves, e_leaves = pytree.tree_leaves(actual), pytree.tree_leaves(expected)
    assert len(a_leaves) == len(e_leaves)
    for a, e in zip(a_leaves, e_leaves):
        assert (a.shape, a.dtype) == (e.shape, e.dtype), ((a.shape, a.dtype), (e.shape, e.dtype))


def _params(ops, xfail: dict[str, str]):
    for op in ops:
        name = op_id(op)
        marks = [pytest.mark.xfail(reason=xfail[name], strict=True)] if name in xfail else []
        yield pytest.param(op, id=name, marks=marks)


pytestmark = pytest.mark.usefixtures("strict_compile")  # test/python/conftest.py


def _compiled(fn):
    return torch.compile(fn, backend="tpu", fullgraph=True, dynamic=False)


@pytest.mark.opinfo
@pytest.mark.parametrize("op", list(_params(OPS, FORWARD_XFAIL)))
def test_forward(op):
    atol, rtol = tolerances(op)
    cases = samples(op)
    assert cases, "OpInfo gave no samples"
    for sample in cases:
        fn, tensors = as_function(op, sample)
        expected = fn(*tensors)
        torch._dynamo.reset()
        actual = _compiled(fn)(*tensors)
        if op_id(op) in UNSPECIFIED_VALUES:
            _compare_metadata(actual, expected)
        else:
            compare(actual, expected, atol, rtol)


def _differentiable_outputs(out):
    return [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor) and t.requires_grad]


def _loss(outputs, weights):
    """A real scalar that depends on every output element with a random weight (real
    and imaginary parts of complex outputs separately)."""
    total = 0
    for o, w in zip(outputs, weights):
        term = (o * w).sum()
        total = total + (term.real + term.imag if term.is_complex() else term)
    return total


@pytest.mark.opinfo
@pytest.mark.parametrize("op", list(_params([o for o in OPS if o.supports_autograd], BACKWARD_XFAIL)))
def test_backward(op):
    atol, rtol = tolerances(op)
    cases = [s for s in samples(op, requires_grad=True, limit=1)]
    assert cases, "OpInfo gave no samples"
    for sample in cases:
        fn, tensors = as_function(op, sample)
        inputs = [t for t in tensors if t.requires_grad]
        if not inputs:
            pytest.skip("sample has no input that requires grad")
        expected_out = _differentiable_outputs(fn(*tensors))
        if not expected_out:
            pytest.skip("no differentiable output")
        generator = torch.Generator().manual_seed(1)
        weights = [torch.randn(o.shape, generator=generator, dtype=o.real.dtype if o.is_complex() else o.dtype)
                   for o in expected_out]
        expected = torch.autograd.grad(_loss(expected_out, weights), inputs, allow_unused=True)
        torch._dynamo.reset()
        actual_out = _differentiable_outputs(_compiled(fn)(*tensors))
        actual = torch.autograd.grad(_loss(actual_out, weights), inputs, allow_unused=True)
        compare(actual, expected, atol, rtol)
