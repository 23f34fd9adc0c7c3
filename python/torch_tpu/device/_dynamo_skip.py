"""Dynamo stays out of torch_tpu's own frames when they run.

While a function compiled by Dynamo runs, every Python frame entered on its thread passes
Dynamo's frame hook, and a frame of a file Dynamo does not skip (torch's own files are
skipped) gets compiled. An eager tpu op run there -- `print(t)` after a graph break, DDP's
hooks around a compiled forward, a collective's `Work.wait()` -- reaches the device's Python
kernels, and Dynamo compiled them: `print(y.sum() > 0)` in a compiled function of two frames
made Dynamo compile 31, and a compiled DDP job hit Dynamo's recompile limit in
`_ops._fast_signature` and `_buffers.new_storage` with a page of warnings per rank.

These frames are torch_tpu's implementation of single ops and collectives, never user code
to capture. `keep_dynamo_out()` marks their code objects SKIP for themselves and for every
frame they call, with PyTorch's C-level frame strategy (the mechanism `torch.compiler.disable`
uses for its own wrapper): no cost per call. Dynamo reading user code that calls them
(inlining while tracing) is unaffected: the strategy applies to frames that run.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator

# The packages whose frames run below the dispatcher, c10d or PjRT, never as user code.
_PACKAGES = ("torch_tpu.device", "torch_tpu.runtime", "torch_tpu.distributed", "torch_tpu.core")
_PREFIXES = tuple(package + "." for package in _PACKAGES)
_marked: set[types.CodeType] = set()


def keep_dynamo_out() -> int:
    """Marks the code of every loaded module of `_PACKAGES` not marked yet; how many code
    objects it marked (0 where this PyTorch has no frame strategies). Called when the device
    registers, when its op kernels register and when `tpu_dist` registers: frames of a module
    loaded later are reached only through frames marked here, and the mark is recursive."""
    try:
        from torch._C._dynamo.eval_frame import _FrameAction, _FrameExecStrategy, set_code_exec_strategy
    except ImportError:
        return 0
    strategy = _FrameExecStrategy(_FrameAction.SKIP, _FrameAction.SKIP)
    count = 0
    for name, module in list(sys.modules.items()):
        if module is None or not (name in _PACKAGES or name.startswith(_PREFIXES)):
            continue
        for code in _module_codes(module):
            if code not in _marked:
                set_code_exec_strategy(code, strategy)
                _marked.add(code)
                count += 1
    return count


def _module_codes(module: types.ModuleType) -> Iterator[types.CodeType]:
    """The code objects of the functions and methods `module` defines (not the ones it
    imports from elsewhere: torch's own functions must stay as Dynamo treats them), with the
    code of nested functions and lambdas."""
    name = module.__name__
    stack = list(vars(module).values())
    classes: set[int] = set()
    while stack:
        value = stack.pop()
        if isinstance(value, (staticmethod, classmethod)):
            value = value.__func__
        if isinstance(value, property):
            stack.extend(f for f in (value.fget, value.fset, value.fdel) if f is not None)
        elif isinstance(value, types.FunctionType):
            if value.__module__ == name:
                yield from _nested(value.__code__)
        elif isinstance(value, type):
            if value.__module__ == name and id(value) not in classes:
                classes.add(id(value))
                stack.extend(vars(value).values())
        elif callable(value) and isinstance(getattr(value, "__wrapped__", None), types.FunctionType):
            stack.append(value.__wrapped__)  # functools.lru_cache and other wrappers


def _nested(code: types.CodeType) -> Iterator[types.CodeType]:
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _nested(const)
