"""First call (trace + compile + one run) of the quickstart model, each in a fresh process,
as `python -m torch_tpu.examples.quickstart` times it: the client is made first, then
the first call of `torch.compile(TinyGPT, backend="tpu")` under torch.no_grad is timed.

    .venv/bin/python bench/first_call.py [--rounds 5] [--compare-dynamo-aot-helper] [--baseline PATH]

Reported: median wall, process CPU (all threads) and main-thread CPU seconds of the first
call over the rounds (CPU time is much less disturbed by other processes on a loaded
machine), and its split into Dynamo + aot_autograd (the rest), conversion, passes and XLA
compile (torch_tpu.program.timing; XLA compiles in the background while Dynamo finishes, so
"waited" is the part of it the first call waited for).
torch_tpu's L2 compile cache is off, so every round compiles.

--compare-dynamo-aot-helper interleaves rounds that run aot_autograd through Dynamo's
`AotAutograd` helper (what backend="tpu" used before issue #17: it imports
torch._inductor.debug on the first compile) with rounds of the current backend, so the
two are measured under the same load.

--baseline PATH times another source tree of torch_tpu (a `git worktree add PATH <commit>`
checkout) with this venv, in rounds alternating with the current tree, so both run under
the same load: commit 2e8e26c is the state issue #17 was filed in
(`git worktree add ../torch_tpu-base 2e8e26c`, then `--baseline ../torch_tpu-base`).
Wall time counts what the user waits for; CPU time (all threads of the process) shows
work moved to a background thread that wall time would hide.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

_CHILD = r"""
import json, os, sys, time
os.environ["TORCH_TPU_CACHE_L2"] = "0"
if sys.argv[2]:
    # Another source tree: the editable install maps the packages through its finder.
    import __editable___torch_tpu_0_1_0_finder as finder
    for package, path in list(finder.MAPPING.items()):
        finder.MAPPING[package] = os.path.join(sys.argv[2], os.path.relpath(path, sys.argv[3]))
import torch
from torch_tpu.examples.quickstart import TinyGPT
torch.manual_seed(0)
model = TinyGPT(seq=64).eval()
ids = torch.randint(0, 512, (4, 64))
from torch_tpu.runtime import get_client
get_client()
if sys.argv[1] == "dynamo-aot-helper":
    import torch_tpu.backend as backend
    from torch._dynamo.backends.common import AotAutograd
    backend.aot_compile = lambda gm, inputs, **options: AotAutograd(**options)(gm, inputs)
compiled = torch.compile(model, backend="tpu")
c0, m0, t0 = time.process_time(), time.thread_time(), time.perf_counter()
with torch.no_grad():
    out = compiled(ids)
wall, cpu, main = time.perf_counter() - t0, time.process_time() - c0, time.thread_time() - m0
with torch.no_grad():
    err = (out - model(ids)).abs().max().item()
try:
    from torch_tpu.program import timing as _timing
except ImportError:  # a tree compared against from before the frontend's packages
    from torch_tpu import _timing
import torch_tpu.backend
print(json.dumps({"wall": wall, "cpu": cpu, "main_cpu": main, "err": err, "phases": _timing.snapshot(),
                  "source": torch_tpu.backend.__file__}))
"""


_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _one(variant: str, tree: str = "") -> dict:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "1"}
    result = subprocess.run([sys.executable, "-c", _CHILD, variant, tree, _ROOT], capture_output=True, text=True,
                            env=env, timeout=600)
    if result.returncode != 0:
        raise RuntimeError(f"{variant}: {result.stderr[-2000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def _summary(name: str, runs: list[dict]) -> str:
    def med(key):
        return statistics.median(r[key] for r in runs)

    def phase(key):
        return statistics.median(r["phases"].get(key, 0.0) for r in runs)

    def waited(r):
        # XLA compiling in the background: the first call waited "xla_wait" of it.
        return r["phases"].get("xla_wait", r["phases"].get("xla_compile", 0.0))

    conv, passes, xla = phase("convert"), phase("passes"), phase("xla_compile")
    dynamo = statistics.median(r["wall"] - r["phases"].get("convert", 0.0) - r["phases"].get("passes", 0.0) - waited(r)
                               for r in runs)
    return (f"{name:<20} wall {med('wall'):6.2f} s (best {min(r['wall'] for r in runs):5.2f}), cpu {med('cpu'):5.2f} s "
            f"(main thread {med('main_cpu'):5.2f} s); Dynamo+AOT+run {dynamo:5.2f} s, convert {conv * 1e3:4.0f} ms, "
            f"passes {passes * 1e3:3.0f} ms, XLA {xla:5.2f} s (waited {statistics.median(waited(r) for r in runs):5.2f} s); "
            f"max|Δ| vs eager {max(r['err'] for r in runs):.1e}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--compare-dynamo-aot-helper", action="store_true")
    parser.add_argument("--baseline", metavar="PATH", help="another source tree of torch_tpu to time alongside")
    args = parser.parse_args(argv)
    variants = ["current"] + (["dynamo-aot-helper"] if args.compare_dynamo_aot_helper else [])
    variants += ["baseline"] if args.baseline else []
    trees = {"baseline": os.path.abspath(args.baseline)} if args.baseline else {}
    runs: dict[str, list[dict]] = {v: [] for v in variants}
    for r in range(args.rounds):
        for v in (variants if r % 2 == 0 else variants[::-1]):  # alternate who goes first
            runs[v].append(_one("current" if v == "baseline" else v, trees.get(v, "")))
    for v in variants:
        package = os.path.join(trees.get(v, _ROOT), "python", "torch_tpu")
        # The backend is a package since the frontend's modules moved into subpackages;
        # an older tree compared against still has it as one module.
        expected = os.path.join(package, "backend", "__init__.py")
        if not os.path.exists(expected):
            expected = os.path.join(package, "backend.py")
        if any(r["source"] != expected for r in runs[v]):
            raise RuntimeError(f"{v}: ran {runs[v][0]['source']}, not {expected}")
    print(f"first call of the quickstart model (TinyGPT, batch 4, seq 64), {args.rounds} fresh process(es) each; "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPU(s)")
    for v in variants:
        print(_summary(v, runs[v]))
    for other in variants[1:]:
        for key in ("wall", "cpu", "main_cpu"):
            a = statistics.median(x[key] for x in runs["current"])
            b = statistics.median(x[key] for x in runs[other])
            print(f"current / {other} ({key}, medians): {a / b:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
