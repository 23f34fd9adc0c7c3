"""Every environment variable torch_tpu reads, with its type, default and meaning, in one
table. `docs/reference/env.md` is generated from `ENV_VARS`.

The public name of `torch_tpu.core.config` (the table lives in the layer-neutral core,
so the runtime and the tools read it without this frontend module).
"""

from __future__ import annotations

from torch_tpu.core.config import *  # noqa: F401,F403
from torch_tpu.core.config import __all__  # noqa: F401
