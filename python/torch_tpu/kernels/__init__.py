"""Ops from outside the compiler's lowering table: `torch_tpu.jax_op` (a JAX function or
Pallas kernel as a PyTorch custom op, `_jax_op` and its JAX trace `_jax_trace`;
docs/howto/call-a-jax-kernel.md), `torch_tpu.register_lowering` (a user's own lowering,
`_register_lowering`), and kernels written that way (`flash_attention`). Importing this
package imports neither jax nor the compiler; the first call does."""

from .flash_attention import flash_attention

__all__ = ["flash_attention"]
