"""`F.multilabel_margin_loss` forward and backward and `F.multi_margin_loss`'s backward, as
ATen functions of device ops.

PyTorch's decomposition of `multilabel_margin_loss_forward` is wrong: it drops the labels
after a sample's first -1 from `is_target` but still sums the hinge terms of those
positions (their label gathered as class 0), so any target row with a -1 before its last
position gets a larger loss than PyTorch's kernels give (0.95 against 7.92 in a
three-sample probe). Its 1-D input with `reduction='none'` also gives shape [1] where the
kernels give a 0-dim loss. The two backward ops have CPU and CUDA kernels only: on the
device they ran on the host.

Semantics are PyTorch's CPU kernels' (aten/src/ATen/native/LossMultiLabelMargin.cpp,
LossMultiMargin.cpp): for each sample, the labels are the target's entries before its
first -1 (a repeated label counts once in `is_target` and once per occurrence in the
sum); the loss is sum over labels j and non-label classes d of max(0, 1 - x[j] + x[d]),
divided by the number of classes. 16-bit floats compute in float32 (`to_opmath`).
"""

from __future__ import annotations

import torch

from .opmath import to_opmath

aten = torch.ops.aten
_MEAN, _SUM = 1, 2  # torch.nn._reduction's enum: 0 none, 1 mean, 2 sum


def _labels(x: torch.Tensor, target: torch.Tensor):
    """(label index of each target position with masked positions as 0, whether each
    position holds a label, whether each class is a label): target's entries before the
    first -1."""
    classes = x.shape[-1]
    position = torch.arange(classes, device=target.device)
    first_end = torch.where(target < 0, position, classes).amin(dim=-1, keepdim=True)
    valid = position < first_end
    label = torch.where(valid, target, 0)
    is_target = ((label.unsqueeze(-1) == position) & valid.unsqueeze(-1)).any(dim=-2)
    return label, valid, is_target


def _hinge(x: torch.Tensor, label, valid, is_target) -> torch.Tensor:
    """[n, label position j, class d]: 1 - x[label_j] + x[d] where j is a label and d is
    not (zero elsewhere, before clamping)."""
    margin = 1 - torch.gather(x, -1, label).unsqueeze(-1) + x.unsqueeze(-2)
    keep = valid.unsqueeze(-1) & ~is_target.unsqueeze(-2)
    return torch.where(keep, margin, torch.zeros_like(margin))


def multilabel_margin_loss_forward(x, target, reduction):
    """`multilabel_margin_loss_forward(self, target, reduction) -> (output, is_target)`."""
    rows, labels = to_opmath(torch.atleast_2d(x)), torch.atleast_2d(target)
    label, valid, is_target = _labels(rows, labels)
    per_sample = _hinge(rows, label, valid, is_target).clamp_min(0).sum(dim=(-2, -1)) / rows.shape[-1]
    if reduction == _MEAN:
        loss = per_sample.mean()
    elif reduction == _SUM:
        loss = per_sample.sum()
    else:
        loss = per_sample if x.dim() == 2 else per_sample.reshape(())
    return loss.to(x.dtype), is_target.to(x.dtype).reshape(target.shape)


def _unit(rows, reduction) -> float:
    """The gradient of one active hinge term: 1 / classes (1 / (classes * samples) under
    'mean'), as both kernels weigh it."""
    return 1.0 / (rows.shape[-1] * (rows.shape[0] if reduction == _MEAN else 1))


def _times_grad_output(grad, grad_output, x, reduction):
    """`grad` (rows of the 2-D view of `x`) times the loss's incoming gradient -- one per
    sample under 'none' with a batch, one for all otherwise -- in `x`'s shape and dtype."""
    scale = to_opmath(grad_output)
    if reduction not in (_MEAN, _SUM) and x.dim() == 2:
        scale = scale.unsqueeze(-1)
    return (grad * scale).reshape(x.shape).to(x.dtype)


def multilabel_margin_loss_backward(grad_output, x, target, reduction, is_target):
    """`multilabel_margin_loss_backward(grad_output, self, target, reduction, is_target)`:
    each active hinge term adds g to its class's gradient and takes g from its label's,
    g = 1 / classes (1 / (classes * samples) under 'mean')."""
    rows, labels = to_opmath(torch.atleast_2d(x)), torch.atleast_2d(target)
    label, valid, _ = _labels(rows, labels)
    active = (_hinge(rows, label, valid, torch.atleast_2d(is_target) != 0) > 0).to(rows.dtype)
    g = _unit(rows, reduction)
    grad = active.sum(dim=-2) * g
    grad = grad.scatter_add(-1, label, -g * active.sum(dim=-1))
    return _times_grad_output(grad, grad_output, x, reduction)


def multi_margin_loss_backward(grad_output, x, target, p, margin, weight=None, reduction=_MEAN):
    """`multi_margin_loss_backward(grad_output, self, target, p, margin, weight, reduction)`:
    per class d other than the target t, h = g (p = 1) or 2 g z (p = 2) where
    z = margin - x[t] + x[d] > 0, times weight[t]; the target's gradient is -sum of h."""
    rows = to_opmath(torch.atleast_2d(x))
    t = torch.atleast_1d(target).unsqueeze(-1)
    classes = rows.shape[-1]
    g = _unit(rows, reduction)
    z = margin - torch.gather(rows, -1, t) + rows
    other = torch.arange(classes, device=rows.device) != t
    h = torch.where((z > 0) & other, g if p == 1 else 2 * g * z, torch.zeros_like(z))
    if weight is not None:
        h = h * to_opmath(weight)[t]
    grad = h.scatter_add(-1, t, -h.sum(dim=-1, keepdim=True))
    return _times_grad_output(grad, grad_output, x, reduction)


DECOMPOSITIONS = {
    aten.multilabel_margin_loss_forward.default: multilabel_margin_loss_forward,
    aten.multilabel_margin_loss_backward.default: multilabel_margin_loss_backward,
    aten.multi_margin_loss_backward.default: multi_margin_loss_backward,
}
