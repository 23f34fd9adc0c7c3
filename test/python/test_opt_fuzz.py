"""Fuzz test of torchtpu-opt: mutated, truncated and garbage inputs derived from the lit
corpus (test/**/*.mlir) must never crash, hang or print a traceback.

Every input ends with exit status 0 or 1; status 1 comes with at least one located
error (`file:line:col: error:`, or `file: error:` for a diagnostic MLIR gives no
location) or a `torchtpu-opt: error:` line.

The inputs run in ONE worker subprocess that calls `torch_tpu.tools.opt.run` in-process
(about 10 ms per run). The parent only generates inputs and watches the worker: a
worker killed by a signal is a crash in jaxlib/MLIR, reported with the input that
killed it (saved under pytest's tmp_path) and then restarted so one run lists every
trap; a worker that stops answering is a hang.

Generation is deterministic (random.Random(SEED)), so a failure reproduces.
Run this file as `python test/python/test_opt_fuzz.py --worker` to get the worker.
"""

from __future__ import annotations

import base64
import json
import os
import queue
import random
import re
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

import pytest

SEED = 20240613
NUM_TEXT_MUTANTS = 520
NUM_BYTECODE_MUTANTS = 60
NUM_GARBAGE = 20
TIMEOUT_S = 60.0  # per input; generous for a loaded CI machine (a run takes ~10 ms)
WORKER_MEMORY_LIMIT = 6 << 30  # address space of the worker, in bytes

TEST_ROOT = Path(__file__).resolve().parents[1]

# Each input runs through two of these, chosen in rotation.
PIPELINES: list[list[str]] = [
    [],
    ["--torchtpu-verify", "--canonicalize", "--cse"],
    ["--split-input-file", "--torchtpu-set-precision=mode=highest", "--chlo-legalize-to-stablehlo"],
    ["--split-input-file", "--verify-diagnostics", "--torchtpu-verify"],
    ["--pass-pipeline=builtin.module(torchtpu-verify,func.func(cse),symbol-dce)", "--mlir-print-op-generic"],
    ["--mlir-print-debuginfo", "--torchtpu-set-precision=mode=high override=true", "--canonicalize"],
    ["--emit-bytecode", "--torchtpu-verify"],
]

_LOCATED_ERROR = re.compile(r"^(?:\S.*?:\d+:\d+|\S[^:\n]*): error: ", re.MULTILINE)
_TOOL_ERROR = re.compile(r"^torchtpu-opt: error: ", re.MULTILINE)


# --------------------------------------------------------------------------------------
# Input generation
# --------------------------------------------------------------------------------------
TOKEN_CLASSES: dict[str, tuple[re.Pattern, list[str]]] = {
    "type": (
        re.compile(r"\b(?:[fi](?:1|8|16|32|64)|bf16|index|tensor<[^<>]*>)"),
        ["f32", "i1", "i64", "bf16", "f8E4M3FN", "index", "complex<f32>", "none", "tensor<f32>",
         "tensor<*xf32>", "tensor<?x?xf32>", "tensor<0x3xi8>", "tensor<2x2xf32>",
         "tensor<9223372036854775807xf32>", "tensor<-1xf32>", "tuple<>", "memref<2xf32>",
         "!torchtpu.ref<tensor<2xf32>>", "!torchtpu.ref<i32>", "!torchtpu.ref", "!torchtpu.box<f32>",
         "vector<4xf32>", "tensor<2xf32, #stablehlo.bounds<4>>", "!stablehlo.token"],
    ),
    "ref": (
        re.compile(r"!torchtpu\.\w+(?:<[^>]*>+)?"),
        ["!torchtpu.ref<tensor<4xf32>>", "!torchtpu.ref<tensor<*xf32>>", "!torchtpu.ref<>",
         "!torchtpu.ref<<<", "!torchtpu.box", "!torchtpu.ref<tensor<2x?xi32>>", "tensor<2xf32>"],
    ),
    "number": (
        re.compile(r"(?<![\w%#@])-?\d+(?:\.\d+)?(?:e[+-]?\d+)?"),
        ["0", "1", "-1", "2", "3", "64", "-0.0", "1.5e400", "0x7FC00000", "9223372036854775808",
         "18446744073709551616", "4294967296", "nan", "inf", "1e-45", "99999999999999999999999"],
    ),
    "op": (
        re.compile(r"\b(?:stablehlo|chlo|func|torchtpu|builtin|arith)\.\w+"),
        ["stablehlo.add", "stablehlo.while", "stablehlo.dot_general", "stablehlo.convolution",
         "stablehlo.reduce", "stablehlo.return", "stablehlo.constant", "stablehlo.custom_call",
         "stablehlo.scatter", "stablehlo.gather", "stablehlo.case", "stablehlo.if",
         "torchtpu.load", "torchtpu.store", "torchtpu.frobnicate", "func.return", "func.call",
         "func.func", "chlo.erf", "builtin.module", "arith.constant", "sdy.mesh",
         "stablehlo.composite", "stablehlo.all_reduce"],
    ),
    "ssa": (
        re.compile(r"%[\w.$-]+(?:#\d+)?(?::\d+)?"),
        ["%0", "%arg0", "%99", "%0#1", "%1:2", "%r", "%v", "%iterArg"],
    ),
    "punct": (
        re.compile(r"[(){}\[\]<>:,=\"]"),
        ["(", ")", "{", "}", "[", "]", "<", ">", ":", ",", "=", '"', "->", "^bb0", "//", ""],
    ),
}

