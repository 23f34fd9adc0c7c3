"""The three-tier compile cache: hits per tier, entry validation, rejection and rewrite,
directory safety, single-flight compiles, LRU, configuration from the environment."""

from __future__ import annotations

import logging
import os
import pickle
import stat
import threading

import pytest
import torch
from rt_helpers import scale_module
from torch_tpu.runtime import (
    CacheConfig,
    CacheError,
    CacheKey,
    Client,
    CompileError,
    UnsafeCacheDirError,
    cache_entry,
)
from torch_tpu.runtime.errors import CacheEntryError

KEY = CacheKey(1, 2, 3)


def _client(l2: str | None = None, l3: str | None = None, **kw) -> Client:
    return Client.create("cpu", num_cpu_devices=1, cache_config=CacheConfig(l2_dir=l2, l3_url=l3, **kw))


def _entry_files(path: str) -> list[str]:
    return sorted(os.path.join(path, n) for n in os.listdir(path) if n.endswith(cache_entry.SUFFIX))


def _check(exe, factor: float = 3.0) -> None:
    x = torch.arange(4, dtype=torch.float32)
    assert torch.equal(exe(x)[0], x * factor)


# -- the entry format ---------------------------------------------------------------------


def test_entry_round_trip_and_every_kind_of_damage():
    data = cache_entry.encode(KEY, {"platform_version": "cpu", "x": 1}, b"payload-bytes")
    header, meta, payload = cache_entry.decode(data, KEY, "cpu")
    assert header.key == KEY and meta["x"] == 1 and payload == b"payload-bytes"
    assert data[:8] == b"TTPUEXE\0" and header.total_size == len(data)

    def flip(blob: bytes, at: int) -> bytes:
        return blob[:at] + bytes([blob[at] ^ 0xFF]) + blob[at + 1 :]

    version2 = bytearray(data)
    version2[8:12] = (2).to_bytes(4, "little")
    cases = {
        "truncated: 10 bytes": data[:10],
        "bad magic": b"X" + data[1:],
        "entry format version 2, this torch_tpu reads version 1": bytes(version2),
        "truncated: ": data[:-3],
        "trailing bytes": data + b"\0",
        "payload checksum mismatch": flip(data, len(data) - 1),
        "metadata checksum mismatch": flip(data, cache_entry.HEADER_SIZE + 2),
    }
    for reason, blob in cases.items():
        with pytest.raises(CacheEntryError, match=reason):
            cache_entry.decode(blob, KEY, "cpu")
    with pytest.raises(CacheEntryError, match=r"entry holds key .* expected"):
        cache_entry.decode(data, CacheKey(9, 9, 9), "cpu")
    with pytest.raises(CacheEntryError, match="built for platform version 'cpu', this client runs 'tpu v5'"):
        cache_entry.decode(data, KEY, "tpu v5")
    assert cache_entry.key_from_name(cache_entry.entry_name(KEY)) == KEY
    assert cache_entry.key_from_name("junk.ttpu") is None


# -- hits per tier ------------------------------------------------------------------------


