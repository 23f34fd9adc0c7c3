"""The tiny classifier and its whole compiled training step (zero_grad, forward, cross
entropy, backward, optimizer step) that the tests of a compiled step as one program train:
in FUSED mode (test_device_fused_graphs.py) and deferred in Strict mode
(test_device_compiled_step.py)."""

from __future__ import annotations

import torch
import torch.nn as nn


def tiny_classifier(dropout: float = 0.0) -> nn.Module:
    """8 features -> 4 classes, through the ops a real step has (matmul, GELU, LayerNorm;
    `dropout`: a Dropout after the GELU, so the graphs draw random keys)."""
    torch.manual_seed(0)
    middle = [nn.Dropout(dropout)] if dropout else []
    return nn.Sequential(nn.Linear(8, 16), nn.GELU(), *middle, nn.LayerNorm(16), nn.Linear(16, 4))


def compiled_whole_step(model: nn.Module, opt: torch.optim.Optimizer, zero_grad_last: bool = False):
    """`step(x, y) -> loss` under torch.compile(backend="tpu"), the optimizer's step included;
    `zero_grad_last`: the gradients dropped after the optimizer step, not before the forward."""

    def step(x, y):
        if not zero_grad_last:
            opt.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        if zero_grad_last:
            opt.zero_grad(set_to_none=True)
        return loss.detach()

    return torch.compile(step, backend="tpu")


def fresh_whole_step(zero_grad_last: bool = False):
    """(the tiny classifier on tpu, its whole step under torch.compile with AdamW(lr=1e-2)),
    Dynamo's caches reset first."""
    torch._dynamo.reset()
    model = tiny_classifier().to("tpu")
    return model, compiled_whole_step(model, torch.optim.AdamW(model.parameters(), lr=1e-2), zero_grad_last)
