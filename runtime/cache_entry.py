"""The on-disk format of an L2/L3 compile-cache entry. Never pickle: an entry is a fixed
binary header, UTF-8 JSON metadata and the serialized executable.

    offset  size  field
    0       8     magic  b"TTPUEXE\\0"
    8       4     format version (u32, little-endian)
    12      4     metadata length M (u32)
    16      24    full key: shapeless, dims, options (3 x u64)
    40      8     payload length P (u64)
    48      8     xxh64 of the payload
    56      8     xxh64 of the metadata
    64      M     metadata (JSON): platform, platform_version, versions, signature ...
    64+M    P     payload: PjRT's serialized executable

`decode` checks every field against what the reader expects and raises
`CacheEntryError` with the reason; nothing of a rejected entry is ever loaded.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from typing import Any

import xxhash

from .errors import CacheEntryError
from .fingerprint import CacheKey

MAGIC = b"TTPUEXE\0"
FORMAT_VERSION = 1
_HEADER = struct.Struct("<8sII3QQQQ")
HEADER_SIZE = _HEADER.size  # 64
SUFFIX = ".ttpu"
MAX_METADATA = 1 << 24


@dataclass(frozen=True)
class EntryHeader:
    version: int
    key: CacheKey
    metadata_length: int
    payload_length: int
    payload_checksum: int
    metadata_checksum: int

    @property
    def total_size(self) -> int:
        return HEADER_SIZE + self.metadata_length + self.payload_length


def encode(key: CacheKey, metadata: dict[str, Any], payload: bytes) -> bytes:
    meta = json.dumps(metadata, sort_keys=True, separators=(",", ":")).encode("utf-8")
    header = _HEADER.pack(
        MAGIC,
        FORMAT_VERSION,
        len(meta),
        key.shapeless,
        key.dims,
        key.options,
        len(payload),
        xxhash.xxh64_intdigest(payload),
        xxhash.xxh64_intdigest(meta),
    )
    return header + meta + payload


def decode_header(data: bytes) -> EntryHeader:
    """Parses and checks the fixed header (magic, version, sizes)."""
    if len(data) < HEADER_SIZE:
        raise CacheEntryError(f"truncated: {len(data)} bytes, shorter than the {HEADER_SIZE}-byte header")
    magic, version, meta_len, s, d, o, payload_len, payload_sum, meta_sum = _HEADER.unpack_from(data)
    if magic != MAGIC:
        raise CacheEntryError("not a torch_tpu cache entry (bad magic)")
    if version != FORMAT_VERSION:
        raise CacheEntryError(
            f"entry format version {version}, this torch_tpu reads version {FORMAT_VERSION}"
        )
    if meta_len > MAX_METADATA:
        raise CacheEntryError(f"metadata length {meta_len} is implausible")
    return EntryHeader(version, CacheKey(s, d, o), meta_len, payload_len, payload_sum, meta_sum)


def decode(
    data: bytes,
    expected_key: CacheKey | None = None,
    expected_platform_version: str | None = None,
) -> tuple[EntryHeader, dict[str, Any], bytes]:
    """Validates a whole entry and returns (header, metadata, payload)."""
    header = decode_header(data)
    if expected_key is not None and header.key != expected_key:
        raise CacheEntryError(f"entry holds key {header.key}, expected {expected_key}")
    if len(data) != header.total_size:
        what = "truncated" if len(data) < header.total_size else "trailing bytes"
        raise CacheEntryError(f"{what}: {len(data)} bytes, header says {header.total_size}")
    meta_bytes = data[HEADER_SIZE : HEADER_SIZE + header.metadata_length]
    if xxhash.xxh64_intdigest(meta_bytes) != header.metadata_checksum:
        raise CacheEntryError("metadata checksum mismatch (corrupt entry)")
    payload = data[HEADER_SIZE + header.metadata_length :]
    if xxhash.xxh64_intdigest(payload) != header.payload_checksum:
        raise CacheEntryError("payload checksum mismatch (corrupt entry)")
    try:
        metadata = json.loads(meta_bytes.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as err:
        raise CacheEntryError(f"unreadable metadata: {err}") from None
    if not isinstance(metadata, dict):
        raise CacheEntryError("metadata is not a JSON object")
    if expected_platform_version is not None and metadata.get("platform_version") != expected_platform_version:
        raise CacheEntryError(
            f"built for platform version {metadata.get('platform_version')!r}, this client runs "
            f"{expected_platform_version!r}"
        )
    return header, metadata, payload


def entry_name(key: CacheKey) -> str:
    return key.hex() + SUFFIX


def key_from_name(name: str) -> CacheKey | None:
    base = name.rsplit("/", 1)[-1]
    if not base.endswith(SUFFIX):
        return None
    try:
        return CacheKey.from_hex(base[: -len(SUFFIX)])
    except ValueError:
        return None
