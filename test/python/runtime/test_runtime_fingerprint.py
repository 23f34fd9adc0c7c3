"""Cache keys: the fingerprint protocol, the MLIR fallback and the options key."""

from __future__ import annotations

import re
import struct

import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st
from rt_helpers import add_module, mlp_module
from torch_tpu.runtime import CacheKey, Client, CompileSpec, fingerprint
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
    assert {"torch_tpu", "toolchain_source", "torch", "jaxlib", "platform", "platform_version", "device_kind", "host_cpu"} <= set(fields)
    assert client.options_key(CompileSpec(), (0,)) == base  # same platform and versions


def test_toolchain_fingerprint_changes_when_a_lowering_changes(tmp_path):
    """A copy of the packages with one lowering edited has another fingerprint (so the
    options key of an upgraded or edited torch_tpu differs, although __version__ did not)."""
    import importlib
    import shutil

    fp = importlib.import_module("torch_tpu.runtime.fingerprint")
    roots = []
    for package in fp.TOOLCHAIN_PACKAGES:
        source = importlib.util.find_spec(package).submodule_search_locations[0]
        copy = tmp_path / package
        shutil.copytree(source, copy, ignore=shutil.ignore_patterns("__pycache__"))
        roots.append(copy)
    assert fp.source_fingerprint(roots) == fp.toolchain_fingerprint()
    lowering = tmp_path / "torch_tpu.compiler" / "lowering" / "elementwise.py"
    lowering.write_text(lowering.read_text() + "\n# a changed lowering\n")
    edited = fp.source_fingerprint(roots)
    assert edited != fp.toolchain_fingerprint()
    # ... and so does the options key of every cache entry (the client's key fields).
    fields = Client.create("cpu")._key_base
    assert fields["toolchain_source"] == fp.toolchain_fingerprint()
    assert fp.options_key({**fields, "toolchain_source": edited}) != fp.options_key(fields)
    (tmp_path / "torch_tpu.compiler" / "lowering" / "new_family.py").write_text("")
    added = fp.source_fingerprint(roots)
    assert added not in (edited, fp.toolchain_fingerprint())
    # Bytecode caches and other files do not count: only the sources shape the compiler.
    (tmp_path / "torch_tpu.compiler" / "__pycache__").mkdir(exist_ok=True)
    (tmp_path / "torch_tpu.compiler" / "__pycache__" / "x.py").write_text("stale")
    (tmp_path / "torch_tpu.compiler" / "notes.txt").write_text("not code")
    assert fp.source_fingerprint(roots) == added


def test_torch_version_is_read_without_importing_torch():
    import importlib
    import subprocess
    import sys

    fp = importlib.import_module("torch_tpu.runtime.fingerprint")
    code = (
        "import sys, importlib; f = importlib.import_module('torch_tpu.runtime.fingerprint'); "
        "print(f.torch_version()); print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    import torch

    assert out == [torch.__version__, "False"]
    assert fp.torch_version() == torch.__version__
