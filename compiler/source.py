r"""Reading `.mlir` text and MLIR bytecode into a module, the way `mlir-opt` does:
an implicit `builtin.module` around top-level ops that are not one module, located
diagnostics instead of exceptions, and no crash on garbage.

Crash traps in jaxlib 0.10.2, found by test/python/test_opt_fuzz.py and guarded here
by checking the input *before* MLIR sees it:

* Strings that are not valid UTF-8 abort the process. jaxlib converts C++ strings to
  Python `str` with nanobind, which throws a C++ exception on invalid UTF-8; thrown
  while building `MLIRError` for a parse error, or inside a callback (`Operation.walk`,
  diagnostic handlers), it reaches `std::terminate` (SIGABRT). Examples:
  `"stablehlo.\FF"() : () -> ()` (the parse error quotes the op name),
  `func.func @g() { call @"\FF"() : () -> () return }`, a torchtpu op named
  `"torchtpu.x\FF"` (our verifier reads op names in a walk), and bytecode whose
  producer string or string table holds such bytes. So every string literal of a text
  input and every string of a bytecode input must be valid UTF-8 (`_check_text_strings`,
  `_check_bytecode`). Binary payloads belong in `dense<"0x...">`/resource blobs, which
  are not strings and are not affected.
* StableHLO's parser of convolution `dim_numbers` (`[b, 0, 1, f]x[0, 1, i, o]->[...]`,
  also inside `#stablehlo.conv<...>`) allocates a table as large as the biggest
  dimension index written: `[0, 0x7FC00000, i, o]` allocates gigabytes (std::bad_alloc
  or the OOM killer). `_check_conv_dimension_numbers` rejects absurd indices first.
* The bytecode reader trusts the counts in the attribute/type offset section: a dialect
  group that declares more entries than the header announced writes past the end of
  the reader's table (heap corruption: "malloc(): corrupted top size").
  `_check_bytecode` walks the section structure (lengths, counts, string table) and
  rejects such files with a located error first.
* A corrupt attribute table whose entries reference each other makes the bytecode
  reader loop forever, holding the GIL. That cannot be found without decoding every
  dialect's encodings, so `probe_bytecode_reader` runs the reader in a forked child
  with a timeout first (`isolate_bytecode_reader=True`, as torchtpu-opt does).
* `ir.Type.parse("")` and `ir.Attribute.parse("")` segfault (guarded where we parse
  type text: `dialect/spec.py`, `ref_tensor_type`).
"""

from __future__ import annotations

import re

from .context import ir
from .diagnostics import DiagnosticEngine, SourceLoc

BYTECODE_MAGIC = b"ML\xefR"
# How long `probe_bytecode_reader` lets MLIR's reader run (plus 1 s per 10 MB).
BYTECODE_READER_TIMEOUT_S = 30.0
_NOT_ONE_TOP_LEVEL_OP = "source must contain a single top-level operation"


def is_bytecode(data: bytes | str) -> bool:
    return isinstance(data, bytes) and data.startswith(BYTECODE_MAGIC)


def parse_source(
    data: str | bytes,
    source_name: str,
    ctx: ir.Context,
    engine: DiagnosticEngine,
    *,
    isolate_bytecode_reader: bool = False,
) -> ir.Operation | None:
    """Parses text or bytecode into a detached, verified `builtin.module` operation.

    Returns None after reporting located errors into `engine` on failure.

    `isolate_bytecode_reader=True` first runs MLIR's bytecode reader on `data` in a
    forked child process (POSIX only) so that a corrupt file that makes the reader hang
    or crash is reported as an error instead (see `probe_bytecode_reader`). Command-line
    tools, which read files of unknown origin, should set it.
    """
    if isinstance(data, bytes):
        if is_bytecode(data):
            return _parse_bytecode(data, source_name, ctx, engine, isolate_bytecode_reader)
        try:
            data = data.decode("utf-8")
        except UnicodeDecodeError as err:
            engine.error(
                SourceLoc(source_name, 1, 1),
                f"input is neither UTF-8 text nor MLIR bytecode (invalid byte at offset "
                f"{err.start}); pass a .mlir text file or a file written with --emit-bytecode",
            )
            return None
    if "\x00" in data:
        # MLIR's lexer treats NUL as end of buffer, which would silently drop the rest.
        line = data.count("\n", 0, data.index("\x00")) + 1
        engine.error(SourceLoc(source_name, line, 1), "input contains a NUL byte; expected MLIR text")
        return None
    if not _check_text_strings(data, source_name, engine):
        return None
    if not _check_conv_dimension_numbers(data, source_name, engine):
        return None
    return _parse_text(data, source_name, ctx, engine)


