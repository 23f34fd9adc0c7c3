"""Splits by sizes known at run time only (a mixture of experts' tokens per expert,
`x.split(counts.tolist())`, as transformers' JetMoe writes it): the pieces are laid out at
their bounds and read from run-time offsets; a size the guards pin to a constant (the
pieces' sum is the split dim) is that constant's static layout again, so the concatenated
expert outputs meet the static gates and `index_add` targets. One compile for every
routing, equal to eager, with no op left to eager (TORCH_TPU_STRICT).

Tolerances: float32 matmuls, atol/rtol 1e-5 (XLA:CPU and eager accumulate alike here)."""

import pytest
import torch

import torch_tpu
from bounded_support import compiles, fresh_dynamic_compiles

TOL = {"atol": 1e-5, "rtol": 1e-5}
# Tokens per expert (4 experts, 16 rows): empty experts, one expert taking all, and the
# same multiset in other orders, so each piece's offset moves.
ROUTINGS = [[4, 4, 4, 4], [1, 7, 3, 5], [0, 10, 2, 4], [6, 2, 8, 0], [16, 0, 0, 0], [5, 3, 7, 1]]


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    monkeypatch.setenv("TORCH_TPU_STRICT", "1")
    with fresh_dynamic_compiles():
        yield




def _experts(x, counts, weights):
    return torch.cat([piece @ weights[i] for i, piece in enumerate(x.split(counts, dim=0))], dim=0)


def _routed(x, counts, weights, order, gates):
    """JetMoe's pattern: expert outputs scaled by their gates, added back in token order."""
    y = _experts(x, counts, weights) * gates[:, None]
    return torch.zeros(x.shape[0], weights.shape[-1]).index_add(0, order, y)


def test_routed_experts_compile_once_for_every_routing():
    torch.manual_seed(0)
    weights = torch.randn(4, 8, 6)
    compiled = torch.compile(_routed, backend="tpu")
    before = None
    for i, counts in enumerate(ROUTINGS):
        x, gates, order = torch.randn(16, 8), torch.rand(16), torch.randperm(16)
        torch.testing.assert_close(compiled(x, counts, weights, order, gates),
                                   _routed(x, counts, weights, order, gates), **TOL)
        if i == 1:  # the first call specializes; the second makes the sizes symbolic
            before = compiles()
    assert compiles() == before, "a routing after the first dynamic compile compiled again"


def test_experts_alone_return_the_unpinned_concatenation():
    """Without a static consumer the concatenation keeps the sum of its pieces' bounds as
    its layout; the caller gets the logical rows."""
    torch.manual_seed(1)
    weights = torch.randn(4, 8, 6)
    compiled = torch.compile(_experts, backend="tpu")
    for counts in ROUTINGS:
        x = torch.randn(16, 8)
        torch.testing.assert_close(compiled(x, counts, weights), _experts(x, counts, weights), **TOL)


def _split_dynamic(x, head):
    first, rest = x.split([head, x.shape[0] - head], dim=0)
    return first * 2, rest.sum(0)


def test_a_dynamic_dim_split_by_run_time_sizes():
    """The split dim is itself dynamic (padded): each piece is read from its run-time
    offset in the padded layout."""
    torch.manual_seed(2)
    compiled = torch.compile(_split_dynamic, backend="tpu", dynamic=True)
    counts = []
    for rows, head in [(9, 3), (12, 5), (7, 1), (20, 11), (16, 8)]:
        x = torch.randn(rows, 4)
        torch_tpu.mark_dynamic(x, 0, max=32)
        for got, want in zip(compiled(x, head), _split_dynamic(x, head)):
            torch.testing.assert_close(got, want, **TOL)
        counts.append(compiles())
    assert counts[-1] == counts[1], counts


def test_routed_experts_backward_equals_eager():
    """Training through the routing (the backward of the split is a concatenation at
    run-time offsets, of the cut concatenation a split): every gradient equals eager's."""
    torch.manual_seed(3)
    weights = torch.randn(4, 8, 6)
    compiled = torch.compile(_routed, backend="tpu")
    for counts in ROUTINGS[:4]:
        x, gates, order = torch.randn(16, 8), torch.rand(16), torch.randperm(16)
        grads = []
        for fn in (compiled, _routed):
            leaves = [t.clone().requires_grad_() for t in (x, weights, gates)]
            fn(leaves[0], counts, leaves[1], order, leaves[2]).square().sum().backward()
            grads.append([t.grad for t in leaves])
        for got, want in zip(*grads):
            torch.testing.assert_close(got, want, **TOL)
