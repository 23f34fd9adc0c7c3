"""Fixtures of the SPMD tests: a CPU client with 8 virtual devices standing in for 8 chips."""

from __future__ import annotations

import pytest
from torch_tpu.runtime import CacheConfig, Client


@pytest.fixture(scope="session")
def cpu8() -> Client:
    return Client.create("cpu", num_cpu_devices=8, cache_config=CacheConfig())