# --------------------------------------------------------------------------------------
# Text: string literals must decode to valid UTF-8
# --------------------------------------------------------------------------------------
# A `\XX` escape of a byte >= 0x80 is the only way MLIR text can spell invalid UTF-8
# (the text itself was decoded as UTF-8 already).
_HIGH_ESCAPE = re.compile(r"\\[89a-fA-F][0-9a-fA-F]")
_STRING_OR_COMMENT = re.compile(r'//[^\n]*|"((?:[^"\\\n]|\\.)*)"?')
_SIMPLE_ESCAPES = {"n": b"\n", "t": b"\t", "\\": b"\\", '"': b'"'}


def _literal_bytes(body: str) -> bytes:
    out = bytearray()
    i = 0
    while i < len(body):
        ch = body[i]
        if ch == "\\" and i + 1 < len(body):
            nxt = body[i + 1]
            if nxt in _SIMPLE_ESCAPES:
                out += _SIMPLE_ESCAPES[nxt]
                i += 2
                continue
            hex_digits = body[i + 1 : i + 3]
            if len(hex_digits) == 2 and all(c in "0123456789abcdefABCDEF" for c in hex_digits):
                out.append(int(hex_digits, 16))
                i += 3
                continue
        out += ch.encode("utf-8")
        i += 1
    return bytes(out)


def _position(text: str, offset: int) -> tuple[int, int]:
    line = text.count("\n", 0, offset) + 1
    return line, offset - (text.rfind("\n", 0, offset) + 1) + 1


def _check_text_strings(text: str, source_name: str, engine: DiagnosticEngine) -> bool:
    if _HIGH_ESCAPE.search(text) is None:  # the common case: one fast scan
        return True
    for match in _STRING_OR_COMMENT.finditer(text):
        body = match.group(1)
        if body is None or _HIGH_ESCAPE.search(body) is None:
            continue
        try:
            _literal_bytes(body).decode("utf-8")
        except UnicodeDecodeError as err:
            line, col = _position(text, match.start())
            engine.error(
                SourceLoc(source_name, line, col),
                f"string literal is not valid UTF-8 (byte 0x{err.object[err.start]:02X} at "
                f"offset {err.start} of the string); torch_tpu requires UTF-8 names and "
                "strings; put binary data in a dense<\"0x...\"> attribute",
            )
            return False
    return True


def _parse_text(text: str, source_name: str, ctx: ir.Context, engine: DiagnosticEngine):
    with ctx:
        try:
            op = ir.Operation.parse(text, source_name=source_name)
        except ir.MLIRError as err:
            if _NOT_ONE_TOP_LEVEL_OP not in str(err):
                engine.extend_from_mlir_error(err)
                return None
            op = None
        if op is not None and op.operation.name == "builtin.module":
            return op.operation
        # Several (or zero, or one non-module) top-level ops: wrap them in a module as
        # mlir-opt does. "module {" goes on the first line so every other line keeps
        # its number (only line 1's columns move, by 8).
        try:
            wrapped = ir.Operation.parse("module {" + text + "\n}", source_name=source_name)
        except ir.MLIRError as err:
            engine.extend_from_mlir_error(err)
            return None
        return wrapped.operation


