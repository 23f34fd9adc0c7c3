"""Fake-tensor results on the tpu device where PyTorch's meta kernel refuses what the device
computes: Dynamo traces a function on tpu tensors with fake tensors, and an op whose meta
kernel is stricter than its CPU kernel and our lowering (`aten._grouped_mm` takes bfloat16
only there; transformers' MoE experts call `torch.nn.functional.grouped_mm` on tpu tensors
in every dtype) stops `torch.compile` before any backend sees the graph, while the same
model runs eagerly.

Each op of the compiler's `TRACING_RULES` gets a FakeTensorMode implementation that, when
one of its tensors is on the tpu device, computes the result with the op's metadata rule
(the rule the eager device plans the op with) and leaves every other device to PyTorch's
meta kernel.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.utils._pytree as pytree

_installed: set = set()


def install() -> None:
    """Idempotent; called once the lowering table is loaded (`ensure_op_kernels`)."""
    from torch._subclasses.fake_impls import register_op_impl

    from torch_tpu.compiler.lowering.registry import METADATA_RULES, TRACING_RULES

    for op in TRACING_RULES - _installed:
        register_op_impl(lambda func, op=op: func is op)(_fake_kernel(METADATA_RULES[op]))
        _installed.add(op)


def _fake_kernel(rule: Callable[..., Any]) -> Callable[..., Any]:
    def kernel(fake_mode, func, *args, **kwargs):
        device = _tpu_device(args, kwargs)
        if device is None:
            return NotImplemented  # FakeTensorMode goes on to PyTorch's meta kernel
        from torch._subclasses.fake_tensor import FakeTensor, in_kernel_invocation_manager

        # Inside a kernel invocation the fake tensors are their meta tensors: the rule runs
        # PyTorch's checks and output rule on them, as a meta kernel would.
        with in_kernel_invocation_manager(fake_mode):
            result = rule(*args, **kwargs)
        return pytree.tree_map_only(torch.Tensor, lambda t: FakeTensor(fake_mode, t, device), result)

    return kernel


def _tpu_device(args, kwargs) -> torch.device | None:
    name = torch._C._get_privateuse1_backend_name()
    for value in pytree.tree_leaves((args, kwargs)):
        if isinstance(value, torch.Tensor) and value.device.type == name:
            return value.device
    return None
