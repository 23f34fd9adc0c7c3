"""The TPU suite: every user-facing path of torch_tpu, run on a real TPU chip.

    pytest test/tpu          # on a TPU VM, one process (one process holds the chip)

Every test is marked `tpu` and skipped, with the reason, where no TPU is present (CI). The
chip is detected without opening it (the libtpu package or TPU_LIBRARY_PATH, and a TPU device
node), because the modules that start other processes (test_00_processes.py) must run before
this process opens the chip: a second process cannot open a chip this one holds.

TORCH_TPU_TEST_TPU_ON_CPU=1 runs the suite on XLA:CPU instead (to develop the tests on a
machine without a TPU; what is TPU-specific is skipped there with its reason).
"""

from __future__ import annotations

import os

import pytest

from tpu_support import ON_CPU, tpu_present


def pytest_collection_modifyitems(config, items):
    here = os.path.dirname(__file__)
    reason = tpu_present()
    for item in items:
        if not str(item.fspath).startswith(here):
            continue
        item.add_marker(pytest.mark.tpu)
        if reason is not None:
            item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(scope="session")
def platform() -> str:
    """Opens the device (the chip, once per process) and returns its platform name."""
    from torch_tpu.runtime import get_client

    name = get_client().platform
    if name != "tpu" and not ON_CPU:
        pytest.fail(f"a TPU was detected but torch_tpu started the {name} platform: see TORCH_TPU_PLATFORM")
    return name


@pytest.fixture
def chip(platform):
    """For tests that need the device: the platform name, with the eager mode left as found."""
    import torch_tpu.device  # noqa: F401 - registers the device where autoload is off
    from torch_tpu.device import get_eager_mode, set_eager_mode

    before = get_eager_mode()
    yield platform
    set_eager_mode(before)
