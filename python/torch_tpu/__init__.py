"""torch_tpu: a PyTorch backend for XLA devices (TPU, and GPU/CPU through PjRT)."""

__version__ = "0.1.0"
