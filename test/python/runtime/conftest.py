"""Fixtures of the runtime tests. Every test gets clients of its own (`Client.create`), so
the process-wide client and the user's TORCH_TPU_CACHE_* settings are never touched."""

from __future__ import annotations

import os

import pytest
from torch_tpu.runtime import CacheConfig, Client


@pytest.fixture(autouse=True)
def _no_ambient_cache_env(monkeypatch):
    for name in list(os.environ):
        if name.startswith("TORCH_TPU_CACHE") or name == "WORLD_SIZE":
            monkeypatch.delenv(name)


@pytest.fixture(scope="session")
def cpu4() -> Client:
    """A CPU client with 4 devices and an in-process cache only."""
    return Client.create("cpu", num_cpu_devices=4, cache_config=CacheConfig())


@pytest.fixture()
def client() -> Client:
    """A fresh single-device CPU client with an in-process cache only."""
    return Client.create("cpu", num_cpu_devices=1, cache_config=CacheConfig())


@pytest.fixture()
def cache_dirs(tmp_path):
    l2 = tmp_path / "l2"
    l3 = tmp_path / "l3"
    return str(l2), str(l3)