def _parse_bytecode(
    data: bytes, source_name: str, ctx: ir.Context, engine: DiagnosticEngine, isolate: bool
):
    problem = _check_bytecode(data)
    if problem is not None:
        offset, message = problem
        engine.error(
            SourceLoc(source_name, 1, 1),
            f"invalid MLIR bytecode at byte offset {offset}: {message}",
        )
        return None
    if isolate:
        failure = probe_bytecode_reader(data)
        if failure is not None:
            engine.error(SourceLoc(source_name, 1, 1), f"invalid MLIR bytecode: {failure}")
            return None
    with ctx:
        try:
            module = ir.Module.parse(data)
        except ir.MLIRError as err:
            engine.extend_from_mlir_error(err)
            _relocate_unknown(engine, source_name)
            return None
        except Exception as err:  # the bytecode reader reports some failures this way
            engine.error(SourceLoc(source_name, 1, 1), f"invalid MLIR bytecode: {err}")
            return None
        # Own the operation independently of the temporary Module wrapper.
        return module.operation.clone()


def _relocate_unknown(engine: DiagnosticEngine, source_name: str) -> None:
    # The bytecode reader locates its errors at `-:0:0` (the unnamed buffer).
    for diag in engine.diagnostics:
        for d in (diag, *diag.notes):
            if d.loc is None or (d.loc.file == "-" and d.loc.line == 0):
                d.loc = SourceLoc(source_name, 1, 1)


def probe_bytecode_reader(data: bytes, timeout_s: float | None = None) -> str | None:
    """Runs MLIR's bytecode reader on `data` in a forked child; returns why it failed
    (hang or crash) or None when it finished (having parsed or rejected the file).

    Why: a corrupt attribute table whose entries reference each other makes jaxlib
    0.10.2's reader loop forever while holding the GIL (found by test_opt_fuzz.py; the
    reader defers entries nested too deeply and retries them, which never ends on a
    cycle), and no check short of decoding every dialect's attribute encoding finds
    such cycles. fork() makes the probe cost milliseconds: the child already has jaxlib
    loaded. Without fork (Windows) the probe is skipped.
    """
    import os
    import signal
    import time
    import warnings

    if not hasattr(os, "fork"):
        return None
    if timeout_s is None:
        # Generous: the reader does ~100 MB/s.
        timeout_s = BYTECODE_READER_TIMEOUT_S + len(data) / 10e6
    with warnings.catch_warnings():
        # jax (when imported) warns on every fork; the child touches nothing of jax's.
        warnings.simplefilter("ignore", RuntimeWarning)
        warnings.simplefilter("ignore", DeprecationWarning)  # Python 3.12+: threads
        pid = os.fork()
    if pid == 0:  # child: parse, never return into the caller's code
        code = 3
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 1)
            os.dup2(devnull, 2)
            from .context import make_context

            child_ctx = make_context()
            child_ctx.enable_multithreading(False)  # the parent's thread pool is not here
            with child_ctx:
                try:
                    ir.Module.parse(data)
                except ir.MLIRError:
                    pass
            code = 0
        finally:
            os._exit(code)
    deadline = time.monotonic() + timeout_s
    delay = 0.001
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return (f"MLIR's bytecode reader did not finish within {timeout_s:.0f} s; the file "
                    "is corrupt (e.g. attributes that reference each other)")
        time.sleep(delay)
        delay = min(delay * 2, 0.05)
    if os.WIFSIGNALED(status):
        return (f"MLIR's bytecode reader crashed on this file (signal "
                f"{os.WTERMSIG(status)}); the file is corrupt")
    if os.WEXITSTATUS(status) != 0:
        return "MLIR's bytecode reader failed on this file in an unexpected way"
    return None


