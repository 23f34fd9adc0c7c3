"""Fixtures shared by the pytest suites of several folders."""

from __future__ import annotations

import pytest


@pytest.fixture
def user_table():
    """Removes the lowering rules a test registers (`register_lowering`, `jax_op`) once it
    ends: the lowering table is process-wide."""
    from torch_tpu import _register_lowering
    from torch_tpu.compiler.lowering import LOWERINGS

    before = set(LOWERINGS)
    yield
    for target in set(LOWERINGS) - before:
        del LOWERINGS[target]
        _register_lowering._USER_RULES.pop(target, None)
