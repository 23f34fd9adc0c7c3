"""The on-disk names of a saved export (`ExportedProgram.save`, `_saved_export.py`), apart
from the code that reads and writes one: telling whether a path is a saved export needs
no torch (`torchtpu-run file.mlir` asks it of every input and must start in 0.3 s, not 3)."""

from __future__ import annotations

import os

FORMAT = "torch_tpu.export"
FORMAT_VERSION = 1
MANIFEST = "export.json"


def is_saved_export(path: str) -> bool:
    """True when `path` is a folder written by `ExportedProgram.save` (it holds the manifest)."""
    return os.path.isdir(path) and os.path.isfile(os.path.join(path, MANIFEST))
