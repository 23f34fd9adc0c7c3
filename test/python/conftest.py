"""Fixtures shared by the pytest suites of several folders."""

from __future__ import annotations

import pytest


@pytest.fixture
def user_table():
    """Removes the lowering rules a test registers (`register_lowering`, `jax_op`) once it
    ends: the lowering table is process-wide."""
    from torch_tpu.kernels import _register_lowering
    from torch_tpu.compiler.lowering import LOWERINGS

    before = set(LOWERINGS)
    yield
    for target in set(LOWERINGS) - before:
        del LOWERINGS[target]
        _register_lowering._USER_RULES.pop(target, None)


@pytest.fixture
def strict_compile(monkeypatch):
    """TORCH_TPU_STRICT=1 (a fallback to eager is an error) around a fresh Dynamo cache,
    so each test compiles its own graphs."""
    import torch

    monkeypatch.setenv("TORCH_TPU_STRICT", "1")
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.fixture
def copies(monkeypatch) -> list:
    """The shapes of the device buffers copied (`DeviceBuffer.copy`) since the test began,
    or since the test cleared the list: a written storage whose buffer an op or program
    could not take (another reader held it) is passed as such a copy instead."""
    from torch_tpu.runtime.buffer import DeviceBuffer

    copied = []
    copy = DeviceBuffer.copy

    def spy(buffer):
        copied.append(buffer.shape)
        return copy(buffer)

    monkeypatch.setattr(DeviceBuffer, "copy", spy)
    return copied
