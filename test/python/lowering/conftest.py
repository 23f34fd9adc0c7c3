"""Fixtures of the lowering tests."""

from __future__ import annotations

import zlib

import pytest
import torch


@pytest.fixture(autouse=True)
def _inputs_seeded_per_test(request):
    """Each test draws the same random inputs whatever ran before it: pytest-xdist hands
    the tests to its workers in an order that changes from run to run, so a module's seed
    fixed the draw of its first test only, and an unlucky draw (a group norm of three close
    values, 7e-6 off in one CI run) came and went with the order. The seed is the test id's
    CRC-32: stable across runs and machines, different per test."""
    torch.manual_seed(zlib.crc32(request.node.nodeid.encode()))
