"""The execution layer under the Dynamo backend and the eager device.

What every program kind shares, in one place: the process's MLIR context and runtime
client (`context`), the named pipelines for a precision mode (`pipelines`), the one key
(`key`), the one program cache in front of the runtime's compile cache (`cache`), the dump
(`dump`, TORCH_TPU_DUMP_DIR) and `compile_module` (`compile`), which runs them in order.
This package imports neither the backend (`torch_tpu.backend`, `_compile`, ...) nor the
device (`torch_tpu.device`): both build on it.
"""

from .compile import Lowered, Program, compile_module
from .context import client, shared_context
from .key import ProgramKey

__all__ = ["Lowered", "Program", "ProgramKey", "client", "compile_module", "shared_context"]
