"""Device time per call from the chip's own profiler: what `bench/tpu.py --profile` adds to
each contender's row.

A few calls run under `jax.profiler.trace` (in-process; the XSpace is read back with
`jax.profiler.ProfileData`). On a TPU the device plane (`/device:TPU:0`) has one line of
programs ("XLA Modules") and one of HLO ops ("XLA Ops"); each op event's name is the whole
HLO instruction (`%fusion.3 = bf16[4,512]{...} fusion(...), kind=kLoop, ...`), read here
for its opcode, fusion kind and result type. On XLA:CPU the ops are events of the client's
threads carrying `hlo_module` / `hlo_op` stats; the same summary comes from those, so the
parser runs (and is tested) without a chip.
"""

from __future__ import annotations

import glob
import re
import statistics
import tempfile
from collections import defaultdict
from typing import Any, Callable

_KIND = re.compile(r"\bkind=(k\w+)")


def profile_calls(fn: Callable[[], Any], sync: Callable[[Any], Any], calls: int, top: int | None = 20) -> dict:
    """`calls` calls of `fn` (then one `sync`) under the profiler: their device time per call,
    by program, by op category and the `top` ops (None: every op; see `summarize`)."""
    import jax
    from jax.profiler import ProfileData

    with tempfile.TemporaryDirectory(prefix="xprof-") as folder:
        with jax.profiler.trace(folder):
            out = None
            for _ in range(calls):
                out = fn()
            sync(out)
            del out
        paths = glob.glob(f"{folder}/**/*.xplane.pb", recursive=True)
        if not paths:
            return {"error": "the profiler wrote no XSpace"}
        return summarize(ProfileData.from_file(paths[0]), calls, top)


def summarize(profile: Any, calls: int, top: int | None = 20) -> dict:
    """{"source", "device_ms_per_call" (the programs' time), "programs": {name: ms per
    call}, "categories": {opcode[:fusion kind]: ms per call}, "top_ops": [{op, category,
    type, ms_per_call, count_per_call}], "stat_keys": the first op event's stats (what
    else the profiler tells about an op)}, times summed over the calls and divided by them."""
    device = [p for p in profile.planes if p.name.startswith("/device:") and _line(p, "XLA Ops")]
    gaps: list[float] = []
    if device:
        plane = device[0]
        modules = list(_line(plane, "XLA Modules").events)
        programs = _durations((e.name, e.duration_ns) for e in modules)
        gaps = _idle_gaps(modules)
        op_events = list(_line(plane, "XLA Ops").events)
        ops = [(_parse_instruction(e.name), e.duration_ns) for e in op_events]
        stat_keys = sorted(k for k, _ in op_events[0].stats) if op_events else []
        source = plane.name
    else:
        programs, ops, stat_keys = _host_ops(profile)
        source = "host threads (hlo_module / hlo_op stats)"
    by_category: dict[str, float] = defaultdict(float)
    by_op: dict[tuple, list] = {}
    for (name, category, type_text), ns in ops:
        by_category[category] += ns
        entry = by_op.setdefault((name, category, type_text), [0.0, 0])
        entry[0] += ns
        entry[1] += 1
    per_call = 1e-6 / max(calls, 1)  # ns summed over the calls -> ms per call
    ranked = sorted(by_op.items(), key=lambda kv: -kv[1][0])[:top]
    return {
        "source": source,
        "calls": calls,
        "device_ms_per_call": sum(programs.values()) * per_call,
        "programs": {k: v * per_call for k, v in sorted(programs.items(), key=lambda kv: -kv[1])},
        "categories": {k: v * per_call for k, v in sorted(by_category.items(), key=lambda kv: -kv[1])},
        "top_ops": [{"op": name, "category": cat, "type": type_text, "ms_per_call": total * per_call,
                     "count_per_call": count / max(calls, 1)}
                    for (name, cat, type_text), (total, count) in ranked],
        "stat_keys": stat_keys,
        # The device's idle time between one program's end and the next one's start, while
        # the host had enqueued the next already (the calls run back to back, one sync at
        # the end): what a launch costs on the device beyond the program. TPU only (XLA:CPU
        # runs programs on host threads: no program line).
        "gap_us_median": statistics.median(gaps) * 1e-3 if gaps else None,
        "idle_ms_per_call": sum(gaps) * per_call if gaps else None,
    }