def test_l2_entry_is_written_privately_and_hit_by_a_new_client(cache_dirs):
    l2, _ = cache_dirs
    first = _client(l2)
    exe = first.compile(scale_module(3.0), name="scale")
    assert exe.origin == "compile" and first.cache.stats.l2_writes == 1
    (path,) = _entry_files(l2)
    assert stat.S_IMODE(os.stat(l2).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert os.path.basename(path) == exe.key.hex() + ".ttpu"
    second = _client(l2)
    hit = second.compile(scale_module(3.0), name="scale")
    assert hit.origin == "l2" and second.cache.stats.as_dict()["compiles"] == 0
    _check(hit)


def test_executables_are_serialized_only_for_a_tier_that_stores_them(cache_dirs, monkeypatch):
    # A compile's future (a first call waiting for XLA) resolves after serializing: with
    # no L2 or L3 nothing would read the bytes.
    from torch_tpu.runtime import _jaxlib

    serialized = []
    serialize = _jaxlib.serialize_executable
    monkeypatch.setattr(_jaxlib, "serialize_executable", lambda *a: serialized.append(1) or serialize(*a))
    l1_only = _client()
    _check(l1_only.compile(scale_module(3.0), name="scale"))
    assert serialized == [] and l1_only.cache.stats.l2_writes == 0
    l2, _ = cache_dirs
    stored = _client(l2)
    _check(stored.compile(scale_module(3.0), name="scale"))
    assert serialized == [1] and stored.cache.stats.l2_writes == 1
    assert _client(l2).compile(scale_module(3.0), name="scale").origin == "l2"


@pytest.mark.parametrize("url_form", ["path", "file"])
def test_l3_local_url_hit_is_copied_into_l2(cache_dirs, url_form):
    l2, l3 = cache_dirs
    url = l3 if url_form == "path" else "file://" + l3
    _client(None, url).compile(scale_module(3.0))
    assert len(_entry_files(l3)) == 1
    c = _client(l2, url)
    exe = c.compile(scale_module(3.0))
    assert exe.origin == "l3" and c.cache.stats.l3_hits == 1 and c.cache.stats.l2_writes == 1
    _check(exe)
    assert _client(l2, url).compile(scale_module(3.0)).origin == "l2"


# -- rejection: never loaded, logged once, recompiled, rewritten -----------------------------


def _damage_kinds(good: bytes, key: CacheKey, other_entry: bytes, marker: str):
    flipped = bytearray(good)
    flipped[-10] ^= 0x55
    version = bytearray(good)
    version[8:12] = (7).to_bytes(4, "little")
    _, meta, _ = cache_entry.decode(good, key)

    class Bomb:
        def __reduce__(self):
            return (open, (marker, "w"))

    return {
        "truncated": good[: len(good) // 2],
        "corrupt": bytes(flipped),
        "foreign-version": bytes(version),
        "key-mismatch": other_entry,
        "foreign-platform": cache_entry.encode(key, {**meta, "platform_version": "tpu v9"}, cache_entry.decode(good, key)[2]),
        "pickled-payload": cache_entry.encode(key, meta, pickle.dumps(Bomb())),
        "empty": b"",
    }


def test_bad_entries_are_rejected_recompiled_and_rewritten(cache_dirs, caplog, tmp_path):
    l2, _ = cache_dirs
    exe = _client(l2).compile(scale_module(3.0))
    other = _client(l2).compile(scale_module(5.0))
    path = os.path.join(l2, cache_entry.entry_name(exe.key))
    with open(path, "rb") as f:
        good = f.read()
    with open(os.path.join(l2, cache_entry.entry_name(other.key)), "rb") as f:
        other_entry = f.read()
    # Unpickling the payload would create this file.
    marker = str(tmp_path / "pickle_was_loaded")
    for kind, blob in _damage_kinds(good, exe.key, other_entry, marker).items():
        with open(path, "wb") as f:
            f.write(blob)
        caplog.clear()
        c = _client(l2)
        with caplog.at_level(logging.WARNING, logger="torch_tpu.runtime.cache"):
            got = c.compile(scale_module(3.0))
        assert got.origin == "compile", kind
        assert c.cache.stats.rejected == 1, kind
        _check(got)  # never a wrong result
        warnings = [r.getMessage() for r in caplog.records if "rejected entry" in r.getMessage()]
        assert len(warnings) == 1, (kind, warnings)
        with open(path, "rb") as f:
            cache_entry.decode(f.read(), exe.key, c.platform_version)  # rewritten, valid
    assert not os.path.exists(marker)  # cache data is never unpickled


def test_a_rejection_is_logged_once_per_entry_and_reason(cache_dirs, caplog):
    l2, _ = cache_dirs
    c = _client(l2, l1_entries=0)  # no L1: every compile goes to L2
    exe = c.compile(scale_module(3.0))
    path = os.path.join(l2, cache_entry.entry_name(exe.key))
    with caplog.at_level(logging.WARNING, logger="torch_tpu.runtime.cache"):
        for _ in range(3):
            with open(path, "r+b") as f:
                f.truncate(20)
            _check(c.compile(scale_module(3.0)))
    assert c.cache.stats.rejected == 3
    assert sum("rejected entry" in r.getMessage() for r in caplog.records) == 1


def test_unreadable_and_unwritable_tiers_never_fail_a_compile(cache_dirs, caplog, monkeypatch):
    l2, l3 = cache_dirs
    c = _client(l2, l3)

    def disk_full(name, data):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(c.cache.l3, "put", disk_full)
    with caplog.at_level(logging.WARNING, logger="torch_tpu.runtime.cache"):
        exe = c.compile(scale_module(3.0))
    _check(exe)
    assert c.cache.stats.io_errors == 1 and c.cache.stats.l2_writes == 1
    assert any("No space left on device" in r.getMessage() for r in caplog.records)


# -- directory safety -------------------------------------------------------------------------


def test_directory_other_users_can_write_is_refused(cache_dirs):
    l2, _ = cache_dirs
    os.makedirs(l2)
    os.chmod(l2, 0o777)
    c = _client(l2)
    with pytest.raises(UnsafeCacheDirError, match=r"other users can write it \(mode 0777\).*chmod 700"):
        c.compile(scale_module(3.0))
    os.chmod(l2, 0o700)
    _check(c.compile(scale_module(3.0)))


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a directory to another user")
def test_directory_of_another_user_is_refused(cache_dirs):
    _, l3 = cache_dirs
    os.makedirs(l3, mode=0o700)
    os.chown(l3, 65534, 65534)
    with pytest.raises(UnsafeCacheDirError, match="belongs to uid 65534, not to you"):
        _client(None, l3).compile(scale_module(3.0))


def test_entry_files_others_can_write_or_symlinks_are_not_loaded(cache_dirs, tmp_path):
    l2, _ = cache_dirs
    exe = _client(l2).compile(scale_module(3.0))
    path = os.path.join(l2, cache_entry.entry_name(exe.key))
    os.chmod(path, 0o666)
    c = _client(l2)
    assert c.compile(scale_module(3.0)).origin == "compile" and c.cache.stats.rejected == 1
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600  # rewritten privately
    target = tmp_path / "elsewhere.ttpu"
    os.replace(path, target)
    os.symlink(target, path)
    c = _client(l2)
    assert c.compile(scale_module(3.0)).origin == "compile" and c.cache.stats.rejected == 1
    assert not os.path.islink(path)


# -- concurrency within a process, L1, failures ---------------------------------------------------


def test_concurrent_requests_for_one_key_compile_once():
    c = _client()
    barrier = threading.Barrier(6)
    results = []

    def request():
        barrier.wait()
        results.append(c.compile(scale_module(7.0)))

    threads = [threading.Thread(target=request) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert c.cache.stats.compiles == 1
    assert len(results) == 6 and all(r is results[0] for r in results)
    futures = [c.compile_async(scale_module(9.0)) for _ in range(3)]
    assert len({id(f.result()) for f in futures}) == 1
    assert c.cache.stats.compiles == 2 and c.cache.stats.shared_waits >= 2


def test_l1_is_lru_bounded():
    c = _client(l1_entries=2)
    for f in (1.0, 2.0, 3.0):
        c.compile(scale_module(f))
    assert c.cache.l1_size() == 2
    c.compile(scale_module(3.0))
    assert c.cache.stats.compiles == 3
    c.compile(scale_module(1.0))  # evicted: compiled again
    assert c.cache.stats.compiles == 4


def test_failed_compiles_reach_every_waiter_and_are_not_cached(cache_dirs):
    l2, _ = cache_dirs
    c = _client(l2)
    bad = "module { func.func @main( }"
    futures = [c.compile_async(bad, name="bad.mlir") for _ in range(2)]
    for f in futures:
        with pytest.raises(CompileError, match="bad.mlir:1:"):
            f.result()
    assert _entry_files(l2) == []
    with pytest.raises(CompileError):
        c.compile(bad, name="bad.mlir")
    assert c.cache.stats.compiles == 0


# -- configuration ----------------------------------------------------------------------------


def test_config_from_env(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert CacheConfig.from_env() == CacheConfig()  # single process: L1 only
    monkeypatch.setenv("WORLD_SIZE", "8")
    cfg = CacheConfig.from_env()
    assert cfg.l2_dir == os.path.join(str(tmp_path), "torch_tpu", "executables") and cfg.l3_url is None
    monkeypatch.setenv("TORCH_TPU_CACHE_L2", "0")
    assert CacheConfig.from_env().l2_dir is None
    monkeypatch.delenv("WORLD_SIZE")
    monkeypatch.setenv("TORCH_TPU_CACHE_L2", "1")
    monkeypatch.setenv("TORCH_TPU_CACHE_DIR", str(tmp_path / "mine"))
    monkeypatch.setenv("TORCH_TPU_CACHE_URL", "gs://bucket/cache")
    monkeypatch.setenv("TORCH_TPU_CACHE_L1_ENTRIES", "0")
    monkeypatch.setenv("TORCH_TPU_COMPILE_THREADS", "2")
    cfg = CacheConfig.from_env()
    assert (cfg.l2_dir, cfg.l3_url, cfg.l1_entries, cfg.compile_threads) == (str(tmp_path / "mine"), "gs://bucket/cache", 0, 2)
    monkeypatch.setenv("TORCH_TPU_CACHE_L2", "maybe")
    with pytest.raises(CacheError, match="TORCH_TPU_CACHE_L2='maybe': expected 1 or 0"):
        CacheConfig.from_env()


def test_cache_dir_alone_turns_l2_on(monkeypatch, tmp_path):
    """TORCH_TPU_CACHE_DIR in a single process did nothing (L2 stayed off, silently): naming
    the directory turns the tier on, and a second process loads what the first compiled."""
    import subprocess
    import sys

    for name in ("TORCH_TPU_CACHE_L2", "WORLD_SIZE", "TORCH_TPU_CACHE_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TORCH_TPU_CACHE_DIR", str(tmp_path / "mine"))
    assert CacheConfig.from_env().l2_dir == str(tmp_path / "mine")
    monkeypatch.setenv("TORCH_TPU_CACHE_L2", "0")  # an explicit no still wins
    assert CacheConfig.from_env().l2_dir is None
    monkeypatch.delenv("TORCH_TPU_CACHE_L2")
    code = (
        "from torch_tpu.runtime import get_client\n"
        "c = get_client()\n"
        "c.compile('func.func @main(%a: tensor<3xf32>) -> tensor<3xf32> {\\n"
        "  %0 = stablehlo.add %a, %a : tensor<3xf32>\\n  return %0 : tensor<3xf32>\\n}', name='twice')\n"
        "s = c.cache.stats\n"
        "print(s.compiles, s.l2_hits, s.l2_writes)\n"
    )
    runs = [subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300) for _ in range(2)]
    for run in runs:
        assert run.returncode == 0, run.stderr[-2000:]
    assert runs[0].stdout.split() == ["1", "0", "1"]  # compiled, written to the directory
    assert runs[1].stdout.split() == ["0", "1", "0"]  # a new process: loaded from it


def test_missing_fsspec_protocol_is_a_clear_error():
    with pytest.raises(CacheError, match="cannot open compile cache URL nosuchproto://x"):
        _client(None, "nosuchproto://x").compile(scale_module(3.0))
