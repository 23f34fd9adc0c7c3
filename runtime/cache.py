"""The three-tier compile cache.

    L1  in-process: CacheKey -> loaded Executable (LRU, TORCH_TPU_CACHE_L1_ENTRIES)
    L2  machine-local directory shared by the processes of a host (TORCH_TPU_CACHE_L2,
        TORCH_TPU_CACHE_DIR); on by default when WORLD_SIZE > 1 or TORCH_TPU_CACHE_DIR is set
    L3  persistent, any fsspec URL (TORCH_TPU_CACHE_URL); off by default

A request looks in L1, then (on a compile thread) L2, then L3, then compiles. Compiles
and loads run on a thread pool; concurrent requests for one key share one future, so a
key compiles once per process, and the L2 lock makes it compile once per host. An L3
hit is copied into L2; a compile is written to L2 and L3.

A corrupt, truncated, foreign-version, other-key or other-platform entry is rejected
(logged once), never loaded; the key is recompiled and the entry rewritten. A failure to
read or write L2/L3 (full disk, network) is logged once and never fails a compile, but
an unsafe cache directory is an error (`UnsafeCacheDirError`).
"""

from __future__ import annotations

import collections
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from torch_tpu.core import config

from . import cache_entry
from .cache_store import FsspecStore, LocalDirStore, open_store
from .errors import CacheEntryError, CacheError
from .fingerprint import CacheKey

log = logging.getLogger("torch_tpu.runtime.cache")

T = TypeVar("T")


def default_cache_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "torch_tpu", "executables")


def _world_size() -> int:
    try:
        return config.get("WORLD_SIZE")
    except config.EnvVarError:
        return 1  # a launcher's variable we only peek at: a bad value is not ours to refuse


@dataclass(frozen=True)
class CacheConfig:
    """Where the compile cache keeps executables. `from_env()` reads the TORCH_TPU_*
    variables (see docs/howto/cache.md)."""

    l1_entries: int = 1024
    l2_dir: str | None = None  # None: L2 off
    l3_url: str | None = None  # None: L3 off
    l3_storage_options: Mapping[str, Any] = field(default_factory=dict, hash=False, compare=False)
    lock_timeout: float = 600.0
    compile_threads: int = 0  # 0: min(4, CPUs)

    @classmethod
    def from_env(cls) -> CacheConfig:
        try:
            l2 = config.get("TORCH_TPU_CACHE_L2")  # None: unset
            if l2 is None:
                # Naming a directory asks for the tier: TORCH_TPU_CACHE_DIR alone used to
                # do nothing in a single process, silently.
                l2 = _world_size() > 1 or config.get("TORCH_TPU_CACHE_DIR") is not None
            return cls(
                l1_entries=max(0, config.get("TORCH_TPU_CACHE_L1_ENTRIES")),
                l2_dir=(config.get("TORCH_TPU_CACHE_DIR") or default_cache_dir()) if l2 else None,
                l3_url=config.get("TORCH_TPU_CACHE_URL"),
                lock_timeout=config.get("TORCH_TPU_CACHE_LOCK_TIMEOUT"),
                compile_threads=max(0, config.get("TORCH_TPU_COMPILE_THREADS")),
            )
        except config.EnvVarError as err:
            raise CacheError(str(err)) from None


@dataclass
class CacheStats:
    l1_hits: int = 0
    l2_hits: int = 0
    l3_hits: int = 0
    compiles: int = 0
    shared_waits: int = 0  # requests that waited for an identical in-flight request
    rejected: int = 0
    l2_writes: int = 0
    l3_writes: int = 0
    io_errors: int = 0

    def as_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


class Loaded(Generic[T]):
    """What a cache lookup produced and where it came from."""

    __slots__ = ("origin", "value")

    def __init__(self, value: T, origin: str) -> None:
        self.value = value
        self.origin = origin  # "l1", "l2", "l3" or "compile"


