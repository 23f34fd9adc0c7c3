"""The client of a process in a multi-process job (`client.make_multiprocess_raw_client`):
the platform the single-process client would use, built the way jax builds it. Only
XLA:CPU runs here; for the TPU and CUDA plugins these tests check what is handed to
jaxlib (`make_c_api_client(name, options + {node_id, num_nodes}, distributed_client)`)
and the errors of a missing plugin -- a real plugin is not started (no GPU or TPU)."""

from __future__ import annotations

import os

import inspect

import pytest

from torch_tpu.runtime import _jaxlib
from torch_tpu.runtime import client as client_module
from torch_tpu.runtime.errors import PlatformError

COORDINATION = object()  # stands for jaxlib's DistributedRuntimeClient


@pytest.fixture(autouse=True)
def _no_ambient_platform(monkeypatch):
    for name in ("TORCH_TPU_PLATFORM", "TPU_LIBRARY_PATH", "TORCH_TPU_CUDA_PLUGIN_PATH"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture()
def started(monkeypatch):
    """What would have been started: the plugin client's and the CPU client's arguments."""
    calls = []

    def plugin(name, path, options, distributed_client=None):
        calls.append(("plugin", name, path, options, distributed_client))
        return f"{name} client"

    def cpu(dclient, node_id, num_nodes, hostname):
        calls.append(("cpu", dclient, node_id, num_nodes, hostname))
        return "cpu client"

    monkeypatch.setattr(_jaxlib, "make_plugin_client", plugin)
    monkeypatch.setattr(_jaxlib, "make_distributed_cpu_client", cpu)
    return calls


def _fake_library(tmp_path, name):
    path = tmp_path / name
    path.write_bytes(b"not a shared library")
    return str(path)


def test_cuda_process_gets_its_rank_the_job_size_the_coordination_client_and_its_gpu(
        monkeypatch, tmp_path, started):
    path = _fake_library(tmp_path, "xla_cuda_plugin.so")
    monkeypatch.setenv("TORCH_TPU_PLATFORM", "gpu")
    monkeypatch.setenv("TORCH_TPU_CUDA_PLUGIN_PATH", path)
    platform, raw = client_module.make_multiprocess_raw_client(COORDINATION, 1, 4, "10.0.0.2", local_device=3)
    assert (platform, raw) == ("cuda", "cuda client")
    [(kind, name, got_path, options, dclient)] = started
    assert (kind, name, got_path, dclient) == ("plugin", "cuda", path, COORDINATION)
    assert options["node_id"] == 1 and options["num_nodes"] == 4 and options["visible_devices"] == [3]
    # the plugin's own options (jaxlib's generate_pjrt_gpu_plugin_options) are kept
    assert set(_jaxlib.gpu_plugin_options()) <= set(options)


def test_tpu_process_gets_its_rank_and_the_job_size(monkeypatch, tmp_path, started):
    path = _fake_library(tmp_path, "libtpu.so")
    monkeypatch.setenv("TORCH_TPU_PLATFORM", "tpu")
    monkeypatch.setenv("TPU_LIBRARY_PATH", path)
    assert client_module.make_multiprocess_raw_client(COORDINATION, 0, 2, "h", local_device=0) == ("tpu", "tpu client")
    assert started == [("plugin", "tpu", path, {"node_id": 0, "num_nodes": 2}, COORDINATION)]


def test_without_plugins_the_job_runs_on_xla_cpu(started):
    assert client_module.make_multiprocess_raw_client(COORDINATION, 1, 2, "127.0.0.1") == ("cpu", "cpu client")
    assert started == [("cpu", COORDINATION, 1, 2, "127.0.0.1")]


def test_a_forced_platform_without_its_plugin_says_what_to_install(monkeypatch, started):
    monkeypatch.setenv("TORCH_TPU_PLATFORM", "tpu")
    with pytest.raises(PlatformError, match=r"no TPU PjRT plugin: install libtpu \(pip install 'libtpu==0\.0\.42\.\*'"):
        client_module.make_multiprocess_raw_client(COORDINATION, 0, 2, "h")
    monkeypatch.setenv("TORCH_TPU_PLATFORM", "cuda")
    with pytest.raises(PlatformError, match=r"no CUDA PjRT plugin: install it \(pip install 'jax-cuda12-plugin"):
        client_module.make_multiprocess_raw_client(COORDINATION, 0, 2, "h")
    assert started == []


def test_a_broken_plugin_is_an_error_when_forced_and_skipped_when_discovered(monkeypatch, tmp_path):
    """The real loading path: jaxlib refuses a file that is no plugin before any
    connection is made."""
    monkeypatch.setenv("TORCH_TPU_CUDA_PLUGIN_PATH", _fake_library(tmp_path, "xla_cuda_plugin.so"))
    monkeypatch.setenv("TORCH_TPU_PLATFORM", "cuda")
    with pytest.raises(PlatformError, match=r"the CUDA plugin at .*xla_cuda_plugin\.so failed to start"):
        client_module.make_multiprocess_raw_client(None, 0, 2, "h", local_device=0)
    monkeypatch.delenv("TORCH_TPU_PLATFORM")
    cpu = []
    monkeypatch.setattr(_jaxlib, "make_distributed_cpu_client", lambda *args: cpu.append(args) or "cpu client")
    assert client_module.make_multiprocess_raw_client(None, 0, 2, "h", local_device=0) == ("cpu", "cpu client")


def test_jaxlib_takes_the_distributed_client_as_make_c_api_client_third_argument():
    """The call `make_plugin_client` makes, against the installed jaxlib's signature."""
    from jaxlib import xla_client

    parameters = list(inspect.signature(xla_client.make_c_api_client).parameters)
    assert parameters[:3] == ["plugin_name", "options", "distributed_client"]


@pytest.mark.parametrize("forced", ["cpu", " CPU "])
def test_a_forced_cpu_platform_gets_the_gloo_cpu_client_not_a_plugin(monkeypatch, started, forced):
    """TORCH_TPU_PLATFORM=cpu sent "cpu" to the plugin lookup ("unknown platform 'cpu'"),
    so every multi-process job with the variable set failed to start."""
    monkeypatch.setenv("TORCH_TPU_PLATFORM", forced)
    assert client_module.make_multiprocess_raw_client(COORDINATION, 1, 2, "127.0.0.1") == ("cpu", "cpu client")
    assert started == [("cpu", COORDINATION, 1, 2, "127.0.0.1")]


def test_a_client_that_fails_to_start_is_named_by_its_rank_as_the_cause(monkeypatch):
    """A rank whose client fails publishes the cause for the others
    (test/python/distributed/test_client_start.py), meets them at a barrier so every rank
    has read it, leaves the service, and only then (rank 0) stops it: a peer left connected
    to a stopped service is aborted by jaxlib. (jaxlib's service and client are stand-ins.)"""
    from torch_tpu.runtime import distributed

    steps = []

    class Service:
        def shutdown(self):
            steps.append("service stopped")

    class CoordinationClient:
        values: dict = {}

        def connect(self):
            pass

        def key_value_set(self, key, value, allow_overwrite):
            self.values[key] = value

        def key_value_try_get(self, key):
            if key not in self.values:
                raise _jaxlib.JaxRuntimeError(f"NOT_FOUND: {key}")
            return self.values[key]

        def key_value_dir_get(self, prefix):
            return [(k, v) for k, v in self.values.items() if k.startswith(prefix)]

        def wait_at_barrier(self, name, timeout_ms):
            steps.append("barrier")

        def shutdown(self):
            steps.append("left the service")

    def broken(*args):
        raise PlatformError("no TPU PjRT plugin: install libtpu")

    monkeypatch.setattr(distributed, "_port_in_use", lambda address: None)
    monkeypatch.setattr(_jaxlib, "distributed_service", lambda *args: Service())
    monkeypatch.setattr(_jaxlib, "distributed_client", lambda *args: CoordinationClient())
    monkeypatch.setattr(distributed, "make_multiprocess_raw_client", broken)
    # An earlier test in this process may have made the process-wide client: that check is
    # not what this test is about (test_client_start covers it).
    monkeypatch.setattr(distributed, "require_no_client", lambda: None)
    monkeypatch.setenv("XLA_FLAGS", "--xla_dump_hlo_as_text")  # restored after the test
    with pytest.raises(PlatformError, match=r"tpu_dist: rank 0 of 2 could not create its client: no TPU PjRT "
                                            r"plugin: install libtpu\. The other ranks stop with an error naming "
                                            r"this rank"):
        distributed.initialize(0, 2, "127.0.0.1:1", timeout_s=5)
    assert CoordinationClient.values["torch_tpu/start/outcome"] == "0\x1ffailed\x1fno TPU PjRT plugin: install libtpu"
    assert steps == ["barrier", "left the service", "service stopped"] and distributed.current() is None
    # XLA:CPU's collectives were bounded by the job's timeout before the client was made
    # (a rank waiting on a collective its peers never run gets an error, not a hang)
    assert os.environ["XLA_FLAGS"] == "--xla_dump_hlo_as_text --xla_cpu_collective_timeout_seconds=5"
