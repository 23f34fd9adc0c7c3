"""SPMD collectives: what `torchtpu-insert-collectives` communicates versus XLA's own
Shardy partitioner for the same shardings, and step time of thin versus embedded
collectives.

    .venv/bin/python bench/spmd.py [--devices 4] [--calls 200] [--rounds 5]

1. For the FSDP MLP and the tensor-parallel transformer block (training steps: forward
   and backward, from bench/../test/python/spmd/spmd_models.py), the single-device
   module with sdy shardings is compiled twice on N virtual CPU devices:
   * ours: torchtpu-insert-collectives -> per-device module, compiled as N replicas;
   * XLA:  the sdy-annotated module itself, compiled with num_partitions=N and
     use_shardy_partitioner (XLA propagates and partitions).
   Both optimized HLOs are read with the same parser: collectives counted by kind, and
   bytes per step = per device, the larger of operand and result of each collective
   (all-gather: the gathered result; reduce-scatter: the operand; all-reduce, all-to-all,
   collective-permute: the operand). Goal: ours <= XLA's bytes.
2. Step time of the TP block on N devices, thin (outlined collective modules run in
   sequence) versus embedded (one module), interleaved rounds, median per step.

Not a test: nothing here is asserted.
"""

from __future__ import annotations

import argparse
import os
import re
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "test", "python", "spmd"))

_COLLECTIVE = re.compile(
    r"=\s*(\([^=]*?\)|[a-z0-9]+\[[0-9,]*\](?:\{[^}]*\})?)\s+"
    r"(all-gather|all-reduce|reduce-scatter|all-to-all|collective-permute)(-start)?\("
)
_SHAPE = re.compile(r"([a-z]+)(\d+)\[([0-9,]*)\]")
_GROUPS = re.compile(r"replica_groups=\{\{([0-9,]*)\}")
_BITS = {"pred": 8}


def _shape_bytes(text: str) -> int:
    total = 0
    for kind, bits, dims in _SHAPE.findall(text):
        n = 1
        for d in dims.split(","):
            if d:
                n *= int(d)
        total += n * max(int(bits), 8) // 8
    return total


def collectives_of(hlo: str) -> dict[str, list[int]]:
    """kind -> bytes of each collective in an optimized HLO module (see the docstring)."""
    found: dict[str, list[int]] = {}
    for line in hlo.splitlines():
        match = _COLLECTIVE.search(line)
        if match is None or "-done" in line:
            continue
        shape, kind = match.group(1), match.group(2)
        size = _shape_bytes(shape)
        if kind == "reduce-scatter":
            groups = _GROUPS.search(line)
            size *= len(groups.group(1).split(",")) if groups else 1
        found.setdefault(kind, []).append(size)
    return found


def _raw_compile_hlo(text: str, n: int, *, partitions: bool) -> str:
    from jaxlib import xla_client
    from torch_tpu.runtime import _jaxlib

    client = _jaxlib.make_cpu_client(n)
    devices = client.devices()[:n]
    opts = xla_client.CompileOptions()
    ids = np.arange(n, dtype=np.int64)
    if partitions:
        opts.num_replicas = 1
        opts.num_partitions = n
        opts.device_assignment = xla_client.DeviceAssignment.create(ids.reshape(1, n))
        build = opts.executable_build_options
        build.use_spmd_partitioning = True
        build.use_shardy_partitioner = True
    else:
        opts.num_replicas = n
        opts.num_partitions = 1
        opts.device_assignment = xla_client.DeviceAssignment.create(ids.reshape(n, 1))
    exe = client.compile_and_load(text, xla_client.DeviceList(tuple(devices)), opts)
    return exe.hlo_modules()[0].to_string()


def _summary(found: dict[str, list[int]]) -> tuple[int, int, str]:
    count = sum(len(v) for v in found.values())
    total = sum(sum(v) for v in found.values())
    kinds = ", ".join(f"{k} x{len(v)}" for k, v in sorted(found.items()))
    return count, total, kinds