# --------------------------------------------------------------------------------------
# Text: convolution dimension numbers that make StableHLO's parser allocate gigabytes
# --------------------------------------------------------------------------------------
_CONV_DIMS = re.compile(r"dim_numbers\s*=|#stablehlo\.conv<")
_INTEGER = re.compile(r"-?(?:0[xX][0-9a-fA-F]+|\d+)")
# A dimension index is below the rank; real ranks are tiny, this only stops absurd ones.
_MAX_CONV_DIMENSION = 1 << 16


def _check_conv_dimension_numbers(text: str, source_name: str, engine: DiagnosticEngine) -> bool:
    if "dim_numbers" not in text and "#stablehlo.conv<" not in text:
        return True
    for keyword in _CONV_DIMS.finditer(text):
        pos = keyword.end()
        for _ in range(3):  # [input]x[kernel]->[output]
            while pos < len(text) and text[pos] in " \t\r\nx->":
                pos += 1
            if pos >= len(text) or text[pos] != "[":
                break
            end = pos + 1
            while end < len(text) and text[end] not in "]\n":
                end += 1
            for number in _INTEGER.finditer(text, pos + 1, end):
                literal = number.group()
                value = int(literal, 16 if "x" in literal.lower() else 10) if literal[0] != "-" else 0
                if value >= _MAX_CONV_DIMENSION:
                    line, col = _position(text, number.start())
                    engine.error(
                        SourceLoc(source_name, line, col),
                        f"convolution dimension number {literal} is out of range: a dimension "
                        "index must be below the operand's rank",
                    )
                    return False
            pos = end + 1
    return True


# --------------------------------------------------------------------------------------
# Bytecode: walk the section structure before MLIR does (see the module docstring)
# --------------------------------------------------------------------------------------
# Section ids of the MLIR bytecode format (mlir/Bytecode/Encoding.h).
_STRING, _DIALECT, _ATTR_TYPE, _ATTR_TYPE_OFFSET, _IR = 0, 1, 2, 3, 4
_NUM_SECTIONS = 9
_ALIGNMENT_BYTE = 0xCB


class _BytecodeProblem(Exception):
    def __init__(self, offset: int, message: str) -> None:
        super().__init__(message)
        self.offset = offset
        self.message = message


class _Reader:
    """MLIR's EncodingReader, enough of it to walk sections and tables."""

    def __init__(self, data: bytes, base: int = 0) -> None:
        self.data = data
        self.pos = 0
        self.base = base  # offset of `data` in the file, for messages and alignment

    def fail(self, message: str) -> _BytecodeProblem:
        return _BytecodeProblem(self.base + self.pos, message)

    def empty(self) -> bool:
        return self.pos >= len(self.data)

    def byte(self) -> int:
        if self.pos >= len(self.data):
            raise self.fail("unexpected end of data")
        self.pos += 1
        return self.data[self.pos - 1]

    def bytes(self, n: int) -> bytes:
        if n > len(self.data) - self.pos:
            raise self.fail(f"{n} bytes requested, {len(self.data) - self.pos} left")
        self.pos += n
        return self.data[self.pos - n : self.pos]

    def varint(self) -> int:
        first = self.byte()
        if first & 1:
            return first >> 1
        if first == 0:
            return int.from_bytes(self.bytes(8), "little")
        extra = (first & -first).bit_length() - 1  # trailing zero bits = further bytes
        value = int.from_bytes(bytes([first]) + self.bytes(extra), "little")
        return value >> (extra + 1)

    def cstring(self) -> bytes:
        end = self.data.find(b"\x00", self.pos)
        if end < 0:
            raise self.fail("string without a terminating NUL")
        value = self.data[self.pos : end]
        self.pos = end + 1
        return value


def _utf8(value: bytes, what: str, offset: int) -> None:
    try:
        value.decode("utf-8")
    except UnicodeDecodeError as err:
        raise _BytecodeProblem(
            offset + err.start,
            f"{what} is not valid UTF-8 ({value[:40]!r}); torch_tpu requires UTF-8 names and strings",
        ) from None


