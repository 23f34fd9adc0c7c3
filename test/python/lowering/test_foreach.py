"""`_foreach_*` overloads that tracing never leaves in a graph, lowered from hand-built
one-node graphs (direct_graph.check_direct) and compared with eager. PyTorch's fake
kernels rewrite `_foreach_add.Tensor` into `.item()` + `_foreach_add.Scalar`, reject
the CPU tensor of per-element scalars of `_foreach_addcmul/addcdiv.Tensor` (fake tensors
are not on the CPU), and Dynamo does not trace `torch._foreach_max`; exported or
hand-written graphs can still hold them. The other overloads are checked through
torch.compile in opinfo/test_foreach_opinfo.py."""

import pytest
import torch
from direct_graph import check_direct

aten = torch.ops.aten


def _lists():
    torch.manual_seed(0)
    return [torch.randn(2, 3), torch.randn(4), torch.randn(())]


def test_add_tensor_broadcasts_one_tensor_against_each():
    tensors = _lists()
    check_direct(aten._foreach_add.Tensor, tensors, torch.tensor(0.25), alpha=2)
    check_direct(aten._foreach_add.Tensor, tensors, torch.tensor(3, dtype=torch.int64))


@pytest.mark.parametrize("op", [aten._foreach_addcmul.Tensor, aten._foreach_addcdiv.Tensor])
def test_pointwise_with_a_tensor_of_per_element_scalars(op):
    tensors = _lists()
    others = [t.abs() + 0.5 for t in _lists()]
    check_direct(op, tensors, tensors, others, torch.tensor([0.5, -2.0, 3.0]))
    check_direct(op, tensors, tensors, others, torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64))



def test_max_of_each_tensor():
    """`_foreach_max` (Dynamo does not trace the builtin: opinfo_xfail.FOREACH_BUILTIN)."""
    check_direct(aten._foreach_max.default, _lists())
    check_direct(aten._foreach_max.default, [torch.arange(6, dtype=torch.int64).reshape(2, 3), torch.tensor([-1.5])])
