"""Prints ops of an optimized HLO module's text (what `bench/hlo_layouts.py --hlo-dir`
writes) with the computations they call: a fusion's line (its operands, XLA's window
configuration and estimated cycles) and its body, nested fusions' bodies to `--depth` levels.
What a profile names (`fusion.15`, `multiply_reduce_fusion.5`) is read here, on the
development machine, after the chip has written the module.

    python bench/hlo_fusion.py ours.hlo.txt fusion.15 [OP ...] [--depth 2] [--width 400]
"""

from __future__ import annotations

import argparse
import re
import sys

_CALLS = re.compile(r"\b(?:calls|to_apply)=%([\w.\-]+)")


def instruction(lines: list[str], name: str) -> str | None:
    """The line that defines `%name` (in any computation), or None."""
    pattern = re.compile(rf"^\s*(?:ROOT )?%{re.escape(name)} = ")
    return next((line for line in lines if pattern.match(line)), None)


def computation(lines: list[str], name: str) -> list[str]:
    """The lines of computation `%name`, from its header to its closing brace."""
    header = re.compile(rf"^(?:ENTRY )?%{re.escape(name)} ")
    start = next((i for i, line in enumerate(lines) if header.match(line)), None)
    if start is None:
        return []
    end = next(i for i in range(start, len(lines)) if lines[i].startswith("}"))
    return lines[start:end + 1]


def describe(lines: list[str], name: str, depth: int) -> list[str]:
    """`name`'s line, then the body of each computation it calls, indented, the calls made
    inside those bodies followed to `depth` levels in all."""
    line = instruction(lines, name)
    if line is None:
        return [f"%{name}: no such instruction"]
    out = [line.strip()]
    pending, seen = [(callee, 1) for callee in _CALLS.findall(line)], set()
    while pending:
        callee, level = pending.pop(0)
        if callee in seen or level > depth:
            continue
        seen.add(callee)
        body = computation(lines, callee)
        out += ["    " * level + body_line.strip() for body_line in body]
        pending += [(inner, level + 1) for body_line in body[1:] for inner in _CALLS.findall(body_line)]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("hlo", help="an optimized HLO module's text")
    parser.add_argument("ops", nargs="+", help="instruction names, without the %%")
    parser.add_argument("--depth", type=int, default=2, help="levels of called computations shown (default 2)")
    parser.add_argument("--width", type=int, default=400, help="characters a line (0: whole lines)")
    a = parser.parse_args(argv)
    with open(a.hlo) as fh:
        lines = fh.read().splitlines()
    for name in a.ops:
        for line in describe(lines, name, a.depth):
            print(line[:a.width] if a.width else line)
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
