"""A small reader and writer of the safetensors format, for the weights of a saved export.

The format (https://huggingface.co/docs/safetensors, "Format"), followed exactly:

    8 bytes      N, an unsigned little-endian 64-bit integer: the header's size
    N bytes      a UTF-8 JSON object {name: {"dtype": "F32", "shape": [2, 3],
                 "data_offsets": [BEGIN, END]}, ..., "__metadata__": {str: str}}
                 (may end with spaces, which writers use to align the data to 8 bytes)
    rest         the byte buffer: each tensor's elements, row-major, little-endian,
                 at [BEGIN, END) relative to the buffer's start

A valid file's tensors cover the buffer exactly, without holes or overlaps, and each
takes `prod(shape) * itemsize` bytes. We write only that and read nothing else: the
reader never executes code (no pickle) and rejects a corrupt or truncated file with an
error naming the file and what is wrong. Why not the `safetensors` package: it would be a
new dependency for ~150 lines, and torch alone moves the bytes.
"""

from __future__ import annotations

import json
import math
import os
import struct
import sys
from collections.abc import Mapping

import torch

from ..core import dtypes as core_dtypes

# The format's dtype names (the Dtype enum of the reference implementation) for every
# dtype a torch_tpu export can hold. torch.complex128 and the *fnuz float8 types have no
# name in the format, so they cannot be saved (an error says so).
DTYPE_NAMES: dict[torch.dtype, str] = {
    getattr(torch, row.name): row.safetensors
    for row in core_dtypes.ROWS
    if row.safetensors is not None and hasattr(torch, row.name)
}
DTYPES: dict[str, torch.dtype] = {name: dtype for dtype, name in DTYPE_NAMES.items()}

# The reference implementation refuses headers above 100 MB (a DoS guard); so do we.
MAX_HEADER_BYTES = 100_000_000
_METADATA = "__metadata__"


class SafetensorsError(ValueError):
    """A file that is not valid safetensors, or a tensor that cannot be written as one."""


def _require_little_endian() -> None:
    # The format is little-endian; tensors are copied as host bytes, so a big-endian host
    # would need byte swaps per element (and per component for complex) that are not written.
    if sys.byteorder != "little":
        raise SafetensorsError("safetensors: big-endian hosts are not supported")


def save_file(tensors: Mapping[str, torch.Tensor], path: str | os.PathLike, metadata: Mapping[str, str] | None = None) -> None:
    """Writes `tensors` (name -> tensor, any device/layout: saved as contiguous CPU data)."""
    _require_little_endian()
    header: dict[str, object] = {}
    if metadata:
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
            raise SafetensorsError(f"{path}: __metadata__ must map strings to strings")
        header[_METADATA] = dict(metadata)
    chunks: list[bytes] = []
    offset = 0
    for name, tensor in tensors.items():
        if name == _METADATA:
            raise SafetensorsError(f"{path}: '{_METADATA}' is reserved and cannot name a tensor")
        dtype_name = DTYPE_NAMES.get(tensor.dtype)
        if dtype_name is None:
            raise SafetensorsError(
                f"{path}: tensor '{name}' has dtype {tensor.dtype}, which safetensors cannot hold "
                f"(supported: {', '.join(str(d) for d in DTYPE_NAMES)})"
            )
        data = _tensor_bytes(tensor)
        header[name] = {"dtype": dtype_name, "shape": list(tensor.shape), "data_offsets": [offset, offset + len(data)]}
        chunks.append(data)
        offset += len(data)
    encoded = json.dumps(header, separators=(",", ":")).encode("utf-8")
    encoded += b" " * (-len(encoded) % 8)  # the data starts 8-byte aligned
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(encoded)))
        f.write(encoded)
        for chunk in chunks:
            f.write(chunk)