_SPECIAL_BYTES = b'{}()<>[]"%^#!@:=,\\\n\x00\xff0123456789-xe.'


def _lines_op(rng: random.Random, data: bytes) -> bytes:
    lines = data.split(b"\n")
    if len(lines) < 2:
        return data + data
    i, j = rng.randrange(len(lines)), rng.randrange(len(lines))
    kind = rng.choice(("delete", "duplicate", "swap"))
    if kind == "delete":
        del lines[i]
    elif kind == "duplicate":
        lines.insert(j, lines[i])
    else:
        lines[i], lines[j] = lines[j], lines[i]
    return b"\n".join(lines)


def _token_op(rng: random.Random, data: bytes) -> bytes:
    text = data.decode("utf-8", errors="replace")
    classes = list(TOKEN_CLASSES.values())
    rng.shuffle(classes)
    for pattern, replacements in classes:
        matches = list(pattern.finditer(text))
        if matches:
            m = rng.choice(matches)
            # Mostly a replacement of the same class; sometimes another class's token.
            pool = replacements if rng.random() < 0.8 else rng.choice(classes)[1]
            text = text[: m.start()] + rng.choice(pool) + text[m.end() :]
            return text.encode("utf-8")
    return data


def mutate(rng: random.Random, data: bytes) -> bytes:
    """One mutation of `data` (truncation, byte flips, insertion, deletion, line and
    token edits)."""
    if not data:
        return bytes(rng.choice(_SPECIAL_BYTES) for _ in range(rng.randint(1, 8)))
    kind = rng.choice(
        ("truncate", "flip", "insert", "delete", "lines", "lines", "token", "token", "token")
    )
    if kind == "truncate":
        return data[: rng.randrange(len(data))]
    if kind == "flip":
        out = bytearray(data)
        for _ in range(rng.randint(1, 8)):
            i = rng.randrange(len(out))
            out[i] = out[i] ^ (1 << rng.randrange(8)) if rng.random() < 0.5 else rng.randrange(256)
        return bytes(out)
    if kind == "insert":
        i = rng.randrange(len(data) + 1)
        piece = bytes(rng.choice(_SPECIAL_BYTES) for _ in range(rng.randint(1, 4)))
        return data[:i] + piece + data[i:]
    if kind == "delete":
        i = rng.randrange(len(data))
        return data[:i] + data[i + rng.randint(1, 16) :]
    if kind == "lines":
        return _lines_op(rng, data)
    return _token_op(rng, data)


def corpus() -> list[bytes]:
    """Every lit test file, plus each of its `// -----` chunks on its own."""
    seeds: list[bytes] = []
    for path in sorted(TEST_ROOT.rglob("*.mlir")):
        data = path.read_bytes()
        seeds.append(data)
        chunks = re.split(rb"(?m)^// -----.*$", data)
        if len(chunks) > 1:
            seeds.extend(c for c in chunks if c.strip())
    return seeds


@dataclass
class Case:
    name: str
    data: bytes


def text_cases(rng: random.Random, seeds: list[bytes]) -> list[Case]:
    cases = [Case("empty input", b""), Case("only a split marker", b"// -----\n// -----\n")]
    for index in range(NUM_TEXT_MUTANTS):
        data = rng.choice(seeds)
        steps = rng.choice((1, 1, 1, 2, 3))
        if rng.random() < 0.05:  # splice two files
            other = rng.choice(seeds)
            data = data[: rng.randrange(len(data) + 1)] + other[rng.randrange(len(other) + 1) :]
        for _ in range(steps):
            data = mutate(rng, data)
        cases.append(Case(f"text mutant #{index}", data))
    for index in range(NUM_GARBAGE):
        size = rng.choice((1, 7, 64, 512))
        data = bytes(rng.randrange(256) for _ in range(size))
        if index % 4 == 0:
            data = b"ML\xefR" + data  # garbage behind the bytecode magic
        cases.append(Case(f"binary garbage #{index}", data))
    return cases