def compare_partitioners(n: int) -> None:
    from spmd_models import (
        FSDP_ARGS,
        FSDP_RESULTS,
        TP_BLOCK_ARGS,
        TP_BLOCK_RESULTS,
        block_args,
        block_step,
        mlp_args,
        mlp_step,
        sharded_module,
    )
    from torch_tpu.compiler.diagnostics import DiagnosticEngine
    from torch_tpu.compiler.pipeline import run_pipeline

    cases = {
        "FSDP MLP (batch 64, 16->32->16)": (mlp_step, mlp_args(), FSDP_ARGS, FSDP_RESULTS),
        "TP transformer block (batch 2, seq 8, dim 16, 4 heads)": (block_step, block_args(), TP_BLOCK_ARGS, TP_BLOCK_RESULTS),
        "FSDP MLP (batch 512, 256->1024->256)": (mlp_step, mlp_args(512, 256, 1024), FSDP_ARGS, FSDP_RESULTS),
        "TP transformer block (batch 2, seq 128, dim 256, 4 heads)": (block_step, block_args(128, 256), TP_BLOCK_ARGS, TP_BLOCK_RESULTS),
    }
    print(f"collectives per training step on {n} devices (optimized HLO; bytes per device)")
    print(f"{'model':<56} {'partitioner':<8} {'count':>5} {'bytes':>12}  kinds")
    for name, (step, args, arg_sh, res_sh) in cases.items():
        module = sharded_module(step, args, arg_sh, res_sh, n)
        xla_text = module.operation.get_asm(enable_debug_info=False)
        engine = DiagnosticEngine()
        if not run_pipeline(module.operation, "builtin.module(torchtpu-insert-collectives)", engine):
            print(f"{name}: partitioning failed:\n{engine.format()}")
            continue
        ours_text = module.operation.get_asm(enable_debug_info=False)
        ours = _summary(collectives_of(_raw_compile_hlo(ours_text, n, partitions=False)))
        xla = _summary(collectives_of(_raw_compile_hlo(xla_text, n, partitions=True)))
        print(f"{name:<56} {'ours':<8} {ours[0]:>5} {ours[1]:>12}  {ours[2]}")
        print(f"{'':<56} {'XLA':<8} {xla[0]:>5} {xla[1]:>12}  {xla[2]}")
        ratio = ours[1] / xla[1] if xla[1] else float("inf")
        print(f"{'':<56} {'ratio':<8} {'':>5} {ratio:>12.2f}  (ours / XLA bytes; goal <= 1)")


def thin_vs_embedded(n: int, calls: int, rounds: int) -> None:
    from _common import fmt_s, interleaved_timings
    from spmd_models import TP_BLOCK_ARGS, TP_BLOCK_RESULTS, block_args, block_step, sharded_module
    from torch_tpu.runtime import CacheConfig, Client
    from torch_tpu.spmd import ShardedProgram

    client = Client.create("cpu", num_cpu_devices=n, cache_config=CacheConfig())
    args = block_args(64, 128)
    text = str(sharded_module(block_step, args, TP_BLOCK_ARGS, TP_BLOCK_RESULTS, n))
    programs = {kind: ShardedProgram(text, client=client, thin=kind == "thin") for kind in ("thin", "embedded")}
    per_rank = programs["thin"].shard(args)
    contenders = {kind: (lambda p=p: p.program(per_rank), lambda r: r) for kind, p in programs.items()}
    timings = interleaved_timings(contenders, {k: calls for k in contenders}, rounds)
    thin, embedded = timings["thin"].median, timings["embedded"].median
    stages = len(programs["thin"].program.stages)
    print(f"\nTP transformer block training step (batch 2, seq 64, dim 128) on {n} virtual CPU devices, median of {calls} calls:")
    print(f"  embedded (1 module):          {fmt_s(embedded)}")
    print(f"  thin ({stages} modules in sequence): {fmt_s(thin)}   thin/embedded = {thin / embedded:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=4)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    compare_partitioners(args.devices)
    thin_vs_embedded(args.devices, args.calls, args.rounds)


if __name__ == "__main__":
    main()
