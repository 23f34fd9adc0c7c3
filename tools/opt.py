"""torchtpu-opt: runs torch_tpu and upstream MLIR passes on `.mlir` files, with
`mlir-opt`'s conventions (input file or `-`, `-o`, `--split-input-file`,
`--verify-diagnostics`, `--pass-pipeline=...` or one flag per pass, IR printing,
bytecode, timing). Exit status 0 on success, 1 on any error; never a traceback."""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
import sys
import tempfile
from dataclasses import dataclass
from typing import BinaryIO, TextIO

SPLIT_MARKER = re.compile(r"^// -----.*$", re.M)


@dataclass
class Chunk:
    text: str | bytes
    first_line: int  # line of the original file where the chunk starts


class _UsageError(Exception):
    pass


class _ArgumentParser(argparse.ArgumentParser):
    """Reports usage errors as `torchtpu-opt: error: ...` and exit status 1 (never
    SystemExit from inside `run`, which in-process callers use)."""

    def error(self, message: str):  # type: ignore[override]
        raise _UsageError(message)


def _arg_parser(epilog: str = "Run --list-passes for every pass with its options.") -> argparse.ArgumentParser:
    p = _ArgumentParser(
        prog="torchtpu-opt",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        add_help=False,
        description="torch_tpu's MLIR optimizer driver (mlir-opt conventions). Passes are "
        "given as --pass-pipeline='builtin.module(...)' or as one flag each "
        "(--torchtpu-verify --canonicalize --torchtpu-set-precision=mode=highest).",
        epilog=epilog,
        allow_abbrev=False,
    )
    p.add_argument("-h", "--help", action="store_true", help="show this help (with the passes) and exit")
    p.add_argument("input", nargs="?", default="-", help="input .mlir or bytecode file ('-' for stdin)")
    p.add_argument("-o", dest="output", default="-", help="output file ('-' for stdout)")
    p.add_argument("--pass-pipeline", default=None, help="textual pass pipeline, e.g. 'builtin.module(cse)'")
    p.add_argument("--split-input-file", action="store_true", help="process '// -----'-separated chunks independently")
    p.add_argument("--verify-diagnostics", action="store_true", help="check expected-error/warning/note/remark annotations")
    p.add_argument("--mlir-print-ir-after-all", action="store_true", help="print the IR after each pass (stderr)")
    p.add_argument("--mlir-print-ir-before-all", action="store_true", help="print the IR before each pass (stderr)")
    p.add_argument("--mlir-print-debuginfo", action="store_true", help="print locations")
    p.add_argument("--mlir-print-op-generic", action="store_true", help="print ops in generic form")
    p.add_argument("--emit-bytecode", action="store_true", help="write MLIR bytecode instead of text")
    p.add_argument("--mlir-timing", action="store_true", help="print pass timings (stderr)")
    p.add_argument("--list-passes", action="store_true", help="list the available passes and exit")
    p.add_argument("--verify-each", default="true", choices=("true", "false"), help="verify after parsing and after the pipeline (default true)")
    p.add_argument("--allow-unregistered-dialect", action="store_true", help="accepted for mlir-opt compatibility (always on)")
    p.add_argument("--mlir-disable-threading", action="store_true", help="run everything on one thread")
    return p


def _pass_flags_to_pipeline(flags: list[str]) -> tuple[str | None, str | None]:
    """`--a --b=x=1` -> 'a,b{x=1}'. Returns (pipeline, error)."""
    elements = []
    for flag in flags:
        if not flag.startswith("--") or flag == "--":
            return None, f"unexpected argument '{flag}'"
        name, _, options = flag[2:].partition("=")
        if options.startswith(("'", '"')) and options.endswith(options[0]) and len(options) >= 2:
            options = options[1:-1]
        elements.append(f"{name}{{{options}}}" if options else name)
    return ",".join(elements), None


def _split(data: bytes, split: bool) -> list[Chunk]:
    from torch_tpu.compiler.source import is_bytecode

    if not split or is_bytecode(data):
        return [Chunk(data, 1)]
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return [Chunk(data, 1)]
    chunks: list[Chunk] = []
    start, line = 0, 1
    for marker in SPLIT_MARKER.finditer(text):
        piece = text[start : marker.start()]
        chunks.append(Chunk(piece, line))
        line += piece.count("\n")
        start = marker.end()
    chunks.append(Chunk(text[start:], line))
    return chunks


