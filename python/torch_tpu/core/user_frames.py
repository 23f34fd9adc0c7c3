"""Which stack frame is the user's: the one policy every error message, MLIR location and
call-site record of torch_tpu applies (a compiled graph's FX `stack_trace`, the eager
device's fallback errors and fused-program locations, `tpu_dist`'s collective call
sites).

A frame is the user's unless its code is one of:

* torch's or torch_tpu's own (the folders their packages were loaded from -- torch's
  Dynamo, FX and `nn` machinery included; never a substring of the path, so a user's
  `~/torch/model.py` stays the user's);
* the Python standard library (`contextlib`, `copy`, `threading` wrap user calls and are
  never the line a user means), and `typing_extensions`, whose `deprecated` wrapper sits
  between a user's call and a deprecated torch API;
* generated code with no file of its own: a pseudo-file name in angle brackets (FX's
  `<eval_with_key>.3`, dataclass and namedtuple methods' `<string>`, `<frozen runpy>`) --
  except interactive input, which is the user's (`<stdin>`, an IPython cell's
  `<ipython-input-3-...>`; newer IPython runs a cell from a real file,
  `/tmp/ipykernel_*/*.py`, which is the user's like any other file).

Other installed packages (transformers, a user's own package installed with pip) are
user code: they hold the model's lines, where an op or a collective is called.

The rule reads only file names, so it applies alike to live frames and to frames
printed in a traceback text. Answers are cached per file name: the eager device asks on
every op. Standard library only (this is the core): torch's folder is found with
`importlib.util.find_spec`, which does not import it.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import re
import sys
import sysconfig
from collections.abc import Iterable
from types import FrameType

# Packages whose code is never the user's: torch and torch_tpu's top-level folders
# (`[tool.setuptools] package-dir` maps the compiler, runtime and tools to folders of
# their own in a source checkout).
_INTERNAL_PACKAGES = ("torch", "torch_tpu", "torch_tpu.compiler", "torch_tpu.runtime", "torch_tpu.tools",
                      # Only wraps calls: its `deprecated` decorator is the frame between
                      # the user's line and a deprecated torch API (all_gather_into_tensor).
                      "typing_extensions")
# Pseudo-files that hold what a person typed.
_INTERACTIVE = ("<stdin>", "<ipython-input-")
_TRACE_FRAME = re.compile(r'File "([^"]+)", line (\d+)')

_is_user: dict[str, bool] = {}


def is_user_file(filename: str) -> bool:
    """Whether code from `filename` (a code object's `co_filename`) is the user's."""
    answer = _is_user.get(filename)
    if answer is None:
        answer = _is_user[filename] = _classify(filename)
    return answer


def innermost_user_frame(frame: FrameType | None = None) -> tuple[str, int] | None:
    """(file, line) of the innermost user frame of the running stack, from `frame`
    outwards (default: the caller's frame);
    None when there is none (a call made from C++, such as DDP's reducer)."""
    if frame is None:
        frame = sys._getframe(1)
    known = _is_user  # (the cache read inline: FUSED mode asks on every recorded op)
    while frame is not None:
        filename = frame.f_code.co_filename
        answer = known.get(filename)
        if answer is None:
            answer = is_user_file(filename)
        if answer:
            return filename, frame.f_lineno
        frame = frame.f_back
    return None


def innermost_user(frames: Iterable[tuple[str, int]]) -> tuple[str, int] | None:
    """The innermost user frame of `frames` ((file, line) pairs, outermost first, as a
    traceback lists them); None when none is the user's."""
    found = None
    for filename, line in frames:
        if is_user_file(filename):
            found = (filename, line)
    return found


def frames_of_trace(text: str | None) -> list[tuple[str, int]]:
    """The (file, line) frames of a printed traceback (`traceback.format_stack`, an FX
    node's `stack_trace`), outermost first."""
    return [(f, int(line)) for f, line in _TRACE_FRAME.findall(text or "")]


# -- the rule ----------------------------------------------------------------------------------
def _classify(filename: str) -> bool:
    if filename.startswith("<"):
        return filename.startswith(_INTERACTIVE)
    path = os.path.realpath(os.path.abspath(filename))
    if any(_inside(path, root) for root in _internal_roots()):
        return False
    return not _in_standard_library(path)


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root + os.sep)


@functools.lru_cache(maxsize=1)
def _internal_roots() -> tuple[str, ...]:
    roots = []
    for name in _INTERNAL_PACKAGES:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):  # not installed (a runtime-only environment)
            spec = None
        if spec is not None and spec.submodule_search_locations:
            roots += [os.path.realpath(p) for p in spec.submodule_search_locations]
        elif spec is not None and spec.origin and os.path.isfile(spec.origin):  # a one-file module
            roots.append(os.path.realpath(spec.origin))
    return tuple(roots)


@functools.lru_cache(maxsize=1)
def _library_roots() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(standard library folders, third-party package folders): the base interpreter's
    site-packages lies inside its standard library folder, and is not the library."""
    paths = sysconfig.get_paths()
    stdlib = {os.path.realpath(paths[k]) for k in ("stdlib", "platstdlib") if paths.get(k)}
    packages = {os.path.realpath(paths[k]) for k in ("purelib", "platlib") if paths.get(k)}
    return tuple(sorted(stdlib)), tuple(sorted(packages))


def _in_standard_library(path: str) -> bool:
    stdlib, packages = _library_roots()
    if not any(_inside(path, root) for root in stdlib):
        return False
    if any(_inside(path, root) for root in packages):
        return False
    parts = path.split(os.sep)
    return "site-packages" not in parts and "dist-packages" not in parts
