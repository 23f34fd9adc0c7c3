"""Where L2 and L3 compile-cache entries live.

* `LocalDirStore`: a directory on this machine (L2, and L3 when its URL is a local path
  or `file://`). Created 0700; a directory or entry file that another user can write,
  or that another user owns, is refused. Writes go to a private temporary file in the
  same directory and are renamed over the entry, so readers see the old entry or the
  new one, never a partial one. `lock()` serializes compiles of one key across the
  processes of a host (flock), so they compile once.
* `FsspecStore`: any fsspec URL (gs://, s3://, ...). One object per entry, written with
  a single put (object stores make a put visible all at once).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import stat
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from .cache_entry import HEADER_SIZE, SUFFIX, decode_header
from .errors import CacheEntryError, CacheError, UnsafeCacheDirError

log = logging.getLogger("torch_tpu.runtime.cache")

_TMP_SUFFIX = ".tmp"


@dataclass(frozen=True)
class StoredEntry:
    name: str
    size: int
    mtime: float


def _check_private_dir(path: str, what: str) -> None:
    st = os.stat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise CacheError(f"{what} {path} is not a directory; point it at a directory")
    uid = os.geteuid()
    if st.st_uid != uid:
        raise UnsafeCacheDirError(
            f"refusing to use {what} {path}: it belongs to uid {st.st_uid}, not to you "
            f"(uid {uid}), and cached executables are native code; use a directory of your own "
            "(set TORCH_TPU_CACHE_DIR / TORCH_TPU_CACHE_URL)"
        )
    if st.st_mode & 0o022:
        raise UnsafeCacheDirError(
            f"refusing to use {what} {path}: other users can write it (mode "
            f"{stat.S_IMODE(st.st_mode):04o}), and cached executables are native code; run "
            f"`chmod 700 {path}` or use another directory"
        )


class LocalDirStore:
    """Entries as files `<key>.ttpu` in one private directory."""

    kind = "local"

    def __init__(self, path: str, what: str = "cache directory") -> None:
        self.path = os.path.abspath(os.path.expanduser(path))
        self.what = what
        self._ready = False

    @property
    def location(self) -> str:
        return self.path

    def ensure(self) -> None:
        """Creates the directory (0700) if needed and checks that it is private."""
        if self._ready:
            return
        try:
            os.makedirs(self.path, mode=0o700, exist_ok=True)
        except OSError as err:
            raise CacheError(
                f"cannot create {self.what} {self.path}: {err.strerror}; set it to a writable path"
            ) from None
        _check_private_dir(self.path, self.what)
        self._ready = True

    def _file(self, name: str) -> str:
        return os.path.join(self.path, name)

    def get(self, name: str) -> bytes | None:
        self.ensure()
        try:
            fd = os.open(self._file(name), os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
        except FileNotFoundError:
            return None
        except OSError as err:
            if err.errno == errno.ELOOP:
                raise CacheEntryError("entry is a symbolic link") from None
            raise
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(f.fileno())
            if st.st_uid != os.geteuid() or st.st_mode & 0o022 or not stat.S_ISREG(st.st_mode):
                raise CacheEntryError(
                    f"entry file is not a private regular file of yours (uid {st.st_uid}, mode "
                    f"{stat.S_IMODE(st.st_mode):04o})"
                )
            return f.read()

    def read_prefix(self, name: str, size: int) -> bytes:
        with open(self._file(name), "rb") as f:
            return f.read(size)

    def put(self, name: str, data: bytes) -> None:
        self.ensure()
        tmp = self._file(f".{name}.{os.getpid()}.{uuid.uuid4().hex[:12]}{_TMP_SUFFIX}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o600)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, self._file(name))
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

    def list(self) -> list[StoredEntry]:
        if not os.path.isdir(self.path):
            return []
        entries = []
        with os.scandir(self.path) as it:
            for de in it:
                if de.name.endswith(SUFFIX) and not de.name.startswith("."):
                    try:
                        st = de.stat(follow_symlinks=False)
                    except FileNotFoundError:
                        continue
                    entries.append(StoredEntry(de.name, st.st_size, st.st_mtime))
        return sorted(entries, key=lambda e: e.name)

    def delete(self, name: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._file(name))

    def clear(self) -> int:
        """Removes every entry, leftover temporary file and lock; returns entries removed."""
        if not os.path.isdir(self.path):
            return 0
        removed = 0
        for de in list(os.scandir(self.path)):
            if de.name.endswith(SUFFIX) and not de.name.startswith("."):
                self.delete(de.name)
                removed += 1
            elif de.name.startswith(".") and de.name.endswith(_TMP_SUFFIX):
                self.delete(de.name)
        locks = os.path.join(self.path, "locks")
        if os.path.isdir(locks):
            for de in list(os.scandir(locks)):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(de.path)
        return removed

    @contextlib.contextmanager
    def lock(self, name: str, timeout: float) -> Iterator[bool]:
        """Holds an exclusive per-key lock shared by the processes of this host. Yields
        False (without the lock) when another holder keeps it past `timeout` seconds."""
        self.ensure()
        locks = os.path.join(self.path, "locks")
        os.makedirs(locks, mode=0o700, exist_ok=True)
        fd = os.open(os.path.join(locks, name + ".lock"), os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o600)
        try:
            deadline = time.monotonic() + timeout
            delay = 0.005
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    acquired = True
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        acquired = False
                        break
                    time.sleep(delay)
                    delay = min(delay * 2, 0.1)
            try:
                yield acquired
            finally:
                if acquired:
                    fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)


class FsspecStore:
    """Entries as objects `<url>/<key>.ttpu` on an fsspec filesystem."""

    kind = "fsspec"

    def __init__(self, url: str, storage_options: Mapping[str, Any] | None = None) -> None:
        try:
            import fsspec
        except ImportError:
            raise CacheError(
                f"TORCH_TPU_CACHE_URL={url} needs fsspec (and the filesystem's package, e.g. "
                "gcsfs or s3fs): pip install 'torch_tpu[cache]'"
            ) from None
        try:
            self.fs, root = fsspec.core.url_to_fs(url, **dict(storage_options or {}))
        except (ImportError, ValueError) as err:
            raise CacheError(f"cannot open compile cache URL {url}: {err}") from None
        self.url = url
        self.root = root.rstrip("/")
        self._ready = False

    @property
    def location(self) -> str:
        return self.url

    def _path(self, name: str) -> str:
        return f"{self.root}/{name}"

    def ensure(self) -> None:
        if not self._ready:
            with contextlib.suppress(Exception):
                self.fs.makedirs(self.root, exist_ok=True)
            self._ready = True

    def get(self, name: str) -> bytes | None:
        self.ensure()
        try:
            return self.fs.cat_file(self._path(name))
        except FileNotFoundError:
            return None

    def read_prefix(self, name: str, size: int) -> bytes:
        return self.fs.cat_file(self._path(name), start=0, end=size)

    def put(self, name: str, data: bytes) -> None:
        self.ensure()
        self.fs.pipe_file(self._path(name), data)

    def list(self) -> list[StoredEntry]:
        with contextlib.suppress(Exception):
            self.fs.invalidate_cache(self.root)
        try:
            infos = self.fs.ls(self.root, detail=True)
        except FileNotFoundError:
            return []
        entries = []
        for info in infos:
            name = info["name"].rstrip("/").rsplit("/", 1)[-1]
            if name.endswith(SUFFIX) and info.get("type") != "directory":
                mtime = info.get("mtime") or info.get("LastModified") or info.get("updated") or 0
                if hasattr(mtime, "timestamp"):
                    mtime = mtime.timestamp()
                entries.append(StoredEntry(name, int(info.get("size") or 0), float(mtime or 0)))
        return sorted(entries, key=lambda e: e.name)

    def delete(self, name: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.fs.rm_file(self._path(name))

    def clear(self) -> int:
        entries = self.list()
        for entry in entries:
            self.delete(entry.name)
        return len(entries)

    @contextlib.contextmanager
    def lock(self, name: str, timeout: float) -> Iterator[bool]:
        yield False  # object stores have no locks; concurrent puts of one key are identical


def open_store(url: str, storage_options: Mapping[str, Any] | None = None) -> LocalDirStore | FsspecStore:
    """L3 store for a URL: local paths and file:// get the private-directory store."""
    if "://" not in url:
        return LocalDirStore(url, "compile cache directory (TORCH_TPU_CACHE_URL)")
    if url.startswith("file://"):
        return LocalDirStore(url[len("file://") :], "compile cache directory (TORCH_TPU_CACHE_URL)")
    store = FsspecStore(url, storage_options)
    protocols = store.fs.protocol if isinstance(store.fs.protocol, (tuple, list)) else (store.fs.protocol,)
    if "file" in protocols or "local" in protocols:
        return LocalDirStore(store.root, "compile cache directory (TORCH_TPU_CACHE_URL)")
    return store


def read_header(store: LocalDirStore | FsspecStore, name: str) -> tuple[Any, dict[str, Any] | None]:
    """(EntryHeader, metadata or None) of a stored entry, reading only its beginning."""
    import json

    head = store.read_prefix(name, HEADER_SIZE)
    header = decode_header(head)
    meta = None
    with contextlib.suppress(Exception):
        raw = store.read_prefix(name, HEADER_SIZE + header.metadata_length)[HEADER_SIZE:]
        meta = json.loads(raw.decode("utf-8"))
    return header, meta