def _idle_gaps(modules: list) -> list[float]:
    """ns from each program event's end to the next one's start (programs in start order;
    overlapping ones count 0)."""
    spans = sorted((e.start_ns, e.end_ns) for e in modules)
    return [max(0.0, float(b[0] - a[1])) for a, b in zip(spans, spans[1:])]


def _line(plane: Any, name: str) -> Any:
    return next((line for line in plane.lines if line.name == name), None)


def _durations(pairs) -> dict[str, float]:
    out: dict[str, float] = defaultdict(float)
    for name, ns in pairs:
        out[re.sub(r"\(\d+\)$", "", name)] += ns  # "jit_step(12)": the run id is not the program
    return dict(out)


def _host_ops(profile: Any) -> tuple[dict, list, list]:
    """XLA:CPU: op events carry their module and op as stats; a module's time is the span
    of its ops per run (the CPU runs a program's ops on its threads, no module line)."""
    programs: dict[str, float] = defaultdict(float)
    ops = []
    stat_keys: list[str] = []
    for plane in profile.planes:
        for line in plane.lines:
            for event in line.events:
                stats = dict(event.stats)
                if "hlo_op" not in stats:
                    continue
                stat_keys = stat_keys or sorted(stats)
                programs[str(stats.get("hlo_module", "?"))] += event.duration_ns
                ops.append(((str(stats["hlo_op"]), str(stats["hlo_op"]).split(".")[0], ""), event.duration_ns))
    return dict(programs), ops, stat_keys


def _parse_instruction(text: str) -> tuple[str, str, str]:
    """(name, category, result type) of an HLO instruction's text: `%fusion.3 =
    (f32[2], bf16[2,4]{1,0}) fusion(...), kind=kOutput` -> ("fusion.3", "fusion:kOutput",
    "(f32[2], bf16[2,4]{1,0})"). Text that is not an instruction is its own category."""
    head, sep, rest = text.partition(" = ")
    name = head.strip().lstrip("%")
    if not sep:
        return name, name.split(".")[0], ""
    rest = rest.strip()
    if rest.startswith("("):  # a tuple type: up to its matching parenthesis
        depth = 0
        for i, ch in enumerate(rest):
            depth += ch == "("
            depth -= ch == ")"
            if depth == 0:
                break
        type_text, rest = rest[: i + 1], rest[i + 1:].strip()
    else:
        type_text, _, rest = rest.partition(" ")
    opcode = rest.split("(", 1)[0].strip() or "?"
    kind = _KIND.search(rest) if opcode == "fusion" else None
    category = f"{opcode}:{kind.group(1)}" if kind else opcode
    return name, category, re.sub(r"\{[^}]*\}", "", type_text)  # layouts and tiles left out: long


def brief(summary: dict, programs: int = 4, categories: int = 6) -> str:
    """Two lines for the console: the programs' device time and the largest categories."""
    if "error" in summary:
        return f"profile: {summary['error']}"
    progs = ", ".join(f"{k} {v:.3f}" for k, v in list(summary["programs"].items())[:programs])
    cats = ", ".join(f"{k} {v:.3f}" for k, v in list(summary["categories"].items())[:categories])
    gap = summary.get("gap_us_median")
    idle = "" if gap is None else f"; idle between programs {gap:.1f} us (median)"
    return (f"device {summary['device_ms_per_call']:.3f} ms/call: {progs}{idle}\n"
            f"        by op kind (ms/call): {cats}")
