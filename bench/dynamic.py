"""Bounded dynamism: a stream of requests with random sequence lengths through a GPT-style
model (torch_tpu.examples.quickstart.TinyGPT), run by

  (a) torch_tpu with bounds: `mark_dynamic(ids, 1, max=BOUND)`, one compile;
  (b) torch_tpu static: `dynamic=False`, one compile per new length;
  (c) inductor with `dynamic=True`;

reporting compiles and total time of the stream, then the steady-state cost of padding:
the per-call time at length L with bound B (ours, bounded) versus ours compiled statically
at length L, side by side over interleaved rounds.

    .venv/bin/python bench/dynamic.py [--requests 50] [--bound 128] [--skip-inductor]

Goal: one compile for the stream; padded steady state <= 1.3x static at L = B/2.
Not a test: nothing here is asserted.
"""

from __future__ import annotations

import argparse
import logging
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import fmt_ratio, fmt_s, interleaved_timings


def _model(bound: int, d: int, layers: int):
    import torch
    from torch_tpu.examples.quickstart import TinyGPT

    torch.manual_seed(0)
    return TinyGPT(vocab=512, d=d, heads=4, layers=layers, seq=bound).eval()


def _stream(model, compiled, lengths, batch: int, mark_bound: int | None, compiles):
    """Total wall seconds of the stream and the compiles it caused; checks every output
    against eager (max abs difference)."""
    import torch

    before = compiles()
    worst = 0.0
    start = time.perf_counter()
    for n in lengths:
        ids = torch.randint(0, 512, (batch, n))
        if mark_bound is not None:
            torch._dynamo.mark_dynamic(ids, 1, min=1, max=mark_bound)
        with torch.no_grad():
            out = compiled(ids)
        worst = max(worst, (out - model(ids)).abs().max().item())
    total = time.perf_counter() - start
    return total, compiles() - before, worst


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=50)
    p.add_argument("--bound", type=int, default=128)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--d", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--calls", type=int, default=60, help="timed calls per contender (steady state)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--skip-inductor", action="store_true")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.ERROR, format="%(message)s")

    import torch
    import torch._dynamo
    import torch.fx.experimental._config as fx_config
    from torch_tpu.runtime import get_client

    client = get_client()
    compiles = lambda: client.cache.stats.compiles
    rng = random.Random(args.seed)
    lengths = [rng.randint(1, args.bound) for _ in range(args.requests)]
    model = _model(args.bound, args.d, args.layers)
    # Every new length of the static contender is a new Dynamo graph.
    torch._dynamo.config.recompile_limit = max(
        torch._dynamo.config.recompile_limit, 4 * args.requests
    )
    torch._dynamo.config.accumulated_recompile_limit = max(
        torch._dynamo.config.accumulated_recompile_limit, 8 * args.requests
    )

    print(
        f"stream: {args.requests} requests, batch {args.batch}, lengths in [1, {args.bound}] "
        f"({len(set(lengths))} distinct), TinyGPT d={args.d} layers={args.layers}, XLA:{client.platform}"
    )
    rows = []
    with fx_config.patch(backed_size_oblivious=True):
        torch._dynamo.reset()
        client.cache.clear_l1()
        bounded = torch.compile(model, backend="tpu")
        rows.append(
            (
                "torch_tpu, bounded",
                *_stream(model, bounded, lengths, args.batch, args.bound, compiles),
            )
        )
    torch._dynamo.reset()
    client.cache.clear_l1()
    static = torch.compile(model, backend="tpu", dynamic=False)
    rows.append(("torch_tpu, static", *_stream(model, static, lengths, args.batch, None, compiles)))
    if not args.skip_inductor:
        torch._dynamo.reset()
        try:
            inductor = torch.compile(model, backend="inductor", dynamic=True)
            from torch._dynamo.utils import counters

            graphs = counters["stats"]["unique_graphs"]
            total, _, worst = _stream(model, inductor, lengths, args.batch, None, lambda: 0)
            graphs = counters["stats"]["unique_graphs"] - graphs
            rows.append(("inductor, dynamic=True", total, graphs, worst))
        except Exception as err:  # noqa: BLE001 - report, do not crash the benchmark
            print(f"inductor: failed: {type(err).__name__}: {str(err)[:200]}")
    print(f"\n{'contender':26} {'compiles':>9} {'total':>10} {'max |diff| vs eager':>20}")
    for name, total, count, worst in rows:
        print(f"{name:26} {count:>9} {fmt_s(total):>10} {worst:>20.2e}")
    print("(inductor's count is the Dynamo graphs it compiled in the stream)")

    # Steady state at L = bound / 2: padded to the bound vs static at L.
    half = args.bound // 2
    ids = torch.randint(0, 512, (args.batch, half))
    with fx_config.patch(backed_size_oblivious=True):
        torch._dynamo.reset()
        padded_fn = torch.compile(model, backend="tpu")
        marked = ids.clone()
        torch._dynamo.mark_dynamic(marked, 1, min=1, max=args.bound)
        with torch.no_grad():
            padded_fn(marked)
    static_fn = torch.compile(_model(args.bound, args.d, args.layers), backend="tpu", dynamic=False)
    full = torch.randint(0, 512, (args.batch, args.bound))
    with torch.no_grad():
        static_fn(ids)
        static_fn(full)

    def run(fn, x):
        def call():
            with torch.no_grad():
                return fn(x)

        return call

    timings = interleaved_timings(
        {
            "bounded": (run(padded_fn, marked), lambda r: r),
            "static": (run(static_fn, ids), lambda r: r),
            "static_at_bound": (run(static_fn, full), lambda r: r),
        },
        {"bounded": args.calls, "static": args.calls, "static_at_bound": args.calls},
        args.rounds,
    )
    b, s = timings["bounded"].median, timings["static"].median
    print(
        f"\nsteady state at L={half}, bound B={args.bound}: bounded {fmt_s(b)}, static {fmt_s(s)}, "
        f"ratio {fmt_ratio(b, s)} (goal <= 1.30x); CPU time ratio "
        f"{fmt_ratio(timings['bounded'].cpu_median, timings['static'].cpu_median)}"
    )
    full_s = timings["static_at_bound"].median
    print(
        f"  decomposition: computing at the bound, static({args.bound}) / static({half}) = {fmt_ratio(full_s, s)}; "
        f"ours at L={half} / static({args.bound}) = {fmt_ratio(b, full_s)} (the cost of sizes, masks and layout)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
