"""Regression tests for the jaxlib 0.10.2 crash traps that test_opt_fuzz.py found (see
compiler/source.py's docstring): each input once killed or hung torchtpu-opt, and must
now end with exit status 1 and a located error. Each runs in its own process, so a
regression shows up as a failed test, not a dead test run."""

from __future__ import annotations

import subprocess
import sys

import pytest
from torch_tpu.compiler import source

OPT = [sys.executable, "-m", "torch_tpu.tools.opt"]


def opt(data: bytes, *args: str, reader_timeout_s: float | None = None) -> subprocess.CompletedProcess:
    if reader_timeout_s is None:
        command = [*OPT, "-", *args]
    else:  # a short bytecode-reader timeout, for the hang case
        code = (
            "import sys; from torch_tpu.compiler import source; "
            f"source.BYTECODE_READER_TIMEOUT_S = {reader_timeout_s}; "
            "from torch_tpu.tools.opt import main; sys.exit(main(sys.argv[1:]))"
        )
        command = [sys.executable, "-c", code, "-", *args]
    return subprocess.run(command, input=data, capture_output=True, timeout=120)


def assert_located_error(result: subprocess.CompletedProcess, message: str) -> None:
    stderr = result.stderr.decode(errors="replace")
    assert result.returncode == 1, f"exit status {result.returncode}; stderr:\n{stderr}"
    assert f"<stdin>:1:1: error: {message}" in stderr or f"error: {message}" in stderr, stderr
    assert "Traceback" not in stderr and "internal error" not in stderr, stderr


# -- text: escapes that spell invalid UTF-8 abort jaxlib when a string reaches Python --
@pytest.mark.parametrize(
    "text",
    [
        r'"stablehlo.\FF"() : () -> ()',  # the parse error quotes the op name
        r'func.func @g() { call @"\FF"() : () -> () return }',  # undefined symbol error
        'func.func @"\\FF"() { return }\nfunc.func @"\\FF"() { return }',  # redefinition
        r'"torchtpu.lo\FF"() : () -> ()',  # our verifier reads the op name in a walk
    ],
)
def test_invalid_utf8_string_literals_are_rejected_before_parsing(text: str) -> None:
    result = opt(text.encode(), "--torchtpu-verify")
    assert_located_error(result, "string literal is not valid UTF-8 (byte 0xFF")


def test_valid_utf8_escapes_and_comments_are_accepted() -> None:
    text = '// "\\FF" in a comment is not a string\n"test.x"() {s = "caf\\C3\\A9"} : () -> ()\n'
    result = opt(text.encode())
    assert result.returncode == 0, result.stderr.decode()
    assert b"caf\\C3\\A9" in result.stdout


# -- StableHLO's convolution dim_numbers parser allocates by the largest index ----------
@pytest.mark.parametrize(
    "dims",
    [
        "dim_numbers = [b, 0, 1, f]x[0, 0x7FC00000, i, o]->[b, 0, 1, f], window = {stride = [1, 1]}",
        "dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 2147483647, f], window = {stride = [1, 1]}",
    ],
)
def test_absurd_convolution_dimension_numbers(dims: str) -> None:
    text = (
        "func.func @f(%x: tensor<1x8x8x3xf32>, %w: tensor<3x3x3x16xf32>) -> tensor<1x6x6x16xf32> {\n"
        f"  %0 = stablehlo.convolution(%x, %w) {dims} {{batch_group_count = 1 : i64, "
        "feature_group_count = 1 : i64} : (tensor<1x8x8x3xf32>, tensor<3x3x3x16xf32>) -> tensor<1x6x6x16xf32>\n"
        "  return %0 : tensor<1x6x6x16xf32>\n}\n"
    )
    result = opt(text.encode())
    assert result.returncode == 1
    assert b"<stdin>:2:" in result.stderr
    assert b"error: convolution dimension number" in result.stderr and b"is out of range" in result.stderr