def bytecode_cases(rng: random.Random, bytecodes: list[bytes]) -> list[Case]:
    cases: list[Case] = []
    for index in range(NUM_BYTECODE_MUTANTS):
        data = rng.choice(bytecodes)
        kind = index % 3
        if kind == 0:
            data = data[: rng.randrange(len(data))]
        elif kind == 1:
            out = bytearray(data)
            for _ in range(rng.randint(1, 4)):
                i = rng.randrange(4, len(out))  # keep the magic so the reader is exercised
                out[i] = rng.randrange(256)
            data = bytes(out)
        else:
            i = rng.randrange(4, len(data))
            data = data[:i] + bytes(rng.randrange(256) for _ in range(rng.randint(1, 8))) + data[i:]
        cases.append(Case(f"bytecode mutant #{index}", data))
    return cases


# --------------------------------------------------------------------------------------
# The worker: runs torchtpu-opt in-process on each request
# --------------------------------------------------------------------------------------
def _worker() -> None:
    import io

    # Keep the protocol channel private: anything else writing to fd 1 (MLIR's C++
    # code, a stray print) goes to stderr instead.
    channel = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    requests = sys.stdin.buffer
    try:  # an allocation bomb must fail (MemoryError, reported) instead of swapping
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (WORKER_MEMORY_LIMIT, WORKER_MEMORY_LIMIT))
    except (ImportError, ValueError, OSError):
        pass

    from torch_tpu.compiler import source
    from torch_tpu.tools.opt import run

    # A corrupt bytecode file can make MLIR's reader loop forever; torchtpu-opt reports
    # that after this long (30 s by default), which must stay below the parent's TIMEOUT_S.
    source.BYTECODE_READER_TIMEOUT_S = 5.0

    channel.write("ready\n")
    channel.flush()
    while True:
        header = requests.readline()
        if not header:
            return
        request = json.loads(header)
        data = requests.read(request["size"])
        binary = "--emit-bytecode" in request["argv"]
        stdout = io.BytesIO() if binary else io.StringIO()
        stderr = io.StringIO()
        try:
            rc = run(request["argv"] + ["-"], stdin=io.BytesIO(data), stdout=stdout, stderr=stderr)
        except BaseException as err:  # noqa: BLE001 - reported to the parent as a failure
            import traceback

            rc = -1000
            stderr.write("Traceback (in worker):\n" + "".join(traceback.format_exception(err)))
        reply = {"rc": rc, "stderr": stderr.getvalue()}
        if request.get("want_stdout"):
            value = stdout.getvalue()
            reply["stdout"] = base64.b64encode(value if binary else value.encode()).decode()
        channel.write(json.dumps(reply) + "\n")
        channel.flush()


class Worker:
    """The parent's handle on the worker subprocess."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        self.replies: queue.Queue = queue.Queue()
        self.stderr_tail: list[bytes] = []
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=self._drain_stderr, daemon=True).start()
        first = self.replies.get(timeout=TIMEOUT_S)
        if first != "ready":
            raise RuntimeError(f"fuzz worker did not start: {self.describe_death()}")

    def _read(self) -> None:
        for line in self.proc.stdout:
            text = line.decode()
            self.replies.put("ready" if text == "ready\n" else json.loads(text))
        self.replies.put(None)

    def _drain_stderr(self) -> None:
        for line in self.proc.stderr:
            self.stderr_tail = (self.stderr_tail + [line])[-20:]

    def request(self, argv: list[str], data: bytes, want_stdout: bool = False):
        """The worker's reply, or ('crash', detail) / ('hang', detail)."""
        header = json.dumps({"argv": argv, "size": len(data), "want_stdout": want_stdout})
        try:
            self.proc.stdin.write(header.encode() + b"\n" + data)
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            return "crash", self.describe_death()
        try:
            reply = self.replies.get(timeout=TIMEOUT_S)
        except queue.Empty:
            self.proc.kill()
            self.proc.wait()
            return "hang", f"no answer after {TIMEOUT_S:.0f} s"
        if reply is None:
            return "crash", self.describe_death()
        return reply

    def describe_death(self) -> str:
        code = self.proc.wait()
        kind = f"killed by signal {-code}" if code < 0 else f"exited with status {code}"
        tail = b"".join(self.stderr_tail).decode(errors="replace")[-1500:]
        return f"worker {kind}; its stderr ended with:\n{tail}"

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def check_reply(reply: dict) -> str | None:
    """What is wrong with one run's outcome, or None."""
    rc, err = reply["rc"], reply["stderr"]
    if rc not in (0, 1):
        return f"exit status {rc}"
    for forbidden in ("Traceback", "internal error"):
        if forbidden in err:
            return f"'{forbidden}' in stderr"
    if rc == 1 and not (_LOCATED_ERROR.search(err) or _TOOL_ERROR.search(err)):
        return "exit status 1 without a located error or a 'torchtpu-opt: error:' line"
    return None


