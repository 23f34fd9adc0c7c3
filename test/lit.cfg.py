# lit configuration for the whole test/ tree.     Run:  .venv/bin/lit test/ -v
#
# * `.mlir` files are tests; `.py` files are tests only when they hold a `RUN:` line
#   (FX-importer scripts); pytest suites live in test/python/ and are excluded.
# * Tools are run as `<python> -m torch_tpu.tools.<tool>`, so nothing depends on PATH.
# * Features for `REQUIRES:` / `lit.local.cfg`: `jax`, `torch` when importable. A
#   directory that needs one says, in its lit.local.cfg:
#       if "torch" not in config.available_features:
#           config.unsupported = True
# pylint: disable=undefined-variable  (lit provides `config` and `lit_config`)

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys

TEST_ROOT = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(TEST_ROOT)


def _can_import_torch_tpu(python: str) -> bool:
    if os.path.realpath(python) == os.path.realpath(sys.executable):
        return importlib.util.find_spec("torch_tpu") is not None
    probe = "import importlib.util,sys; sys.exit(importlib.util.find_spec('torch_tpu') is None)"
    return subprocess.run([python, "-c", probe], capture_output=True).returncode == 0


def _pick_python() -> str:
    """The running interpreter when it can import torch_tpu, else the repo's venv."""
    candidates = [sys.executable, os.path.join(REPO_ROOT, ".venv", "bin", "python")]
    for python in candidates:
        if os.path.exists(python) and _can_import_torch_tpu(python):
            return python
    lit_config.fatal(
        "no Python interpreter that can import torch_tpu; install the project "
        "(pip install -e '.[test]') or create the venv at .venv/"
    )


def _importable(python: str, modules: list[str]) -> set[str]:
    if os.path.realpath(python) == os.path.realpath(sys.executable):
        return {m for m in modules if importlib.util.find_spec(m) is not None}
    probe = (
        "import importlib.util,sys; "
        "print(' '.join(m for m in sys.argv[1:] if importlib.util.find_spec(m)))"
    )
    out = subprocess.run([python, "-c", probe, *modules], capture_output=True, text=True)
    return set(out.stdout.split())


sys.path.insert(0, os.path.join(TEST_ROOT, "lit_support"))
from torch_tpu_lit_format import ShTestWithRunLines  # noqa: E402

config.name = "torch_tpu"
# The internal shell (pipes, 2>&1, <, &&) is portable; no bash needed.
config.test_format = ShTestWithRunLines(execute_external=False)
config.suffixes = [".mlir", ".py"]
config.excludes = ["python", "tpu", "__pycache__", "lit_support", "Inputs", "lit.cfg.py", "lit.local.cfg"]
config.test_source_root = TEST_ROOT
config.test_exec_root = os.path.join(REPO_ROOT, "build", "lit")

python = _pick_python()
py = shlex.quote(python)


def _word(name: str) -> str:
    # A whole command word: not inside a path, a flag or a longer name.
    return r"(?<![\w./-])" + re.escape(name) + r"(?![\w./-])"


def _filecheck() -> str:
    beside = os.path.join(os.path.dirname(python), "filecheck")
    if os.path.exists(beside):
        return shlex.quote(beside)
    found = shutil.which("filecheck")
    if found:
        return shlex.quote(found)
    return f"{py} -m filecheck"


config.substitutions.append(("%PYTHON", py))
config.substitutions.append((_word("torchtpu-opt"), f"{py} -m torch_tpu.tools.opt"))
config.substitutions.append((_word("torchtpu-run"), f"{py} -m torch_tpu.tools.run"))
config.substitutions.append((_word("FileCheck"), _filecheck()))
config.substitutions.append(
    (_word("not"), f"{py} {shlex.quote(os.path.join(TEST_ROOT, 'lit_support', 'not.py'))}")
)

for feature in sorted(_importable(python, ["jax", "torch"])):
    config.available_features.add(feature)

# lit starts tests with a clean environment; keep what the tools read.
for name, value in os.environ.items():
    if name.startswith(("TORCH_TPU_", "XLA_", "JAX_")) or name in ("HOME", "TMPDIR", "LANG", "LC_ALL"):
        config.environment[name] = value
config.environment["PYTHONUNBUFFERED"] = "1"
