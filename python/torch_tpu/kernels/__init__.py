"""Kernels written in JAX/Pallas and called from PyTorch through `torch_tpu.jax_op`
(docs/howto/call-a-jax-kernel.md). Importing this package imports neither jax nor the
compiler; the first call does."""

from .flash_attention import flash_attention

__all__ = ["flash_attention"]
