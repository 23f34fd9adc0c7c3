"""The `fused=True` optimizers' update ops (`torch.optim.Adam`, `AdamW`, `SGD`, `Adagrad`) as
ATen functions of the lowered `_foreach` ops.

PyTorch has CPU and CUDA kernels for `_fused_adam_`, `_fused_adamw_`, `_fused_sgd_` and
`_fused_adagrad_` only: on the device the CPU fallback copied every parameter, gradient
and optimizer state to the host and back at each step. Here each step is a few dozen
`_foreach` ops over all the parameters of a group (one program each; in FUSED mode and
under torch.compile, part of the step's one program), with no read of a value on the host.

Semantics are PyTorch's kernels' (aten/src/ATen/native/cpu/Fused{Adam,SGD,Adagrad}Kernel.cpp
and their CUDA twins): 16-bit floats compute in float32 and are rounded once when stored;
`grad_scale` unscales the gradients, which are written back unscaled; a `found_inf` of 1
skips the whole update (nothing is written, the gradients included); the bias corrections
come from `state_steps`, which the optimizer's Python has already advanced, computed on the
device as CUDA's kernels do (CPU's read the step on the host).
"""

from __future__ import annotations

import torch

from .opmath import to_opmath

aten = torch.ops.aten


def _opmath(tensors) -> list[torch.Tensor]:
    return [to_opmath(t) for t in tensors]


def _operands(params, grads, grad_scale, maximize: bool, weight_decay: float = 0.0):
    """(the parameters in opmath, the gradients the update uses -- unscaled, negated for
    `maximize`, plus `weight_decay` times the parameter --, the unscaled gradients to
    write back or None)."""
    p, g = _opmath(params), _opmath(grads)
    unscaled = None
    if grad_scale is not None:
        g = unscaled = torch._foreach_div(g, to_opmath(grad_scale.reshape(())))
    if maximize:
        g = torch._foreach_neg(g)
    if weight_decay != 0:
        g = torch._foreach_add(g, p, alpha=weight_decay)
    return p, g, unscaled


def _store(writes: list[tuple[list, list]], found_inf, grads, unscaled) -> None:
    """Each (targets, new values) pair written, in the targets' dtypes, and the unscaled
    gradients when there are; with a `found_inf` of 1 every target keeps its value (a
    per-tensor select: only GradScaler's steps pass `found_inf`)."""
    if unscaled is not None:
        writes = [*writes, (grads, unscaled)]
    if found_inf is not None:
        skip = found_inf.reshape(()) == 1
        writes = [(targets, [torch.where(skip, t, v.to(t.dtype)) for t, v in zip(targets, values)])
                  for targets, values in writes]
    for targets, values in writes:
        if targets:
            torch._foreach_copy_(targets, values)


def _times_lr(tensors, lr):
    return torch._foreach_mul(tensors, lr.reshape(()) if isinstance(lr, torch.Tensor) else lr)


def _adam(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, *, lr, beta1, beta2,
          weight_decay, eps, amsgrad, maximize, grad_scale=None, found_inf=None, decoupled: bool):
    if not params:
        return None
    # Adam: grad += weight_decay * param; AdamW: param -= lr * weight_decay * param.
    p, g, unscaled = _operands(params, grads, grad_scale, maximize, 0.0 if decoupled else weight_decay)
    if decoupled and weight_decay != 0:
        p = torch._foreach_sub(p, _times_lr(torch._foreach_mul(p, weight_decay), lr))
    m = torch._foreach_lerp(_opmath(exp_avgs), g, 1 - beta1)
    v = torch._foreach_addcmul(torch._foreach_mul(_opmath(exp_avg_sqs), beta2), g, g, value=1 - beta2)
    steps = _opmath(state_steps)
    bias_correction1 = torch._foreach_add(torch._foreach_neg(torch._foreach_pow(beta1, steps)), 1)
    bias_correction2 = torch._foreach_add(torch._foreach_neg(torch._foreach_pow(beta2, steps)), 1)
    step_size = _times_lr(torch._foreach_reciprocal(bias_correction1), lr)
    second = v
    writes = [(exp_avgs, m), (exp_avg_sqs, v)]
    if amsgrad:
        second = torch._foreach_maximum(_opmath(max_exp_avg_sqs), v)
        writes.append((max_exp_avg_sqs, second))
    denom = torch._foreach_add(torch._foreach_div(torch._foreach_sqrt(second), torch._foreach_sqrt(bias_correction2)),
                               eps)
    p = torch._foreach_sub(p, torch._foreach_div(torch._foreach_mul(m, step_size), denom))
    writes.append((params, p))
    _store(writes, found_inf, grads, unscaled)
    return None


