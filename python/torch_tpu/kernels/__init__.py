"""Ops from outside the compiler's lowering table: `torch_tpu.jax_op` (a JAX function or
Pallas kernel as a PyTorch custom op, `_jax_op` and its JAX trace `_jax_trace`;
docs/howto/call-a-jax-kernel.md), `torch_tpu.register_lowering` (a user's own lowering,
`_register_lowering`), kernels written that way (`flash_attention`), and the Pallas
forward it offers to the compiler's attention lowerings on a TPU (`_fused_attention`,
through `core.kernel_slots`). Importing this package imports neither jax nor the
compiler; the first call does."""

from . import _fused_attention  # noqa: F401  (offers its kernel on import)
from .flash_attention import flash_attention

__all__ = ["flash_attention"]
