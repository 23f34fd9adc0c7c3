"""`Module.to("tpu")`, `.cpu()`, `.tpu()`, `.to_empty(device="tpu")` keep the Parameter
objects, as they do between CPU and CUDA: an optimizer made before the move updates the
parameters the model uses.

PyTorch's `Module._apply` keeps a Parameter (`param.data = moved`) only where
`torch._has_compatible_shallow_copy_type(param, moved)` holds, and that C++ test counts CPU,
CUDA, XPU, ... as interchangeable dense backends but not PrivateUse1. Across cpu <-> tpu it
therefore makes a new Parameter and stores it in `module._parameters`; the optimizer kept
stepping the old CPU objects and the loss stayed flat, silently. `set_data` itself refuses
such a pair (the same C++ test), so the Parameter cannot be updated in place either.

The wrapper below lets `_apply` run unchanged, then gives each replaced Parameter back its
object: the tensor swap of `torch.utils.swap_tensors` (the mechanism of
`torch.__future__.set_swap_module_params_on_conversion`) moves the new tensor into the old
Python object, whose class, attributes and hooks stay (as `set_data` keeps them). A gradient
gets the same treatment, so `p.grad` keeps its identity too. A parameter that cannot be
swapped (another C++ reference to it, a view say) stays a new object, with a warning naming
the user's line. Where a move does not cross tpu, or
the user asked for new objects (`torch.__future__.set_overwrite_module_params_on_conversion`),
nothing changes. Buffers are replaced on CUDA too, and are here.

An `nn.TransformerEncoder` moved to the tpu device stops converting its input to a nested
tensor (`use_nested_tensor`, the padding-mask fast path of eval mode: nested tensors do not
exist on the device; moved back, it converts again). Its outputs at padded positions are
then those of PyTorch's path without nested tensors (unspecified values, as under
`torch.compile`, where the nested path is off too), its other outputs the same.

Optimizer state is not moved, as on CUDA: Adam's `exp_avg` made before a move stays on the
old device, and the next step fails with PyTorch's device-mismatch error.
"""

from __future__ import annotations

import logging
import threading

import torch

log = logging.getLogger("torch_tpu")
_original_apply = None


def _crosses_tpu(old: torch.Tensor, new: torch.Tensor) -> bool:
    """Whether `_apply` replaced `old` only because tpu is not one of PyTorch's dense
    backends: CUDA would have kept the object (`param.data = new`)."""
    if old.layout != torch.strided or new.layout != torch.strided:
        return False
    devices = {old.device.type, new.device.type}
    return "tpu" in devices and devices <= {"tpu", "cpu"} and type(new) in (torch.Tensor, torch.nn.Parameter)


def _poisoned(grad_outputs):
    raise RuntimeError(
        "torch_tpu: backward reached a parameter that moved between cpu and tpu after the forward "
        "that used it; move the model before the forward (or after the backward)")


def _check_single_use(t: torch.Tensor) -> None:
    """What `torch.utils.swap_tensors` asks of each tensor: no other C++ reference to it,
    except the AccumulateGrad node of a graph still alive, which is then made to raise
    (its gradient would go to the moved tensor)."""
    count = t._use_count()
    if count == 1:
        return
    if count == 2 and t.is_leaf:
        node = torch.autograd.graph.get_gradient_edge(t).node
        if t._use_count() == 2:
            node.register_prehook(_poisoned)
            return
    raise RuntimeError("another tensor refers to it (a view of it, say)")