def _list_passes(out: TextIO) -> None:
    from torch_tpu.compiler.passes import PASS_REGISTRY
    from torch_tpu.compiler.pipeline import FUNC_ANCHORED_UPSTREAM, MODULE_LEVEL_UPSTREAM

    out.write("torch_tpu passes:\n")
    for argument, cls in sorted(PASS_REGISTRY.items()):
        out.write(f"  --{argument}  {cls.summary}\n")
        for option in cls.options:
            out.write(f"      {option.describe()}  {option.help}\n")
    from torch_tpu.compiler.pipelines import PIPELINE_REGISTRY

    out.write("torch_tpu pipelines:\n")
    for argument, named in sorted(PIPELINE_REGISTRY.items()):
        out.write(f"  --{argument}  {named.summary}\n")
        for option in named.options:
            out.write(f"      {option.describe()}  {option.help}\n")
    out.write("upstream passes (jaxlib's MLIR build), module level:\n")
    for name in MODULE_LEVEL_UPSTREAM:
        out.write(f"  --{name}\n")
    out.write("upstream passes nested on func.func (nested automatically):\n")
    for name in sorted(FUNC_ANCHORED_UPSTREAM):
        out.write(f"  --{name}\n")


def _write_outputs(out, outputs: list[str | bytes], binary: bool) -> None:
    """Writes the chunks' outputs: text to text or binary streams (as UTF-8), bytecode to
    binary streams or the binary side of a text stream."""
    if binary:
        if isinstance(out, io.TextIOBase):
            if not hasattr(out, "buffer"):
                raise OSError(0, "--emit-bytecode needs a binary output stream")
            out.flush()
            out = out.buffer
        for piece in outputs:
            out.write(piece)
    else:
        text = "// -----\n".join(outputs)
        out.write(text if isinstance(out, io.TextIOBase) else text.encode("utf-8"))
    out.flush()


