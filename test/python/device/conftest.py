"""Runs the eager-device test modules in each eager mode that applies: Strict (the
default) and FUSED (ops recorded and run as one program at each flush point, issue 14).

A module listed in FUSED_MODULES gets every test twice (`[strict]`, `[fused]`) unless the
test parametrises `mode` itself (it lists the modes it runs in); a test whose subject only
exists in Strict mode is marked `@pytest.mark.strict_only("why")` and skipped in FUSED.
The FUSED run also sets TORCH_TPU_DEFER_AND_FUSE=1, so subprocesses a test starts run
FUSED too."""

import pytest

from torch_tpu.device import EagerMode, _fused, set_eager_mode

FUSED_MODULES = {
    "test_device_basics", "test_device_training", "test_device_training_models", "test_device_random",
    "test_device_compile", "test_device_serialization", "test_device_autocast", "test_device_result_shapes",
    "test_device_storage_layout", "test_device_recurrent", "test_device_transformer_fast_path",
    "test_device_optimizer_variants", "test_device_kernel_gaps",
}


def pytest_configure(config):
    config.addinivalue_line("markers", "strict_only(reason): the test's subject exists only in Strict mode")


def pytest_generate_tests(metafunc):
    module = metafunc.module.__name__.rsplit(".", 1)[-1]
    if module in FUSED_MODULES and "mode" not in metafunc.fixturenames:
        metafunc.parametrize("eager_mode", ["strict", "fused"], indirect=True)


@pytest.fixture(autouse=True)
def background_compiles_end_with_the_test():
    """A FUSED trace's (or a deferred Strict step's) program compiles on a background
    thread; the test that started it waits for it at its end, so that the compile is not
    counted in a later test's compile figures (the compile cache's counters are the
    process's)."""
    yield
    _fused.wait_for_compiles()


@pytest.fixture(autouse=True)
def eager_mode(request, monkeypatch):
    name = getattr(request, "param", "strict")
    if name != "fused":
        yield name
        return
    marker = request.node.get_closest_marker("strict_only")
    if marker is not None:
        pytest.skip(f"Strict-only: {marker.args[0]}")
    # The variable is set inside the scope: the process's default mode is read from the
    # environment the first time it is asked for, and asked for on entering the scope,
    # which restores it on exit -- read under the variable, it would leak FUSED into
    # every later test.
    with set_eager_mode(EagerMode.FUSED):
        monkeypatch.setenv("TORCH_TPU_DEFER_AND_FUSE", "1")
        yield name
