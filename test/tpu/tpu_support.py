"""Helpers of the TPU suite (a module of its own name: several test folders have a conftest)."""

from __future__ import annotations

import glob
import importlib.util
import os

import pytest

ON_CPU = os.environ.get("TORCH_TPU_TEST_TPU_ON_CPU") == "1"


def tpu_present() -> str | None:
    """None when a TPU is present, else why not (never opens the chip)."""
    if ON_CPU:
        return None
    if os.environ.get("TORCH_TPU_PLATFORM", "tpu") != "tpu":
        return f"TORCH_TPU_PLATFORM={os.environ['TORCH_TPU_PLATFORM']} selects another platform"
    if not os.environ.get("TPU_LIBRARY_PATH") and importlib.util.find_spec("libtpu") is None:
        return "no TPU: the libtpu package is not installed (and TPU_LIBRARY_PATH is unset)"
    if not (glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*")):
        return "no TPU: libtpu is installed but no TPU device node (/dev/accel*, /dev/vfio/N) exists"
    return None


def tpu_only(platform: str, what: str) -> None:
    if platform != "tpu":
        pytest.skip(f"TPU-specific: {what} (running on {platform} with TORCH_TPU_TEST_TPU_ON_CPU=1)")
