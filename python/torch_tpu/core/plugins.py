"""Where the TPU and CUDA PjRT plugins come from: the Python packages the runtime's
plugin discovery looks in (runtime/client.py) and that `core.host_heap` consults, without
importing them, to tell an accelerator host at `import torch`. Standard library only."""

from __future__ import annotations

# The libtpu package (its `get_library_path()` names libtpu.so).
TPU_PLUGIN_PACKAGE = "libtpu"

# Packages holding jax's CUDA PjRT plugin (`xla_cuda_plugin.so`), newest CUDA first.
CUDA_PLUGIN_PACKAGES = ("jax_cuda13_plugin", "jax_cuda12_plugin", "jax_plugins.xla_cuda13", "jax_plugins.xla_cuda12")