def run_cases(cases: list[Case], failures_dir: Path | None = None) -> tuple[list[str], int]:
    """Runs every case through two pipelines. Returns (failure reports, runs done)."""
    failures: list[str] = []
    runs = 0
    worker = Worker()
    try:
        for index, case in enumerate(cases):
            for k in range(2):
                argv = PIPELINES[(2 * index + k) % len(PIPELINES)]
                reply = worker.request(argv, case.data)
                runs += 1
                if isinstance(reply, tuple):
                    kind, detail = reply
                    problem = f"{kind}: {detail}"
                    worker = Worker()  # keep going: one run reports every trap
                else:
                    problem = check_reply(reply)
                    if problem is not None:
                        problem += "\n--- stderr ---\n" + reply["stderr"][-2000:]
                if problem is not None:
                    saved = ""
                    if failures_dir is not None:
                        path = failures_dir / f"fuzz-input-{index}-{k}.bin"
                        path.write_bytes(case.data)
                        saved = f"\n  input saved to {path}"
                    failures.append(
                        f"{case.name} with torchtpu-opt {' '.join(argv)} -: {problem}{saved}\n"
                        f"  input ({len(case.data)} bytes): {case.data[:300]!r}"
                    )
    finally:
        worker.close()
    return failures, runs


def generate_cases() -> list[Case]:
    """All inputs, deterministically. Bytecode seeds are written by the worker from
    the corpus files that are valid as a whole."""
    rng = random.Random(SEED)
    seeds = corpus()
    cases = text_cases(rng, seeds)
    bytecodes: list[bytes] = []
    worker = Worker()
    try:
        for data in seeds:
            reply = worker.request(["--emit-bytecode"], data, want_stdout=True)
            if isinstance(reply, dict) and reply["rc"] == 0:
                bytecodes.append(base64.b64decode(reply["stdout"]))
    finally:
        worker.close()
    assert len(bytecodes) >= 5, "too few corpus files parse as a whole to seed bytecode mutants"
    cases += bytecode_cases(rng, bytecodes)
    return cases


# --------------------------------------------------------------------------------------
# Tests
# --------------------------------------------------------------------------------------
def test_mutators_are_deterministic_and_change_inputs() -> None:
    seeds = corpus()
    assert len(seeds) >= 10, "the lit corpus (test/**/*.mlir) is missing"
    a = text_cases(random.Random(SEED), seeds)
    b = text_cases(random.Random(SEED), seeds)
    assert [c.data for c in a] == [c.data for c in b]
    changed = sum(1 for c in a if c.data not in seeds)
    assert changed >= 0.9 * len(a), f"only {changed} of {len(a)} inputs differ from the corpus"


def test_check_reply_rejects_bad_outcomes() -> None:
    assert check_reply({"rc": 0, "stderr": ""}) is None
    assert check_reply({"rc": 1, "stderr": "<stdin>:3:4: error: boom\n"}) is None
    assert check_reply({"rc": 1, "stderr": "<stdin>: error: no location\n"}) is None
    assert check_reply({"rc": 1, "stderr": "torchtpu-opt: error: bad flag\n"}) is None
    unlocated = "exit status 1 without a located error or a 'torchtpu-opt: error:' line"
    assert check_reply({"rc": 1, "stderr": "error: bare\n"}) == unlocated
    assert check_reply({"rc": 1, "stderr": ""}) == unlocated
    assert check_reply({"rc": 2, "stderr": "x:1:1: error: y"}) == "exit status 2"
    assert check_reply({"rc": 0, "stderr": "Traceback (most recent call last):"}) == "'Traceback' in stderr"
    assert check_reply({"rc": 1, "stderr": "torchtpu-opt: internal error: KeyError"}) == "'internal error' in stderr"


def test_worker_reports_a_crash_with_its_input(tmp_path: Path) -> None:
    """The harness itself: a worker killed by a signal is reported, not hidden."""
    worker = Worker()
    try:
        worker.proc.kill()
        reply = worker.request([], b"func.func @f() { return }")
    finally:
        worker.close()
    assert isinstance(reply, tuple) and reply[0] == "crash"
    assert "signal" in reply[1]


def test_opt_survives_fuzzed_inputs(tmp_path: Path) -> None:
    cases = generate_cases()
    assert len(cases) >= 500
    failures, runs = run_cases(cases, tmp_path)
    assert runs == 2 * len(cases)
    assert not failures, f"{len(failures)} of {runs} fuzzed runs failed:\n\n" + "\n\n".join(failures[:10])


if __name__ == "__main__":
    if sys.argv[1:] == ["--worker"]:
        _worker()
    else:
        sys.exit(pytest.main([__file__, "-q", *sys.argv[1:]]))