class CompileCache(Generic[T]):
    """One cache per client. `value` objects are loaded executables (opaque here)."""

    def __init__(self, cfg: CacheConfig | None = None) -> None:
        self.config = cfg or CacheConfig.from_env()
        self.stats = CacheStats()
        self._lock = threading.Lock()
        self._l1: collections.OrderedDict[CacheKey, Loaded[T]] = collections.OrderedDict()
        self._inflight: dict[CacheKey, Future[Loaded[T]]] = {}
        self._pool: ThreadPoolExecutor | None = None
        self._logged: set[tuple[str, str]] = set()
        self.l2: LocalDirStore | None = (
            LocalDirStore(self.config.l2_dir, "compile cache directory (TORCH_TPU_CACHE_DIR)")
            if self.config.l2_dir
            else None
        )
        self.l3: LocalDirStore | FsspecStore | None = (
            open_store(self.config.l3_url, self.config.l3_storage_options) if self.config.l3_url else None
        )

    # -- public ---------------------------------------------------------------------------

    def get_or_compile(
        self,
        key: CacheKey,
        compile_fn: Callable[[], tuple[T, bytes | None, dict[str, Any]]],
        load_fn: Callable[[bytes, dict[str, Any]], T],
        platform_version: str,
    ) -> Future[Loaded[T]]:
        """A future of the loaded value for `key`.

        compile_fn() -> (value, serialized payload or None, metadata) compiles;
        load_fn(payload, metadata) -> value loads a validated cache entry."""
        for store in (self.l2, self.l3):
            if isinstance(store, LocalDirStore):
                store.ensure()  # an unsafe directory is the caller's error, raised here
        with self._lock:
            hit = self._l1.get(key)
            if hit is not None:
                self._l1.move_to_end(key)
                self.stats.l1_hits += 1
                done: Future[Loaded[T]] = Future()
                done.set_result(Loaded(hit.value, "l1"))
                return done
            future = self._inflight.get(key)
            if future is not None:
                self.stats.shared_waits += 1
                return future
            future = Future()
            self._inflight[key] = future
            pool = self._get_pool()
        pool.submit(self._resolve, key, future, compile_fn, load_fn, platform_version)
        return future

    def l1_get(self, key: CacheKey) -> T | None:
        """The L1 entry of a key (counted as a hit), or None."""
        with self._lock:
            hit = self._l1.get(key)
            if hit is None:
                return None
            self._l1.move_to_end(key)
            self.stats.l1_hits += 1
            return hit.value

    def clear_l1(self) -> None:
        with self._lock:
            self._l1.clear()

    def l1_size(self) -> int:
        return len(self._l1)

    def shutdown(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    # -- internals ------------------------------------------------------------------------

    def _get_pool(self) -> ThreadPoolExecutor:
        if self._pool is None:
            n = self.config.compile_threads or min(4, os.cpu_count() or 1)
            self._pool = ThreadPoolExecutor(max_workers=n, thread_name_prefix="torch_tpu-compile")
        return self._pool

    def _count(self, stat: str) -> None:
        with self._lock:
            setattr(self.stats, stat, getattr(self.stats, stat) + 1)

    def _log_once(self, tier: str, name: str, message: str, level: int = logging.WARNING) -> None:
        with self._lock:
            token = (tier, name + ":" + message)
            if token in self._logged:
                return
            self._logged.add(token)
        log.log(level, "compile cache %s: %s: %s", tier, name, message)

    def _resolve(self, key, future, compile_fn, load_fn, platform_version) -> None:
        try:
            loaded = self._lookup_or_compile(key, compile_fn, load_fn, platform_version)
            with self._lock:
                if self.config.l1_entries > 0:
                    self._l1[key] = loaded
                    self._l1.move_to_end(key)
                    while len(self._l1) > self.config.l1_entries:
                        self._l1.popitem(last=False)
                self._inflight.pop(key, None)
            future.set_result(loaded)
        except BaseException as err:  # noqa: BLE001 - delivered to every waiter
            with self._lock:
                self._inflight.pop(key, None)
            future.set_exception(err)

    def _load_from(self, tier: str, store, key, load_fn, platform_version, recheck=False):
        """(loaded value, entry bytes) from one tier, or None (missing, or rejected: then
        logged once)."""
        name = cache_entry.entry_name(key)
        try:
            data = store.get(name)
        except CacheEntryError as err:
            self._reject(tier, name, err.reason, recheck)
            return None
        except Exception as err:  # noqa: BLE001 - an unreadable tier is a miss
            self._count("io_errors")
            self._log_once(tier, name, f"cannot read entry ({type(err).__name__}: {err}); compiling instead")
            return None
        if data is None:
            return None
        try:
            _, metadata, payload = cache_entry.decode(data, key, platform_version)
        except CacheEntryError as err:
            self._reject(tier, name, err.reason, recheck)
            return None
        try:
            value = load_fn(payload, metadata)
        except Exception as err:  # noqa: BLE001 - a payload PjRT cannot load is rejected
            self._reject(tier, name, f"PjRT could not load the executable ({err})", recheck)
            return None
        return value, data

    def _reject(self, tier: str, name: str, reason: str, recheck: bool = False) -> None:
        if not recheck:  # the second look under the lock is the same rejection
            self._count("rejected")
        self._log_once(tier, name, f"rejected entry ({reason}); recompiling and rewriting it")

    def _store(self, tier: str, store, key, data: bytes) -> None:
        name = cache_entry.entry_name(key)
        try:
            store.put(name, data)
        except Exception as err:  # noqa: BLE001 - a full disk never fails a compile
            self._count("io_errors")
            self._log_once(tier, name, f"cannot write entry ({type(err).__name__}: {err})")
            return
        if tier == "L2":
            self._count("l2_writes")
        else:
            self._count("l3_writes")

    def _lookup_or_compile(self, key, compile_fn, load_fn, platform_version) -> Loaded:
        if self.l2 is not None:
            found = self._load_from("L2", self.l2, key, load_fn, platform_version)
            if found is not None:
                self._count("l2_hits")
                return Loaded(found[0], "l2")
        if self.l3 is not None:
            found = self._load_from("L3", self.l3, key, load_fn, platform_version)
            if found is not None:
                self._count("l3_hits")
                if self.l2 is not None:
                    self._store("L2", self.l2, key, found[1])
                return Loaded(found[0], "l3")
        if self.l2 is None:
            return self._compile_and_store(key, compile_fn)
        with self.l2.lock(cache_entry.entry_name(key), self.config.lock_timeout) as acquired:
            if not acquired:
                self._log_once(
                    "L2", key.hex(),
                    f"another process held the compile lock for over {self.config.lock_timeout:.0f} s "
                    "(TORCH_TPU_CACHE_LOCK_TIMEOUT); compiling without it", logging.INFO,
                )
            else:
                # Another process of this host may have compiled it while we waited.
                found = self._load_from("L2", self.l2, key, load_fn, platform_version, recheck=True)
                if found is not None:
                    self._count("l2_hits")
                    return Loaded(found[0], "l2")
            return self._compile_and_store(key, compile_fn)

    def _compile_and_store(self, key: CacheKey, compile_fn) -> Loaded:
        start = time.perf_counter()
        value, payload, metadata = compile_fn()
        self._count("compiles")
        metadata = dict(metadata)
        metadata.setdefault("compile_seconds", round(time.perf_counter() - start, 6))
        metadata.setdefault("created", time.time())
        if payload is not None and (self.l2 is not None or self.l3 is not None):
            data = cache_entry.encode(key, metadata, payload)
            if self.l2 is not None:
                self._store("L2", self.l2, key, data)
            if self.l3 is not None:
                self._store("L3", self.l3, key, data)
        return Loaded(value, "compile")
