"""Matmul precision, decided by PyTorch's own API.

`torch.set_float32_matmul_precision` sets the process-wide mode (medium -> DEFAULT,
high -> HIGH, highest -> HIGHEST on XLA's dot/convolution); `torch_tpu.precision(mode)`
overrides it for the current thread in a `with` block. The mode in force when a compiled
graph is *called* selects its program (`_invoker.PrecisionKeyed`), so a function compiled
under one mode and called under another runs at the caller's precision.
"""

from __future__ import annotations

import contextlib
import logging

import torch

log = logging.getLogger("torch_tpu")

MODES = ("medium", "high", "highest")
# Passes of the bf16 matrix unit per f32 product on TPU, relative to "medium".
_COST = {"high": 3, "highest": 6}

# The `precision` blocks open on this thread, innermost last, kept in PyTorch's thread-local
# Python objects rather than a `threading.local`: PyTorch hands those to the threads that
# run work on the caller's behalf -- the autograd engine's device thread, which runs every
# backward op of tpu tensors -- so `with torch_tpu.precision("medium"): loss.backward()`
# runs the backward's matrix products at "medium", as it runs the forward's. A tuple,
# replaced on entry and exit: a snapshot taken inside a block never sees a later change.
_KEY = "torch_tpu.precision"


def _open_blocks() -> tuple[str, ...]:
    return torch._C._get_obj_in_tls(_KEY) if torch._C._is_key_in_tls(_KEY) else ()


_warned: set[str] = set()


def current_mode() -> str:
    """The precision mode in effect on this thread (~0.3 us: read on every call of a
    compiled graph with matrix ops)."""
    blocks = _open_blocks()
    return blocks[-1] if blocks else torch.get_float32_matmul_precision()


@contextlib.contextmanager
def precision(mode: str):
    """Scoped float32 matmul precision for compiled code *called* inside the block, on
    this thread only:

        with torch_tpu.precision("highest"):
            loss = compiled_model(x)

    `mode` is PyTorch's name: "medium" (XLA precision DEFAULT: one bf16 pass of the TPU
    matrix unit), "high" (HIGH, three passes) or "highest" (HIGHEST, six passes: float32
    accuracy). It applies to every `dot_general`/`convolution` of the graphs called
    inside the block -- their backward too, which autograd runs on its own thread -- and
    overrides `torch.set_float32_matmul_precision` there; outside
    any block that setting applies. The mode in force at call time selects the compiled
    program: a function compiled under one mode and called under another compiles (once)
    for the caller's mode, so no `torch._dynamo.reset()` is needed. Graphs without matrix
    ops have one program for every mode. "high"/"highest" log a one-time cost warning
    when a graph compiles for a TPU. `torch_tpu.export` uses the mode in force when it
    is called. A mode other than the three names raises ValueError."""
    if mode not in MODES:
        raise ValueError(f"torch_tpu.precision: mode must be one of {', '.join(MODES)}, got {mode!r}")
    # No cost warning here: it concerns TPUs only, and the platform is known when a graph
    # compiles (`warn_cost` is called there).
    outer = _open_blocks()
    torch._C._stash_obj_in_tls(_KEY, (*outer, mode))
    try:
        yield
    finally:
        torch._C._stash_obj_in_tls(_KEY, outer)


def warn_cost(mode: str, platform: str) -> None:
    """Warns once per mode that high/highest cost extra matrix-unit passes, on TPU only
    (XLA:CPU and GPUs compute float32 products natively)."""
    if platform == "tpu" and mode in _COST and mode not in _warned:
        _warned.add(mode)
        log.warning(
            "torch_tpu: float32 matmul precision '%s' costs about %dx the matrix-unit passes of "
            "'medium' on TPU; use torch.set_float32_matmul_precision('medium') or "
            "torch_tpu.precision('medium') where bf16-pass accuracy suffices",
            mode, _COST[mode],
        )