@contextlib.contextmanager
def _native_stderr_to(stream: TextIO):
    """MLIR's IR printing and timing report write to file descriptor 2 from C++. When
    the caller gave its own `stderr` (in-process use), route that output there too."""
    try:
        same = stream.fileno() == 2
    except (AttributeError, OSError, ValueError):
        same = False
    if same:
        stream.flush()
        yield
        return
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as capture:
        os.dup2(capture.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            capture.seek(0)
            stream.write(capture.read().decode("utf-8", errors="replace"))


def run(argv: list[str], stdin: BinaryIO | None = None, stdout=None, stderr: TextIO | None = None) -> int:
    stderr = stderr or sys.stderr
    parser = _arg_parser()
    try:
        args, extra = parser.parse_known_args(argv)
    except _UsageError as err:
        stderr.write(f"torchtpu-opt: error: {err}; see --help\n")
        return 1
    if args.help:
        passes = io.StringIO()
        _list_passes(passes)
        (stdout or sys.stdout).write(_arg_parser(passes.getvalue()).format_help())
        return 0
    if args.list_passes:
        _list_passes(stdout or sys.stdout)
        return 0
    if any(not e.startswith("--") for e in extra):
        bad = next(e for e in extra if not e.startswith("--"))
        stderr.write(f"torchtpu-opt: error: unexpected argument '{bad}'; see --help\n")
        return 1
    flag_pipeline, error = _pass_flags_to_pipeline(extra)
    if error:
        stderr.write(f"torchtpu-opt: error: {error}\n")
        return 1
    if args.pass_pipeline is not None and flag_pipeline:
        stderr.write("torchtpu-opt: error: give passes either as --pass-pipeline or as pass flags, not both\n")
        return 1
    pipeline_text = args.pass_pipeline if args.pass_pipeline is not None else flag_pipeline
    if args.emit_bytecode and args.split_input_file:
        stderr.write("torchtpu-opt: error: --emit-bytecode cannot be combined with --split-input-file\n")
        return 1

    # Read the input before importing the compiler, so a missing file fails fast.
    source_name = "<stdin>" if args.input == "-" else args.input
    try:
        if args.input == "-":
            data = (stdin or sys.stdin.buffer).read()
        else:
            with open(args.input, "rb") as f:
                data = f.read()
    except OSError as err:
        stderr.write(f"torchtpu-opt: error: could not open input file '{args.input}': {err.strerror}\n")
        return 1

    from torch_tpu.compiler.context import make_context
    from torch_tpu.compiler.pipeline import PipelineError, parse_pipeline

    try:
        elements = parse_pipeline(pipeline_text) if pipeline_text else []
    except PipelineError as err:
        stderr.write(f"torchtpu-opt: error: invalid pass pipeline '{pipeline_text}': {err}\n")
        return 1

    ctx = make_context()
    if args.mlir_print_ir_after_all or args.mlir_print_ir_before_all or args.mlir_disable_threading:
        # MLIR aborts the process (LLVM ERROR) when IR printing is enabled on a
        # multi-threaded context.
        ctx.enable_multithreading(False)
    # Build the pipeline once up front so an unknown pass or a bad option is reported
    # even when the input fails to parse.
    from torch_tpu.compiler.diagnostics import DiagnosticEngine
    from torch_tpu.compiler.pipeline import build_pass_manager

    try:
        build_pass_manager(elements, ctx, DiagnosticEngine())
    except PipelineError as err:
        stderr.write(f"torchtpu-opt: error: invalid pass pipeline '{pipeline_text}': {err}\n")
        return 1
    driver = _Driver(args, elements, ctx, source_name, stderr)
    outputs: list[str | bytes] = []
    ok = True
    for chunk in _split(data, args.split_input_file):
        status, output = driver.process(chunk)
        if status is None:  # the pipeline itself is invalid: same for every chunk
            return 1
        ok &= status
        if output is not None:
            outputs.append(output)

    try:
        if args.output != "-":
            with open(args.output, "wb" if args.emit_bytecode else "w", encoding=None if args.emit_bytecode else "utf-8") as out:
                _write_outputs(out, outputs, args.emit_bytecode)
        else:
            _write_outputs(stdout if stdout is not None else sys.stdout, outputs, args.emit_bytecode)
    except OSError as err:
        stderr.write(f"torchtpu-opt: error: could not write output '{args.output}': {err.strerror}\n")
        return 1
    return 0 if ok else 1


class _Driver:
    def __init__(self, args, elements, ctx, source_name: str, stderr: TextIO) -> None:
        self.args = args
        self.elements = elements
        self.ctx = ctx
        self.source_name = source_name
        self.stderr = stderr

    def process(self, chunk: Chunk) -> tuple[bool | None, str | bytes | None]:
        from torch_tpu.compiler.context import ir
        from torch_tpu.compiler.diagnostics import DiagnosticEngine
        from torch_tpu.compiler.passes.verify import VerifyPass
        from torch_tpu.compiler.pipeline import PipelineError, build_pass_manager
        from torch_tpu.compiler.source import parse_source

        from .expected_diagnostics import check

        args = self.args
        engine = DiagnosticEngine()
        verify_each = args.verify_each == "true"
        # Pad with newlines so every line keeps its number in the original file.
        data = chunk.text
        if isinstance(data, str) and chunk.first_line > 1:
            data = "\n" * (chunk.first_line - 1) + data
        output = None
        with engine.capture(self.ctx):
            module = parse_source(
                data, self.source_name, self.ctx, engine, isolate_bytecode_reader=True
            )
            if module is not None and verify_each:
                VerifyPass(engine).run(module)
            if module is not None and not engine.has_errors():
                try:
                    pm, _ = build_pass_manager(self.elements, self.ctx, engine)
                except PipelineError as err:
                    self.stderr.write(f"torchtpu-opt: error: invalid pass pipeline: {err}\n")
                    return None, None
                pm.enable_verifier(verify_each)
                if args.mlir_print_ir_after_all or args.mlir_print_ir_before_all:
                    pm.enable_ir_printing(
                        print_before_all=args.mlir_print_ir_before_all,
                        print_after_all=args.mlir_print_ir_after_all,
                        enable_debug_info=args.mlir_print_debuginfo,
                        print_generic_op_form=args.mlir_print_op_generic,
                        print_module_scope=True,
                    )
                if args.mlir_timing:
                    pm.enable_timing()
                if sys.stdout is not None:
                    sys.stdout.flush()
                with _native_stderr_to(self.stderr):
                    try:
                        with self.ctx:
                            pm.run(module)
                    except ir.MLIRError as err:
                        if not engine.has_errors():
                            engine.extend_from_mlir_error(err)
                    del pm  # prints the timing report, if enabled
                if not engine.has_errors() and verify_each:
                    VerifyPass(engine).run(module)
                if not engine.has_errors():
                    output = self._render(module)

        if args.verify_diagnostics:
            text = chunk.text if isinstance(chunk.text, str) else ""
            mismatches = check(self.source_name, text, chunk.first_line, engine.diagnostics)
            for line in mismatches:
                self.stderr.write(line + "\n")
            return not mismatches, output
        for diag in engine.diagnostics:
            self.stderr.write(diag.format(self.source_name) + "\n")
        return not engine.has_errors(), output

    def _render(self, module) -> str | bytes:
        if self.args.emit_bytecode:
            buffer = io.BytesIO()
            module.write_bytecode(buffer)
            return buffer.getvalue()
        return module.get_asm(
            enable_debug_info=self.args.mlir_print_debuginfo,
            print_generic_op_form=self.args.mlir_print_op_generic,
            assume_verified=True,
        )


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        code = run(argv)
    except KeyboardInterrupt:
        code = 130
    except Exception as err:  # noqa: BLE001 - never a traceback for users
        from torch_tpu.core import config

        if config.get("TORCH_TPU_DEBUG"):
            raise
        sys.stderr.write(
            f"torchtpu-opt: internal error: {type(err).__name__}: {err}\n"
            "please report this with the input file (set TORCH_TPU_DEBUG=1 for a traceback)\n"
        )
        code = 1
    return code


if __name__ == "__main__":
    sys.exit(main())
