"""Value checks wrapped in with_effects (linalg error checks), dist, narrow_copy."""

import torch
from direct_graph import check_direct
from harness import check

aten = torch.ops.aten


def test_with_effects_check_is_dropped_and_token_passes_through():
    torch._dynamo.reset()
    a = torch.randn(4, 4) + 4 * torch.eye(4)
    compiled = torch.compile(lambda m: torch.linalg.inv(m) @ m, backend="tpu", fullgraph=True)
    torch.testing.assert_close(compiled(a), torch.eye(4), atol=1e-5, rtol=1e-5)


def test_dist():
    a, b = torch.randn(3, 4), torch.randn(4)
    for p in (2, 1, 0, float("inf"), 3.5):
        def dist(x, y, order=p):
            return torch.ops.aten.dist(x, y, order)

        check(lambda x, y: dist(x, y), a, b, ops=[aten.dist.default])


def test_narrow_copy():
    x = torch.randn(5, 6)
    check(lambda t: torch.narrow_copy(t, 1, 2, 3), x, ops=[aten.narrow_copy.default])
    check(lambda t: torch.narrow_copy(t, 0, -3, 2), x, ops=[aten.narrow_copy.default])


def test_pool1d():
    # make_fx decomposes these (CompositeImplicit), so they only reach us in hand-built
    # graphs: lower them as one-node graphs.
    x = torch.randn(2, 3, 11)
    check_direct(aten.avg_pool1d.default, x, [3], [2], [1], False, True)
    check_direct(aten.avg_pool1d.default, x, [4], [3], [0], True, False)
    check_direct(aten.adaptive_avg_pool1d.default, x, [4])
    check_direct(aten.adaptive_avg_pool1d.default, x, [11])


def test_resize_value():
    x = torch.randn(3, 4)

    def shrink(t):
        return torch.ops.aten.resize_(t.clone(), [2, 5])

    check(shrink, x, ops=[aten.resize_.default])
