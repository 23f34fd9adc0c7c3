"""L3 over a real remote protocol: an S3-compatible server (moto) on 127.0.0.1, reached
through fsspec/s3fs, exactly as a gs:// or s3:// cache would be."""

from __future__ import annotations

import os

import pytest
import torch
from rt_helpers import run_python, scale_module
from torch_tpu.runtime import CacheConfig, Client, cache_entry

moto_server = pytest.importorskip("moto.server", reason="moto[server] is not installed")
s3fs = pytest.importorskip("s3fs", reason="s3fs is not installed")

CREDS = {"key": "testing", "secret": "testing"}


@pytest.fixture(scope="module")
def s3_endpoint():
    saved = {k: os.environ.get(k) for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION")}
    os.environ.update(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing", AWS_DEFAULT_REGION="us-east-1")
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    fs = s3fs.S3FileSystem(endpoint_url=endpoint, **CREDS)
    fs.mkdir("torchtpu-cache")
    try:
        yield endpoint
    finally:
        server.stop()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _client(endpoint: str, l2: str | None = None) -> Client:
    cfg = CacheConfig(l2_dir=l2, l3_url="s3://torchtpu-cache/executables", l3_storage_options={"endpoint_url": endpoint, **CREDS})
    return Client.create("cpu", cache_config=cfg)


def test_l3_on_s3_store_hit_reject_and_rewrite(s3_endpoint, tmp_path):
    fs = s3fs.S3FileSystem(endpoint_url=s3_endpoint, skip_instance_cache=True, **CREDS)
    first = _client(s3_endpoint)
    exe = first.compile(scale_module(3.0), name="scale")
    assert exe.origin == "compile" and first.cache.stats.l3_writes == 1
    path = f"torchtpu-cache/executables/{cache_entry.entry_name(exe.key)}"
    cache_entry.decode(fs.cat_file(path), exe.key, first.platform_version)

    hit = _client(s3_endpoint, str(tmp_path / "l2")).compile(scale_module(3.0), name="scale")
    assert hit.origin == "l3"
    x = torch.arange(4, dtype=torch.float32)
    assert torch.equal(hit(x)[0], x * 3)
    assert os.listdir(tmp_path / "l2") == [cache_entry.entry_name(exe.key)]  # copied into L2

    good = fs.cat_file(path)
    fs.pipe_file(path, good[:-100])  # a truncated object
    c = _client(s3_endpoint)
    again = c.compile(scale_module(3.0), name="scale")
    assert again.origin == "compile" and c.cache.stats.rejected == 1 and c.cache.stats.l3_writes == 1
    assert torch.equal(again(x)[0], x * 3)
    cache_entry.decode(fs.cat_file(path), exe.key, c.platform_version)  # rewritten

    # the command-line tool, configured the way users configure fsspec (environment)
    env = {
        "TORCH_TPU_CACHE_URL": "s3://torchtpu-cache/executables",
        "FSSPEC_S3_ENDPOINT_URL": s3_endpoint,
        "FSSPEC_S3_KEY": "testing",
        "FSSPEC_S3_SECRET": "testing",
    }
    code = "import sys\nfrom torch_tpu.tools.cache import main\nsys.exit(main(sys.argv[1:]))"
    result = run_python(code.replace("sys.argv[1:]", "['verify', '--tier', 'l3']"), env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "verified 1 entries: 1 ok, 0 bad" in result.stdout
    fs.pipe_file(path, b"TTPUEXE\0garbage")
    result = run_python(code.replace("sys.argv[1:]", "['verify', '--tier', 'l3']"), env=env)
    assert result.returncode == 1 and "BAD: truncated" in result.stdout, result.stdout + result.stderr
