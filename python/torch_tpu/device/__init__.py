"""The eager `tpu` device: `torch.ones(2, device="tpu")`, `model.to("tpu")`.

Registered on `import torch` through PyTorch's `torch.backends` entry point (unless
`TORCH_DEVICE_BACKEND_AUTOLOAD=0`), or by importing this package. See
docs/explanation/eager-device.md."""

from ._modes import EagerMode, get_eager_mode, set_eager_mode
from ._registration import register

register()


__all__ = ["EagerMode", "get_eager_mode", "register", "set_eager_mode"]
