"""Compiled optimizer steps keep their step counts on the tpu device, as on CUDA.

When Dynamo traces `opt.step()`, it makes the step *capturable* (`capturable=True`: the
step counts and bias corrections are tensors on the parameters' device, computed inside
the graph) for parameter groups on CUDA or XPU whose state is not initialised yet
(`OptimizerVariable._set_capturable`), and traces every group as capturable. Other
devices keep `capturable=False` in the real group, so the state the optimizer creates
holds each parameter's step count on the CPU: the compiled step then takes one CPU
tensor per parameter as an input and returns one as a CPU result -- on a TPU a host
upload and a download per parameter per step (147 each for a 495 M-parameter Llama),
and a wait for the step's program before the next can be launched.

`install()` gives groups of tpu parameters the treatment CUDA's get, on the same
conditions (the group has a `capturable` option, no parameter has state yet). PyTorch's
optimizers support capturable steps on PrivateUse1 devices
(`torch.optim.optimizer._get_capturable_supported_devices`), so an eager step after
a compiled one (or a `load_state_dict`) keeps working.
"""

from __future__ import annotations

from typing import Any

_MARK = "_torch_tpu_tpu_groups_capturable"


def _tpu_group_capturable(optimizer: Any, group: dict) -> bool:
    params = group.get("params", [])
    return ("capturable" in group and bool(params)
            and all(getattr(p, "device", None) is not None and p.device.type == "tpu" for p in params)
            and all(p not in optimizer.state for p in params))


def install() -> bool:
    """Wraps `OptimizerVariable._set_capturable` (once); False when this torch has none,
    leaving Dynamo as it is."""
    try:
        from torch._dynamo.variables.optimizer import OptimizerVariable
    except ImportError:
        return False
    original = OptimizerVariable.__dict__.get("_set_capturable")
    if original is None:
        return False
    if getattr(original, _MARK, False):
        return True

    def _set_capturable(self, tx):
        for group in self.value.param_groups:
            if _tpu_group_capturable(self.value, group):
                group["capturable"] = True
        return original(self, tx)

    setattr(_set_capturable, _MARK, True)
    _set_capturable.__wrapped__ = original
    _set_capturable.__doc__ = original.__doc__
    OptimizerVariable._set_capturable = _set_capturable
    return True