def load_file(path: str | os.PathLike) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """The tensors (in file order) and the `__metadata__` of a safetensors file."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as err:
        raise SafetensorsError(f"{path}: cannot read the weights: {err.strerror or err}") from None
    return load_bytes(data, str(path))


def load_bytes(data: bytes, name: str = "<bytes>") -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    _require_little_endian()

    def bad(message: str) -> SafetensorsError:
        return SafetensorsError(f"{name}: not a valid safetensors file: {message}")

    if len(data) < 8:
        raise bad(f"{len(data)} bytes, shorter than the 8-byte header length (truncated?)")
    (header_len,) = struct.unpack("<Q", data[:8])
    if header_len > MAX_HEADER_BYTES:
        raise bad(f"header length {header_len} exceeds the format's limit of {MAX_HEADER_BYTES} bytes")
    if 8 + header_len > len(data):
        raise bad(f"header length {header_len} runs past the end of the file ({len(data)} bytes; truncated?)")
    raw = data[8 : 8 + header_len]
    if not raw.startswith(b"{"):
        raise bad("the header does not start with '{'")
    try:
        header = json.loads(raw.decode("utf-8"), object_pairs_hook=_no_duplicate_keys)
    except (UnicodeDecodeError, ValueError) as err:
        raise bad(f"the header is not UTF-8 JSON ({err})") from None
    if not isinstance(header, dict):
        raise bad("the header is not a JSON object")
    metadata = header.pop(_METADATA, None) or {}
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise bad("__metadata__ must map strings to strings")
    buffer = memoryview(data)[8 + header_len :]
    entries = []
    for key, entry in header.items():
        entries.append((key, *_check_entry(key, entry, bad)))
    # Tensors must cover the byte buffer exactly: sorted by offset, no holes, no overlaps.
    position = 0
    for key, _, _, (begin, end) in sorted(entries, key=lambda e: (e[3][0], e[3][1])):
        if begin != position:
            raise bad(f"tensor '{key}' starts at byte {begin}, expected {position} (a hole or an overlap)")
        position = end
    if position != len(buffer):
        raise bad(f"the tensors cover {position} bytes of a {len(buffer)}-byte data buffer (truncated or padded?)")
    tensors = {key: _tensor_from(buffer[begin:end], dtype, shape) for key, dtype, shape, (begin, end) in entries}
    return tensors, dict(metadata)


def _check_entry(key: str, entry: object, bad) -> tuple[torch.dtype, list[int], tuple[int, int]]:
    if not isinstance(entry, dict) or set(entry) != {"dtype", "shape", "data_offsets"}:
        raise bad(f"tensor '{key}' must be an object with exactly dtype, shape and data_offsets")
    dtype = DTYPES.get(entry["dtype"]) if isinstance(entry["dtype"], str) else None
    if dtype is None:
        raise bad(f"tensor '{key}' has unknown dtype {entry['dtype']!r} (known: {', '.join(DTYPES)})")
    shape, offsets = entry["shape"], entry["data_offsets"]
    if not isinstance(shape, list) or not all(_is_count(d) for d in shape):
        raise bad(f"tensor '{key}' has an invalid shape {shape!r} (a list of non-negative integers)")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(_is_count(o) for o in offsets) and offsets[0] <= offsets[1]):
        raise bad(f"tensor '{key}' has invalid data_offsets {offsets!r} (a list [BEGIN, END], BEGIN <= END)")
    expected = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    if offsets[1] - offsets[0] != expected:
        raise bad(
            f"tensor '{key}' ({entry['dtype']}, shape {shape}) needs {expected} bytes, its data_offsets "
            f"{offsets} give {offsets[1] - offsets[0]}"
        )
    return dtype, shape, (offsets[0], offsets[1])


def _is_count(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def _no_duplicate_keys(pairs: list[tuple[str, object]]) -> dict[str, object]:
    out: dict[str, object] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {key!r}")
        out[key] = value
    return out


def _tensor_bytes(tensor: torch.Tensor) -> bytes:
    flat = tensor.detach().to("cpu").contiguous().reshape(-1)
    if flat.numel() == 0:
        return b""
    return flat.view(torch.uint8).numpy().tobytes()


def _tensor_from(view: memoryview, dtype: torch.dtype, shape: list[int]) -> torch.Tensor:
    if len(view) == 0:
        return torch.empty(shape, dtype=dtype)
    # A copy: the tensor must own its memory (and be writable), not alias the file's bytes.
    return torch.frombuffer(bytearray(view), dtype=torch.uint8).view(dtype).reshape(shape)


__all__ = ["DTYPES", "DTYPE_NAMES", "SafetensorsError", "load_bytes", "load_file", "save_file"]
