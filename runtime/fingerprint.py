"""Compile-cache keys: `CacheKey(shapeless, dims, options)`, three 64-bit xxhash values.

* `fingerprint(source)` is the one function that turns what is compiled into the first
  two. A source that implements the protocol `cache_fingerprint() -> (bytes, bytes)`
  (the Dynamo backend does, for FX graphs) gives the shapeless structure and the dims
  itself; MLIR text, an `ir.Module`/`ir.Operation` (printed without locations) or MLIR
  bytecode fall back to hashing the module. For text, every dimension size inside a
  `tensor<...>` type is replaced by `#` in the shapeless part and listed, in order, in
  the dims part. The pair determines the text exactly (`#`s of the text itself are
  doubled, dynamic `?` sizes stay as they are), so two different modules never
  share a (shapeless, dims) pair, while one module at different sizes shares its
  shapeless hash.
* `options_key(...)` hashes the compile options with everything that changes the
  produced code or makes a serialized executable unloadable: torch_tpu, jaxlib (and
  libtpu) versions, the PjRT platform, its version, the device kind and assignment, and
  on XLA:CPU the host CPU's feature flags (XLA:CPU compiles for the host it runs on).
  It also covers torch_tpu's own code (`toolchain_fingerprint`: every source file of the
  frontend, compiler and runtime packages) and the installed torch version, so an
  upgraded or edited torch_tpu never loads an executable an older one made, although
  `__version__` did not change.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import re
import struct
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import xxhash

from . import _jaxlib

_TENSOR_DIMS = re.compile(r"tensor<((?:(?:\d+|\?)x)+)")
_DIGITS = re.compile(r"\d+")


@runtime_checkable
class Fingerprintable(Protocol):
    def cache_fingerprint(self) -> tuple[bytes, bytes]:
        """(shapeless structure bytes, dims bytes) of what will be compiled."""


@dataclass(frozen=True, order=True)
class CacheKey:
    shapeless: int
    dims: int
    options: int

    def hex(self) -> str:
        """`ssssssssssssssss-dddddddddddddddd-oooooooooooooooo`: the entry's file name stem."""
        return f"{self.shapeless:016x}-{self.dims:016x}-{self.options:016x}"

    @classmethod
    def from_hex(cls, text: str) -> CacheKey:
        parts = text.split("-")
        if len(parts) != 3 or not all(len(p) == 16 for p in parts):
            raise ValueError(f"not a cache key: {text!r}")
        return cls(*(int(p, 16) for p in parts))

    def __str__(self) -> str:
        return self.hex()


def _h(data: bytes) -> int:
    return xxhash.xxh64_intdigest(data)


def mask_dims(text: str) -> tuple[str, list[int]]:
    """`tensor<4x?x8xf32>` -> `tensor<#x?x#xf32>`, [4, 8] (for every tensor type).

    Every `#` already in the text is doubled first, so a lone `#` always marks a masked
    size and the masked text with the sizes gives back the original exactly."""
    dims: list[int] = []
    append = dims.append

    def replace(match: re.Match[str]) -> str:
        parts = match.group(1).split("x")
        parts.pop()  # the empty piece after the last "x"
        for k, part in enumerate(parts):
            if part != "?":
                append(int(part))
                parts[k] = "#"
        return "tensor<" + "x".join(parts) + "x"

    return _TENSOR_DIMS.sub(replace, text.replace("#", "##")), dims


@functools.lru_cache(maxsize=256)
def _text_fingerprint(text: str) -> tuple[int, int]:
    # Memoized on the text itself (exact, not a hash of it): an L1 hit on a module given
    # as text costs a dict lookup, not a re-scan.
    masked, dims = mask_dims(text)
    return _h(b"mlir\0" + masked.encode("utf-8")), _h(struct.pack(f"<{len(dims)}q", *dims))


