"""Clients: the process-wide singleton, platform choice, devices, missing plugins."""

from __future__ import annotations

import pytest
from rt_helpers import run_python
from torch_tpu.runtime import Client, PlatformError, get_client
from torch_tpu.runtime import client as client_module


def test_get_client_is_a_singleton_per_platform():
    c = get_client("cpu")
    assert get_client("cpu") is c and get_client("CPU") is c
    assert c.platform == "cpu" and c.platform_version
    assert [d.index for d in c.devices] == list(range(len(c.devices)))
    assert all(d.platform == "cpu" and str(d) == f"cpu:{d.index}" for d in c.devices)


def test_default_platform_env_and_cpu_device_count_in_a_fresh_process():
    code = """
        import torch_tpu.runtime as rt
        c = rt.get_client()
        print(c.platform, len(c.devices), rt.get_client() is c, rt.get_client("cpu") is c)
    """
    result = run_python(code, env={"TORCH_TPU_PLATFORM": "cpu", "TORCH_TPU_NUM_CPU_DEVICES": "3"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["cpu", "3", "True", "True"]


def test_discovery_without_plugins_falls_back_to_cpu(monkeypatch):
    monkeypatch.delenv("TPU_LIBRARY_PATH", raising=False)
    monkeypatch.delenv("TORCH_TPU_CUDA_PLUGIN_PATH", raising=False)
    platform, raw = client_module._discover(2)
    assert platform == "cpu" and len(raw.local_devices()) == 2


def test_forced_tpu_without_libtpu_says_what_to_install(monkeypatch):
    monkeypatch.delenv("TPU_LIBRARY_PATH", raising=False)
    with pytest.raises(PlatformError, match=r"no TPU PjRT plugin: install libtpu \(pip install 'libtpu==0\.0\.42\.\*'"):
        Client.create("tpu")


def test_forced_tpu_with_a_wrong_library_path(monkeypatch, tmp_path):
    monkeypatch.setenv("TPU_LIBRARY_PATH", str(tmp_path / "nope.so"))
    with pytest.raises(PlatformError, match=r"TPU_LIBRARY_PATH=.*nope\.so does not exist; point it at libtpu\.so"):
        Client.create("tpu")


def test_forced_cuda_without_plugin_and_a_broken_plugin(monkeypatch, tmp_path):
    monkeypatch.delenv("TORCH_TPU_CUDA_PLUGIN_PATH", raising=False)
    with pytest.raises(PlatformError, match=r"no CUDA PjRT plugin: install it \(pip install 'jax-cuda12-plugin"):
        Client.create("gpu")
    fake = tmp_path / "xla_cuda_plugin.so"
    fake.write_bytes(b"not a shared library")
    monkeypatch.setenv("TORCH_TPU_CUDA_PLUGIN_PATH", str(fake))
    with pytest.raises(PlatformError, match=r"the CUDA plugin at .*xla_cuda_plugin\.so failed to start: .*Check that a CUDA device"):
        Client.create("cuda")


def test_unknown_platform_names():
    with pytest.raises(PlatformError, match="unknown platform 'ipu'"):
        Client.create("ipu")
    result = run_python("import torch_tpu.runtime as rt\nrt.get_client()", env={"TORCH_TPU_PLATFORM": "ipu"})
    assert result.returncode != 0 and "unknown platform 'ipu' (TORCH_TPU_PLATFORM)" in result.stderr


def test_cpu_client_device_count_mismatch_is_explained():
    c = get_client("cpu")
    with pytest.raises(PlatformError, match=r"already exists with \d+ device\(s\); 64 requested"):
        get_client("cpu", num_cpu_devices=64)
    assert get_client("cpu", num_cpu_devices=len(c.devices)) is c