def _check_bytecode(data: bytes) -> tuple[int, str] | None:
    """(offset, problem) for bytecode that MLIR's reader must not see, else None."""
    try:
        reader = _Reader(data)
        reader.bytes(len(BYTECODE_MAGIC))
        reader.varint()  # version: MLIR reports an unsupported one itself
        start = reader.pos
        _utf8(reader.cstring(), "producer string", start)
        sections: dict[int, tuple[int, bytes]] = {}
        while not reader.empty():
            header = reader.byte()
            section_id, aligned = header & 0x7F, bool(header & 0x80)
            length = reader.varint()
            if section_id >= _NUM_SECTIONS:
                raise reader.fail(f"invalid section id {section_id}")
            if section_id in sections:
                raise reader.fail(f"section {section_id} appears twice")
            if aligned:
                alignment = reader.varint()
                if alignment == 0 or alignment & (alignment - 1):
                    raise reader.fail(f"section alignment {alignment} is not a power of two")
                while reader.pos % alignment:
                    if reader.byte() != _ALIGNMENT_BYTE:
                        raise reader.fail("expected an alignment byte (0xCB)")
            offset = reader.pos
            sections[section_id] = (offset, reader.bytes(length))
        for required in (_STRING, _DIALECT, _ATTR_TYPE, _ATTR_TYPE_OFFSET, _IR):
            if required not in sections:
                raise _BytecodeProblem(len(data), f"missing section {required}")
        _check_string_section(*sections[_STRING])
        _check_attr_types(sections[_ATTR_TYPE], sections[_ATTR_TYPE_OFFSET])
    except _BytecodeProblem as problem:
        return problem.offset, problem.message
    return None


def _check_string_section(offset: int, section: bytes) -> None:
    reader = _Reader(section, offset)
    count = reader.varint()
    end = len(section)
    # Sizes come first (in reverse order of the strings); the strings, each with its
    # NUL, fill the end of the section back to front.
    for _ in range(count):
        size = reader.varint()
        if size == 0 or size > end - reader.pos:
            raise reader.fail(f"string table entry of size {size} does not fit the section")
        start = end - size
        _utf8(section[start : end - 1], "string table entry", offset + start)
        end = start


def _check_attr_types(attr_types: tuple[int, bytes], offsets: tuple[int, bytes]) -> None:
    data_offset, data = attr_types
    reader = _Reader(offsets[1], offsets[0])
    num_attributes, num_types = reader.varint(), reader.varint()
    if num_attributes + num_types > len(data) + 1:  # each entry takes a byte at least
        raise reader.fail(f"{num_attributes} attributes and {num_types} types cannot fit")
    position = 0
    for total in (num_attributes, num_types):
        done = 0
        while done < total:
            reader.varint()  # dialect index; MLIR checks its range itself
            entries = reader.varint()
            if entries > total - done:
                raise reader.fail(
                    f"dialect group of {entries} entries overruns the {total} declared")
            for _ in range(entries):
                flagged = reader.varint()
                size, custom = flagged >> 1, flagged & 1
                if position + size > len(data):
                    raise reader.fail("attribute/type entry overruns its section")
                if not custom:  # textual assembly, NUL-terminated
                    text = data[position : position + size].split(b"\x00", 1)[0]
                    _utf8(text, "attribute/type text", data_offset + position)
                position += size
            done += entries


def check_untrusted_bytecode(data: bytes) -> str | None:
    """Why MLIR must not read `data` (bytecode from a file of unknown origin), or None:
    the structural checks that stop heap corruption, then the reader in a forked child
    that catches hangs and crashes (`probe_bytecode_reader`)."""
    if not is_bytecode(data):
        return "not MLIR bytecode (no 'ML\\xefR' magic number)"
    problem = _check_bytecode(data)
    if problem is not None:
        offset, message = problem
        return f"invalid MLIR bytecode at byte offset {offset}: {message}"
    return probe_bytecode_reader(data)