def fingerprint(source: Any) -> tuple[int, int]:
    """(shapeless, dims) hashes of a compile source. See the module docstring."""
    method = getattr(source, "cache_fingerprint", None)
    if method is not None:
        shapeless, dims = method()
        if not isinstance(shapeless, (bytes, bytearray)) or not isinstance(dims, (bytes, bytearray)):
            raise TypeError(
                f"{type(source).__name__}.cache_fingerprint() must return (bytes, bytes), got "
                f"({type(shapeless).__name__}, {type(dims).__name__})"
            )
        return _h(b"protocol\0" + bytes(shapeless)), _h(bytes(dims))
    if _jaxlib.is_mlir_object(source):
        source = _jaxlib.mlir_text(source, debug_info=False)
    if isinstance(source, (bytes, bytearray)):
        data = bytes(source)
        if data.startswith(b"ML\xefR"):  # MLIR bytecode: hashed as is
            return _h(b"mlirbc\0" + data), _h(b"")
        try:
            source = data.decode("utf-8")
        except UnicodeDecodeError:
            raise TypeError("module bytes are neither UTF-8 MLIR text nor MLIR bytecode") from None
    if isinstance(source, str):
        return _text_fingerprint(source)
    raise TypeError(
        f"cannot fingerprint a {type(source).__name__}: pass MLIR text, bytecode, an "
        "ir.Module / ir.Operation, or an object with cache_fingerprint() -> (bytes, bytes)"
    )


def options_key(fields: dict[str, Any]) -> int:
    """Hash of a JSON-able dict of compile options and versions (sorted, canonical)."""
    return _h(json.dumps(fields, sort_keys=True, separators=(",", ":")).encode("utf-8"))


_cpu_features: str | None = None


def host_cpu_features() -> str:
    """The host CPU's identity and feature flags (Linux /proc/cpuinfo), or the machine
    type elsewhere. XLA:CPU code is compiled for these."""
    global _cpu_features
    if _cpu_features is None:
        import platform

        parts = [platform.machine()]
        try:
            with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
                seen: set[str] = set()
                for line in f:
                    name, _, value = line.partition(":")
                    name = name.strip()
                    if name in ("flags", "Features", "vendor_id", "model name", "CPU part") and name not in seen:
                        seen.add(name)
                        parts.append(f"{name}={value.strip()}")
        except OSError:
            pass
        _cpu_features = xxhash.xxh64_hexdigest("\n".join(parts).encode())
    return _cpu_features


# The packages whose code shapes what is compiled: the frontend (graph capture, settings),
# the compiler (importer, lowerings, dialect, passes) and the runtime (compile options).
TOOLCHAIN_PACKAGES = ("torch_tpu", "torch_tpu.compiler", "torch_tpu.runtime")


def source_fingerprint(roots: Iterable[str | os.PathLike[str]]) -> str:
    """xxh64 (hex) of every `.py` file under `roots`: each file's path relative to its
    root, then its bytes, in sorted order. A file reached from two roots (a nested
    install) counts once. Reads files, imports nothing."""
    files: dict[str, str] = {}
    for n, root in enumerate(roots):
        root = os.path.realpath(root)
        for folder, subdirs, names in os.walk(root):
            subdirs[:] = sorted(d for d in subdirs if d != "__pycache__")
            for name in names:
                if name.endswith(".py"):
                    path = os.path.join(folder, name)
                    files.setdefault(path, f"{n}:{os.path.relpath(path, root)}")
    digest = xxhash.xxh64()
    for path, label in sorted(files.items(), key=lambda kv: kv[1]):
        with open(path, "rb") as f:
            data = f.read()
        digest.update(f"{label}\0{len(data)}\0".encode())
        digest.update(data)
    return digest.hexdigest()


@functools.cache
def toolchain_fingerprint() -> str:
    """`source_fingerprint` of the installed torch_tpu packages, computed once per process
    (about 100 files, 1.2 MB: ~10 ms measured)."""
    roots: list[str] = []
    for package in TOOLCHAIN_PACKAGES:
        spec = importlib.util.find_spec(package)  # locates the package; runs none of its code
        roots.extend(spec.submodule_search_locations or [] if spec is not None else [])
    return source_fingerprint(roots)


_TORCH_VERSION_LINE = re.compile(r"""^__version__\s*=\s*['"]([^'"]+)['"]""", re.MULTILINE)


@functools.cache
def torch_version() -> str:
    """The installed torch's version (lowerings and decompositions follow torch's ATen)
    without importing torch: `torch.__version__` when torch is loaded, else torch's
    `version.py` (package metadata would cost ~60 ms); "" when torch is absent."""
    loaded = sys.modules.get("torch")
    if loaded is not None and isinstance(getattr(loaded, "__version__", None), str):
        return str(loaded.__version__)
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return ""
    for folder in spec.submodule_search_locations:
        try:
            with open(os.path.join(folder, "version.py"), encoding="utf-8") as f:
                match = _TORCH_VERSION_LINE.search(f.read())
        except OSError:
            continue
        if match:
            return match.group(1)
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("torch")
    except PackageNotFoundError:
        return ""
