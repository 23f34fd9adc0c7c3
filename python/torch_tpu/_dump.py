"""TORCH_TPU_DUMP_DIR: everything needed to reproduce a compiled graph with
`torchtpu-opt` and `torchtpu-run` alone."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from . import config

log = logging.getLogger("torch_tpu")


class GraphDump:
    """Writes the stages of one graph's compilation under `<dir>/<name>/`."""

    def __init__(self, name: str) -> None:
        root = config.get_str("TORCH_TPU_DUMP_DIR")
        self.dir: Path | None = None
        if root:
            self.dir = Path(root) / name
            try:
                self.dir.mkdir(parents=True, exist_ok=True)
            except OSError as err:
                log.warning("torch_tpu: cannot write dumps to %s: %s", self.dir, err)
                self.dir = None
        self._step = 0

    @property
    def enabled(self) -> bool:
        return self.dir is not None

    def write(self, filename: str, text: str) -> None:
        if self.dir is None:
            return
        try:
            (self.dir / filename).write_text(text)
        except OSError as err:
            log.warning("torch_tpu: cannot write dump %s: %s", self.dir / filename, err)

    def write_stage(self, stage: str, text: str) -> None:
        """Numbered so the files sort in pipeline order."""
        self._step += 1
        self.write(f"{self._step:02d}-{stage}.mlir", text)

    def write_inputs(self, specs) -> None:
        if self.dir is None:
            return
        self.write(
            "inputs.json",
            json.dumps(
                [{"name": s.name, "shape": list(s.shape), "dtype": str(s.dtype).replace("torch.", ""), "role": s.role} for s in specs],
                indent=1,
            ),
        )
        self.write(
            "README.txt",
            "Reproduce with:\n"
            f"  torchtpu-opt {os.path.join(self.dir, '01-imported.mlir')} --torchtpu-verify\n"
            f"  torchtpu-run {os.path.join(self.dir, 'final.mlir')} --input <one .npy per entry of inputs.json>\n",
        )