def fused_adam_(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, **options):
    """`_fused_adam_(self, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, *,
    lr, beta1, beta2, weight_decay, eps, amsgrad, maximize, grad_scale, found_inf) -> ()`."""
    return _adam(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, decoupled=False, **options)


def fused_adamw_(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, **options):
    """`_fused_adamw_(...)`: `_fused_adam_` with decoupled weight decay."""
    return _adam(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, decoupled=True, **options)


def fused_sgd_(params, grads, momentum_buffer_list, *, weight_decay, momentum, lr, dampening, nesterov, maximize,
               is_first_step, grad_scale=None, found_inf=None):
    """`_fused_sgd_(self, grads, momentum_buffer_list, *, weight_decay, momentum, lr,
    dampening, nesterov, maximize, is_first_step, grad_scale, found_inf) -> ()`: the first
    step's momentum buffer is the gradient itself."""
    if not params:
        return None
    p, g, unscaled = _operands(params, grads, grad_scale, maximize, weight_decay)
    writes = []
    if momentum != 0:
        if is_first_step:
            buf = g
        else:
            buf = torch._foreach_add(torch._foreach_mul(_opmath(momentum_buffer_list), momentum), g,
                                     alpha=1 - dampening)
        writes.append((momentum_buffer_list, buf))
        g = torch._foreach_add(g, buf, alpha=momentum) if nesterov else buf
    writes.append((params, torch._foreach_sub(p, _times_lr(g, lr))))
    _store(writes, found_inf, grads, unscaled)
    return None


def fused_adagrad_(params, grads, state_sums, state_steps, *, lr, lr_decay, weight_decay, eps, maximize,
                   grad_scale=None, found_inf=None):
    """`_fused_adagrad_(self, grads, state_sums, state_steps, *, lr, lr_decay, weight_decay,
    eps, maximize, grad_scale, found_inf) -> ()`: the step size is
    lr / (1 + (step - 1) * lr_decay)."""
    if not params:
        return None
    p, g, unscaled = _operands(params, grads, grad_scale, maximize, weight_decay)
    sums = torch._foreach_addcmul(_opmath(state_sums), g, g)
    decay = torch._foreach_add(torch._foreach_mul(torch._foreach_add(_opmath(state_steps), -1), lr_decay), 1)
    step_size = _times_lr(torch._foreach_reciprocal(decay), lr)
    std = torch._foreach_add(torch._foreach_sqrt(sums), eps)
    update = torch._foreach_div(torch._foreach_mul(g, step_size), std)
    _store([(state_sums, sums), (params, torch._foreach_sub(p, update))], found_inf, grads, unscaled)
    return None


DECOMPOSITIONS = {
    **{getattr(aten._fused_adam_, o): fused_adam_ for o in ("default", "tensor_lr")},
    **{getattr(aten._fused_adamw_, o): fused_adamw_ for o in ("default", "tensor_lr")},
    **{getattr(aten._fused_sgd_, o): fused_sgd_ for o in ("default", "tensor_lr")},
    **{getattr(aten._fused_adagrad_, o): fused_adagrad_ for o in ("default", "tensor_lr")},
}
