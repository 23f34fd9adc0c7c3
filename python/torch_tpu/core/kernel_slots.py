"""Kernels a higher layer offers to a lowering below it.

A lowering in the compiler may have a faster form that only a higher layer can build:
the fused attention's forward as a Pallas kernel needs `jax`, which only the kernels
layer may import (the runtime and compiler never depend on it). The higher layer offers
the kernel here, by slot name, when it is imported; the lowering asks for the slot's
kernels at lowering time and uses the first one that takes its arguments, else its own
StableHLO. Neither side imports the other, and nothing heavy loads to fill a slot.

Standard library only, so every layer may import it.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Callable, Iterator

__all__ = ["FUSED_ATTENTION_BACKWARD", "FUSED_ATTENTION_FORWARD", "declined", "offer", "offered", "recording",
           "used"]

# `kernel(ctx, query, key, value, attn_mask, is_causal, scale) -> (out, logsumexp) | None`:
# the forward of scaled dot-product attention over static (batch, heads, seq, dim)
# operands (MLIR values), out in the query's dtype and logsumexp (batch, heads, seq) in
# float32; None declines (the lowering then builds its own).
FUSED_ATTENTION_FORWARD = "fused_attention_forward"
# `kernel(ctx, grad_out, query, key, value, out, logsumexp, attn_mask, is_causal, scale)
# -> (grad_query, grad_key, grad_value) | None`: its backward, from the forward's output and
# logsumexp, each gradient in its input's dtype.
FUSED_ATTENTION_BACKWARD = "fused_attention_backward"

_SLOTS: dict[str, list[Callable]] = {}


def offer(slot: str, kernel: Callable) -> None:
    """Adds `kernel` to `slot`; a kernel of the same module and name replaces the one
    offered before (a module reloaded offers its new function in the old one's place)."""
    kernels = _SLOTS.setdefault(slot, [])
    name = _name(kernel)
    for i, known in enumerate(kernels):
        if _name(known) == name:
            kernels[i] = kernel
            return
    kernels.append(kernel)


def _name(kernel: Callable) -> tuple:
    return getattr(kernel, "__module__", None), getattr(kernel, "__qualname__", repr(kernel))


def offered(slot: str) -> tuple[Callable, ...]:
    """The kernels offered for `slot`, first offered first; none inside `declined()`."""
    if getattr(_scope, "declined", False):
        return ()
    return tuple(_SLOTS.get(slot, ()))


# Per thread: a module builds on one thread (a compile on the cache's thread builds nothing).
_scope = threading.local()


def used(slot: str) -> None:
    """Called by a lowering whose module now holds a kernel from `slot`."""
    record = getattr(_scope, "used", None)
    if record is not None:
        record.append(slot)


@contextlib.contextmanager
def recording() -> Iterator[list[str]]:
    """The slots whose kernels the modules built inside used (`used`), in order: what
    to build without (`declined`) when XLA rejects the module."""
    outer = getattr(_scope, "used", None)
    _scope.used = record = []
    try:
        yield record
    finally:
        _scope.used = outer
        if outer is not None:
            outer.extend(record)


@contextlib.contextmanager
def declined() -> Iterator[None]:
    """Inside, no slot offers a kernel: lowerings build their own StableHLO."""
    outer = getattr(_scope, "declined", False)
    _scope.declined = True
    try:
        yield
    finally:
        _scope.declined = outer