def _swap(old: torch.Tensor, new: torch.Tensor) -> None:
    """`old` takes `new`'s tensor (and `new` takes `old`'s); `old`'s Python class,
    attributes and hooks stay its own, as under `param.data = new`.

    This is `torch.utils.swap_tensors` without two of its steps. It refuses tensors with
    weak references, since a weak reference sees the new content; keeping the object is
    the point here, and `set_data` between cpu and cuda changes the object under weak
    references too (Dynamo holds some to every parameter of a module it compiled). It also
    exchanges the objects' classes and `__dict__`s, which would lose the user's attributes.
    Hooks live in the tensor's autograd metadata, which the swap exchanges: assigning the
    hook dicts again installs them on the new tensor, and the handles `register_hook`
    returned still remove them (they point at the dicts)."""
    _check_single_use(old)
    _check_single_use(new)
    hooks, post_hooks = old._backward_hooks, old._post_accumulate_grad_hooks
    torch._C._swap_tensor_impl(old, new)
    if hooks is not None:
        old._backward_hooks = hooks
    if post_hooks is not None:
        old._post_accumulate_grad_hooks = post_hooks


def _keep(module: torch.nn.Module, key: str, old: torch.nn.Parameter, new: torch.nn.Parameter) -> str | None:
    """Puts `old` back into `module._parameters[key]` with `new`'s tensor and gradient;
    why it could not, where it could not."""
    old_grad, new_grad = old.grad, new.grad
    # A gradient held by its parameter counts as a second reference to it.
    old.grad = None
    new.grad = None
    try:
        _swap(old, new)
    except RuntimeError as err:
        old.grad, new.grad = old_grad, new_grad
        return str(err)
    module._parameters[key] = old
    if new_grad is None:
        return None
    if old_grad is not None:
        try:
            _swap(old_grad, new_grad)
            new_grad = old_grad
        except RuntimeError:  # referenced elsewhere: the moved gradient is a new object
            pass
    old.grad = new_grad
    return None


_state = threading.local()


def _apply(self: torch.nn.Module, fn, recurse: bool = True):
    depth = getattr(_state, "depth", 0)
    if depth == 0:
        _state.failures = []  # reported once, by the outermost call (the user's `.to`)
    _state.depth = depth + 1
    try:
        before = [(key, p) for key, p in self._parameters.items() if p is not None]
        result = _original_apply(self, fn, recurse)
        if torch.__future__.get_overwrite_module_params_on_conversion():
            return result  # the user asked for new Parameter objects (on CUDA too)
        for key, old in before:
            new = self._parameters.get(key)
            if new is None or new is old or not _crosses_tpu(old, new):
                continue
            why = _keep(self, key, old, new)
            if why is not None:
                _state.failures.append(f"{self._get_name()}.{key} ({why})")
        if isinstance(self, torch.nn.TransformerEncoder):
            _nested_path_for_device(self)
        return result
    finally:
        _state.depth = depth
        if depth == 0 and _state.failures:
            _report(_state.failures)


def _nested_path_for_device(encoder: torch.nn.TransformerEncoder) -> None:
    """Turns the encoder's nested-tensor fast path off while its parameters are on the tpu
    device, and back on (where it was on) once they leave it."""
    on_tpu = any(p.device.type == "tpu" for p in encoder.parameters())
    if on_tpu and getattr(encoder, "use_nested_tensor", False):
        encoder.use_nested_tensor = False
        encoder._torch_tpu_nested_off = True
    elif not on_tpu and encoder.__dict__.pop("_torch_tpu_nested_off", False):
        encoder.use_nested_tensor = True


def _report(failures: list[str]) -> None:
    from ._fallback import user_line

    shown = "; ".join(failures[:3]) + ("; ..." if len(failures) > 3 else "")
    log.warning(
        "torch_tpu: the move at %s gave %d parameter(s) new Parameter objects: %s. An optimizer made "
        "before the move still holds the old ones: make it after the move, or drop the other "
        "references before moving", user_line(), len(failures), shown)


def install() -> None:
    """Routes `Module._apply` through `_apply` (idempotent). Subclasses that override
    `_apply` (RNNs, for their flat weights) call it through `super()`."""
    global _original_apply
    if torch.nn.Module._apply is _apply:
        return
    _original_apply = torch.nn.Module._apply
    torch.nn.Module._apply = _apply