# -- ir.Type.parse("") segfaults ----------------------------------------------------------
def test_empty_reference_type_parameter() -> None:
    text = 'func.func @f() {\n  %0 = "test.make"() : () -> !torchtpu.ref<>\n  return\n}\n'
    result = opt(text.encode())
    assert result.returncode == 1
    assert b"<stdin>:2:8: error: torchtpu-verify: 'test.make' op result #0: malformed reference type !torchtpu.ref<>" in result.stderr


# -- bytecode --------------------------------------------------------------------------
@pytest.fixture(scope="module")
def bytecode() -> bytes:
    text = b"""
func.func @first(%a: tensor<2x3xf32>, %b: tensor<3x4xf32>) -> tensor<2x4xf32> {
  %0 = stablehlo.dot_general %a, %b, contracting_dims = [1] x [0] : (tensor<2x3xf32>, tensor<3x4xf32>) -> tensor<2x4xf32>
  return %0 : tensor<2x4xf32>
}
"""
    result = opt(text, "--emit-bytecode")
    assert result.returncode == 0 and result.stdout.startswith(source.BYTECODE_MAGIC)
    return result.stdout


def sections(data: bytes) -> dict[int, tuple[int, int]]:
    """section id -> (offset of its data, length), read with source.py's reader."""
    reader = source._Reader(data)
    reader.bytes(4), reader.varint(), reader.cstring()
    found = {}
    while not reader.empty():
        header, length = reader.byte(), reader.varint()
        if header & 0x80:
            alignment = reader.varint()
            while reader.pos % alignment:
                reader.byte()
        found[header & 0x7F] = (reader.pos, length)
        reader.bytes(length)
    return found


def test_valid_bytecode_passes_the_checks(bytecode: bytes) -> None:
    assert source._check_bytecode(bytecode) is None
    assert source.probe_bytecode_reader(bytecode) is None
    result = opt(bytecode)
    assert result.returncode == 0 and b"func.func @first" in result.stdout


def test_invalid_utf8_producer(bytecode: bytes) -> None:
    corrupt = bytearray(bytecode)
    corrupt[corrupt.index(b"MLIR") + 5] = 0xCF  # the reader's error note quotes it
    assert_located_error(opt(bytes(corrupt)), "invalid MLIR bytecode at byte offset")
    assert b"producer string is not valid UTF-8" in opt(bytes(corrupt)).stderr


def test_invalid_utf8_in_the_string_table(bytecode: bytes) -> None:
    corrupt = bytes(bytecode).replace(b"func\x00", b"fun\xfe\x00", 1)
    result = opt(corrupt)
    assert_located_error(result, "invalid MLIR bytecode at byte offset")
    assert b"string table entry is not valid UTF-8 (b'fun\\xfe')" in result.stderr


def test_dialect_group_overrunning_the_attribute_table(bytecode: bytes) -> None:
    # Without the check this corrupts the heap ("malloc(): corrupted top size").
    offset, _ = sections(bytecode)[3]  # attribute/type offsets
    reader = source._Reader(bytecode[offset:])
    num_attributes = reader.varint()
    reader.varint(), reader.varint()  # number of types, first group's dialect
    count_at = offset + reader.pos
    assert bytecode[count_at] & 1, "test assumes a one-byte entry count"
    corrupt = bytearray(bytecode)
    corrupt[count_at] = ((num_attributes + 40) << 1) | 1
    result = opt(bytes(corrupt))
    assert_located_error(result, "invalid MLIR bytecode at byte offset")
    assert b"dialect group of" in result.stderr and b"overruns" in result.stderr


def test_self_referencing_attribute_makes_the_reader_hang_and_is_reported(bytecode: bytes) -> None:
    # The first attribute entry is a StringAttr (builtin code 2 = varint byte 0x05);
    # recoded as a NameLoc (code 14 = 0x1d), its operands point back into the table
    # and the reader loops forever.
    offset, _ = sections(bytecode)[2]  # attribute/type data
    assert bytecode[offset] == 0x05, "the writer changed: find a new self-referencing entry"
    corrupt = bytearray(bytecode)
    corrupt[offset] = 0x1D
    result = opt(bytes(corrupt), reader_timeout_s=3)
    assert_located_error(result, "invalid MLIR bytecode: MLIR's bytecode reader did not finish within 3 s")
