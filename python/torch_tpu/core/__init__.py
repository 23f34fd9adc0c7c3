"""The layer-neutral core of torch_tpu: what the frontend, the compiler, the runtime and
the tools all need, and nothing else.

* `config`: every environment variable torch_tpu reads, as a typed table with one parser;
* `dtypes`: the element-type rows (StableHLO, NumPy, torch and safetensors names);
* `mlir`: the MLIR context factory (jaxlib is imported inside it, on first use);
* `attributes`: the MLIR attribute names torch_tpu reads and writes.

It imports nothing of torch_tpu outside itself, never torch, and jaxlib only inside
`mlir.make_context`, so the torch-free runtime and tools (`torchtpu-opt`,
`torchtpu-cache`) can use every module here. The layer contracts that keep it so are in
`pyproject.toml` (`[tool.importlinter]`), checked by `test/python/test_layers.py`.
"""

from __future__ import annotations

# The package version: `torch_tpu.__version__`, the runtime's cache key and the saved
# export format all read it from here (keep it equal to `version` in pyproject.toml).
__version__ = "0.1.0"
