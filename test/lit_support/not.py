"""A portable `not` for lit RUN lines: runs a command and inverts its exit status.

    not CMD ARGS...          succeeds when CMD exits with a non-zero status, fails when
                             CMD succeeds or is killed by a signal (a crash is never an
                             expected failure)
    not --crash CMD ARGS...  succeeds only when CMD is killed by a signal

Like LLVM's `not`; written in Python so the test suite needs no native helper.
"""

from __future__ import annotations

import subprocess
import sys


def main(argv: list[str]) -> int:
    expect_crash = bool(argv) and argv[0] == "--crash"
    if expect_crash:
        argv = argv[1:]
    if not argv:
        sys.stderr.write("not: usage: not [--crash] COMMAND [ARGS...]\n")
        return 2
    try:
        code = subprocess.call(argv)
    except OSError as err:
        sys.stderr.write(f"not: cannot run '{argv[0]}': {err.strerror}\n")
        return 2
    crashed = code < 0
    if expect_crash:
        return 0 if crashed else 1
    if crashed:
        sys.stderr.write(f"not: '{argv[0]}' was killed by signal {-code}\n")
        return 1
    return 0 if code != 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
