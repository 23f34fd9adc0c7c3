"""Cache keys: the fingerprint protocol, the MLIR fallback and the options key."""

from __future__ import annotations

import re
import struct

import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st
from rt_helpers import add_module, mlp_module
from torch_tpu.runtime import CacheKey, CompileSpec, fingerprint
from torch_tpu.runtime.fingerprint import mask_dims


def _unmask(masked: str, dims: list[int]) -> str:
    """Inverse of mask_dims: a lone '#' is the next size, '##' a literal '#'."""
    out, it, i = [], iter(dims), 0
    while i < len(masked):
        if masked.startswith("##", i):
            out.append("#")
            i += 2
        elif masked[i] == "#":
            out.append(str(next(it)))
            i += 1
        else:
            out.append(masked[i])
            i += 1
    return "".join(out)


def test_same_structure_other_sizes_share_the_shapeless_hash():
    s1, d1 = fingerprint(add_module("2x3"))
    s2, d2 = fingerprint(add_module("4x8"))
    s3, _ = fingerprint(add_module("2x3", "i32"))
    assert s1 == s2 and d1 != d2
    assert s3 != s1
    assert fingerprint(mlp_module(3, 16, 4))[0] == fingerprint(mlp_module(3, 32, 8))[0]
    assert fingerprint(mlp_module(3))[0] != fingerprint(mlp_module(4))[0]


def test_masking_keeps_dynamic_sizes_and_values():
    text = "%0 = stablehlo.constant dense<3> : tensor<?x4xi32, #stablehlo.bounds<8, ?>> loc(#loc1)"
    masked, dims = mask_dims(text)
    assert masked == "%0 = stablehlo.constant dense<3> : tensor<?x#xi32, ##stablehlo.bounds<8, ?>> loc(##loc1)"
    assert dims == [4]
    a = fingerprint("x : tensor<?x4xf32>")
    b = fingerprint("x : tensor<4x?xf32>")
    assert a != b


tensor_types = st.builds(
    lambda dims, elem: "tensor<" + "".join(f"{d}x" for d in dims) + elem + ">",
    st.lists(st.one_of(st.integers(0, 10**6).map(str), st.just("?")), max_size=4),
    st.sampled_from(["f32", "i1", "bf16", "complex<f32>"]),
)
fragments = st.lists(st.one_of(tensor_types, st.sampled_from(["#x", "##", "#", " ", "x", "1", "?", "tensor<", "<#1x"])), max_size=12)


@settings(max_examples=300, deadline=None)
@given(fragments)
def test_masking_is_invertible_so_keys_never_collide(parts):
    text = "".join(parts)
    masked, dims = mask_dims(text)
    assert _unmask(masked, dims) == text


def test_protocol_objects_are_hashed_from_their_bytes():
    class Graph:
        def __init__(self, structure: bytes, dims: bytes) -> None:
            self.fp = (structure, dims)

        def cache_fingerprint(self):
            return self.fp

    s, d = fingerprint(Graph(b"add(x, y)", b"2,3"))
    assert s == xxhash.xxh64_intdigest(b"protocol\0add(x, y)") and d == xxhash.xxh64_intdigest(b"2,3")
    assert fingerprint(Graph(b"add(x, y)", b"4,3"))[0] == s
    # a protocol object never shares a key with MLIR text of the same bytes
    assert fingerprint("add(x, y)")[0] != s

    class Bad:
        def cache_fingerprint(self):
            return "text", b""

    with pytest.raises(TypeError, match=r"must return \(bytes, bytes\)"):
        fingerprint(Bad())


def test_text_bytes_and_bytecode_inputs():
    text = add_module()
    assert fingerprint(text) == fingerprint(text.encode())
    bc = b"ML\xefR" + b"\x00" * 10
    s, d = fingerprint(bc)
    assert s == xxhash.xxh64_intdigest(b"mlirbc\0" + bc) and d == xxhash.xxh64_intdigest(b"")
    with pytest.raises(TypeError, match="neither UTF-8"):
        fingerprint(b"\xff\xfe")
    text = add_module("2x3")
    n = text.count("tensor<2x3xf32>")
    assert n == 5
    assert fingerprint(text)[1] == xxhash.xxh64_intdigest(struct.pack(f"<{2 * n}q", *([2, 3] * n)))


def test_cache_key_hex_round_trip():
    key = CacheKey(1, 2**64 - 1, 0xABC)
    assert re.fullmatch(r"[0-9a-f]{16}-[0-9a-f]{16}-[0-9a-f]{16}", key.hex())
    assert CacheKey.from_hex(key.hex()) == key
    with pytest.raises(ValueError):
        CacheKey.from_hex("nothex")


def test_options_key_covers_options_versions_and_devices(cpu4, client):
    base = cpu4.options_key(CompileSpec(), (0,))
    assert base == cpu4.options_key(CompileSpec(), (0,))
    variants = {
        cpu4.options_key(CompileSpec(num_replicas=2), (0, 1)),
        cpu4.options_key(CompileSpec(donate_argnums=(1,)), (0,)),
        cpu4.options_key(CompileSpec(xla_options=(("xla_cpu_enable_fast_math", "false"),)), (0,)),
        cpu4.options_key(CompileSpec(), (1,)),
    }
    assert base not in variants and len(variants) == 4
    fields = cpu4._key_base
    assert {"torch_tpu", "jaxlib", "platform", "platform_version", "device_kind", "host_cpu"} <= set(fields)
    assert client.options_key(CompileSpec(), (0,)) == base  # same platform and versions
