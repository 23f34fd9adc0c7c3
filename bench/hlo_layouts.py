"""Our compiled training step's (or decode step's) program against JAX's, as XLA optimized
them: layout copies, fusions and device time (issue 28; how docs/explanation/performance.md's
twelfth- and fourteenth-session figures were taken).

The step of bench/tpu.py case 7 at `--layers N` (full sizes; `--small` for XLA:CPU) runs
three times under `TORCH_TPU_DUMP_DIR`, which writes the module its deferred trace compiles
(one program: forward, backward, AdamW). That module and JAX's same step (`--jax-flatten`
adds JAX's step with PyTorch's flattening of the rows around each linear layer's product)
are compiled on the same client, and for each this prints the synchronous `copy` ops of
XLA's optimized HLO grouped by result type (layout changes between producers and consumers
that disagree: the copies the `copy-start`/`copy-done` prefetches are not), the fusions by
kind and, with `--profile N`, the device time of N calls (`bench/_xprof.py`). `--modules`
adds `.mlir` files of other variants (another dump, a hand-edited module) to the comparison,
compiled with the arguments our step donates (`--case decode`: its caches); `--mlir-dir`
writes our step's module (`ours.mlir`) to edit into such a variant.
`--case decode` compares case 8's greedy decode step instead (one token at batch 1 against a
static KV cache: ours the module `torch.compile(model.decode)` compiles, JAX's `decode`), its
caches written in place (donated) in both.

`--top N` keeps N ops a contender in the profile (0: every op), and with `--profile` the ops of
ours and JAX's are then compared grouped by what they write (category and largest result, e.g.
`fusion:kOutput [4096,1536]`: the weight gradients with their AdamW update), the groups where the
two differ most first; `--bf16-scores` compiles ours with attention's scores in
bf16 (`torch.backends.cuda.allow_fp16_bf16_reduction_math_sdp(True)`), as JAX's reference
attention computes them. `bench/hlo_fusion.py` then prints a fusion's body from `--hlo-dir`.

    python bench/hlo_layouts.py [--case train|decode] [--small] [--layers 2] [--jax-flatten] [--profile 1]
                                [--top 20] [--bf16-scores] [--modules A.mlir ...] [--hlo-dir DIR]
                                [--mlir-dir DIR] [--json PATH]
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import pathlib
import re
import sys
import tempfile
from collections import Counter
from typing import Any, Callable
from unittest import mock

import numpy as np

import tpu as bench  # bench/tpu.py: the model, both steps, the shared client
from _xprof import brief, profile_calls

_COPY = re.compile(r"^\s*(?:ROOT )?%\S+ = (\S+?)(?:\{[^}]*\})? copy\(")
_FUSION = re.compile(r"\bfusion\(.*\bkind=(k\w+)")


def summarize(hlo: str) -> dict:
    """{"layout_copies": total, "copies_by_type": {type: n}, "fusions": {kind: n}} of an
    optimized HLO module's text."""
    copies: Counter = Counter()
    fusions: Counter = Counter()
    for line in hlo.splitlines():
        if m := _COPY.match(line):
            copies[m.group(1)] += 1
        elif m := _FUSION.search(line):
            fusions[m.group(1)] += 1
    return {"layout_copies": sum(copies.values()), "copies_by_type": dict(copies.most_common()),
            "fusions": dict(fusions)}


def dump_our_step(cfg: Any, batch: int, seq: int) -> str:
    """The MLIR text of the one program our compiled step runs, from TORCH_TPU_DUMP_DIR."""
    import torch

    from torch_tpu.device import _fused

    with tempfile.TemporaryDirectory(prefix="hlo-layouts-") as folder:
        with mock.patch.dict(os.environ, {"TORCH_TPU_DUMP_DIR": folder}):  # (read at each compile)
            model = copy.deepcopy(bench.base_llama(cfg)).to("tpu").train()
            gen = torch.Generator().manual_seed(2)
            ids, tgt = (torch.randint(0, cfg.vocab, (batch, seq), generator=gen).to("tpu") for _ in range(2))
            step, _ = bench._torch_train_step(model, cfg, compile_step=True)
            for _ in range(3):  # the second sighting of the step compiles its one program
                step(ids, tgt).item()
            _fused.wait_for_compiles()
            del model, step
            bench.release()
        traces = sorted(pathlib.Path(folder).glob("fused-*/final.mlir"), key=lambda p: p.stat().st_size)
        if not traces:
            raise RuntimeError(f"the step wrote no fused trace under {folder}: was it deferred into one program?")
        return traces[-1].read_text()


def decode_shapes(cfg: Any, small: bool) -> tuple[int, tuple[int, ...]]:
    """(cache length, one layer's cache shape) of case 8's loop: batch 1, 32 + 96 tokens
    (4 + 8 with --small)."""
    total = 12 if small else 128
    return total, (1, cfg.kv_heads, total, cfg.head_dim)


def dump_our_decode(cfg: Any, small: bool) -> tuple[str, tuple[int, ...]]:
    """The MLIR text of the program `torch.compile(model.decode)` runs per token (case 8),
    and the arguments it donates (its caches: the dump's inputs.json marks them)."""
    import torch

    total, shape = decode_shapes(cfg, small)
    with tempfile.TemporaryDirectory(prefix="hlo-layouts-") as folder:
        with mock.patch.dict(os.environ, {"TORCH_TPU_DUMP_DIR": folder}), torch.no_grad():
            model = copy.deepcopy(bench.base_llama(cfg)).to("tpu")
            step = torch.compile(model.decode, backend="tpu")
            caches = [[torch.zeros(shape, dtype=torch.bfloat16, device="tpu") for _ in range(cfg.layers)]
                      for _ in range(2)]
            tok = torch.zeros((1, 1), dtype=torch.int64).to("tpu")
            for i in range(3):
                _, tok = step(tok, torch.tensor([i]).to("tpu"), caches[0], caches[1])
            tok.cpu()
            del model, step, caches, tok
            bench.release()
        graphs = sorted(pathlib.Path(folder).glob("*decode*/final.mlir"), key=lambda p: p.stat().st_size)
        if not graphs:
            raise RuntimeError(f"the decode step wrote no graph under {folder}")
        inputs = json.loads((graphs[-1].parent / "inputs.json").read_text())
        return graphs[-1].read_text(), tuple(entry["index"] for entry in inputs if entry.get("donated"))


def our_decode_program(cfg: Any, small: bool, positions: int, donated_out: list, mlir_dir: str | None) -> "Program":
    """Our decode step's program, compiled as it ran (its caches donated; their positions are
    appended to `donated_out`, which `--modules` variants of the step donate likewise)."""
    text, donated = dump_our_decode(cfg, small)
    donated_out.extend(donated)
    write_module(mlir_dir, text)
    return our_program(text, "ours", positions, donate=donated)


def write_module(folder: str | None, text: str) -> None:
    """`--mlir-dir`: our step's MLIR module as `ours.mlir`, to edit into a variant for `--modules`."""
    if folder:
        os.makedirs(folder, exist_ok=True)
        pathlib.Path(folder, "ours.mlir").write_text(text)


def our_step_program(cfg: Any, batch: int, seq: int, mlir_dir: str | None) -> "Program":
    """Our training step's one program (dumped), compiled undonated."""
    text = dump_our_step(cfg, batch, seq)
    write_module(mlir_dir, text)
    return our_program(text, "ours", cfg.vocab)


def jax_decode_program(cfg: Any, small: bool) -> "Program":
    """JAX's decode step (bench/tpu.py `jax_llama`), its caches donated as case 8 does."""
    import jax
    import jax.numpy as jnp

    _, shape = decode_shapes(cfg, small)
    params = bench.jax_params(bench.base_llama(cfg))
    _, decode = bench.jax_llama(cfg)
    step = jax.jit(decode, donate_argnums=(3, 4))

    def arguments() -> tuple:
        caches = [[jnp.zeros(shape, jnp.bfloat16) for _ in range(cfg.layers)] for _ in range(2)]
        return params, jnp.zeros((1, 1), jnp.int32), jnp.array([3], jnp.int32), caches[0], caches[1]

    compiled = step.lower(*arguments()).compile()
    return compiled.as_text(), arguments, lambda args: compiled(*args), jax.block_until_ready


# A contender: (optimized HLO text, arguments() -> fresh arguments, run(arguments) -> outputs,
# sync(outputs)). Arguments are made before a profiled call: JAX makes them with programs of
# its own, which would count as device time.
Program = tuple[str, Callable[[], Any], Callable[[Any], Any], Callable[[Any], Any]]


def our_program(text: str, name: str, vocab: int, donate: tuple[int, ...] = ()) -> Program:
    """An MLIR module compiled by our runtime (`donate`: the arguments it donates, as when it
    ran): integer arguments are token ids below `vocab` (or positions: `vocab` is then the
    cache length), the rest zeros."""
    from torch_tpu.runtime import CompileSpec, get_client

    client = get_client()
    executable = client.compile(text, name=name, options=CompileSpec(donate_argnums=donate) if donate else None)
    rng = np.random.default_rng(0)

    def arguments() -> list:
        return [client.to_device(rng.integers(0, vocab, spec.shape).astype(spec.dtype)
                                 if np.issubdtype(spec.dtype, np.integer) else np.zeros(spec.shape, spec.dtype))
                for spec in executable.signature.args]

    def sync(outputs: Any) -> None:
        for buffer in outputs:
            buffer.synchronize()

    return executable._raw.hlo_modules()[0].to_string(), arguments, executable.execute, sync


def jax_program(cfg: Any, batch: int, seq: int, flatten_rows: bool) -> Program:
    """JAX's step (bench/tpu.py), `flatten_rows` as in `jax_llama`."""
    import jax
    import jax.numpy as jnp

    base = bench.base_llama(cfg)
    trainable = [n for n, _ in base.named_parameters()]
    params = {n: bench.bf16_to_jax(t) for n, t in base.named_parameters()}
    consts = {n: bench.bf16_to_jax(b) for n, b in base.named_buffers()}
    step = bench._jax_train_step(cfg, trainable, flatten_rows)
    ids = jnp.asarray(np.random.default_rng(0).integers(0, cfg.vocab, (batch, seq)), jnp.int32)

    def arguments() -> tuple:
        p = {k: jnp.array(a) for k, a in params.items()}  # fresh: the step donates them
        m, v = ({k: jnp.zeros_like(a) for k, a in p.items()} for _ in range(2))
        return p, m, v, jnp.zeros((), jnp.float32), consts, ids, ids

    compiled = step.lower(*arguments()).compile()
    return compiled.as_text(), arguments, lambda args: compiled(*args), jax.block_until_ready


_SHAPE = re.compile(r"\w+\[([\d,]*)\]")


def largest_result(type_text: str) -> str:
    """The dims of the largest array an op writes (`(bf16[1536], f32[4,512], bf16[4,512,1536])`
    -> `[4,512,1536]`): what matches an op of ours with JAX's counterpart when the two write
    different side results (a gradient kept, a row statistic in another dtype)."""
    shapes = _SHAPE.findall(type_text)
    if not shapes:
        return type_text
    return "[" + max(shapes, key=lambda d: np.prod([int(n) for n in d.split(",") if n] or [1])) + "]"


def by_output_type(profile: dict) -> dict[str, list]:
    """{"category [dims]": [ops per call, ms per call]} of a profile's listed ops, grouped by
    their largest result: what the program spends on each kind of result, comparable across
    two programs whose op names differ."""
    groups: dict[str, list] = {}
    for op in profile.get("top_ops", []):
        entry = groups.setdefault(f"{op['category']} {largest_result(op['type'])}", [0.0, 0.0])
        entry[0] += op["count_per_call"]
        entry[1] += op["ms_per_call"]
    return groups


def compare_by_output_type(ours: dict, theirs: dict, rows: int = 25) -> list[tuple[str, list, list]]:
    """(group, ours [n, ms], theirs [n, ms]) for the `rows` groups whose time differs most."""
    mine, other = by_output_type(ours), by_output_type(theirs)
    keys = sorted(set(mine) | set(other), key=lambda k: -abs(mine.get(k, [0, 0])[1] - other.get(k, [0, 0])[1]))
    return [(k, mine.get(k, [0, 0.0]), other.get(k, [0, 0.0])) for k in keys[:rows]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", choices=("train", "decode"), default="train",
                        help="case 7's training step (default) or case 8's decode step")
    parser.add_argument("--small", action="store_true", help="the small config (XLA:CPU smoke runs)")
    parser.add_argument("--layers", type=int, default=2, help="decoder layers (default 2)")
    parser.add_argument("--jax-flatten", action="store_true", help="add JAX's step with PyTorch's flattening")
    parser.add_argument("--modules", nargs="*", default=[], help="more .mlir modules to compile and compare")
    parser.add_argument("--profile", type=int, default=0, metavar="N", help="device time of N calls each")
    parser.add_argument("--top", type=int, default=20, metavar="N",
                        help="ops kept per contender in the profile (0: every op; default 20)")
    parser.add_argument("--bf16-scores", action="store_true",
                        help="ours with attention's scores in bf16 (allow_fp16_bf16_reduction_math_sdp)")
    parser.add_argument("--hlo-dir", help="write each optimized HLO module here")
    parser.add_argument("--mlir-dir", help="write our step's MLIR module here (ours.mlir: edit it into a --modules variant)")
    parser.add_argument("--json", metavar="PATH", help="write the comparison as JSON")
    a = parser.parse_args()

    platform = bench.share_jax_client()
    if a.bf16_scores:
        import torch

        torch.backends.cuda.allow_fp16_bf16_reduction_math_sdp(True)
    cfg = bench.llama_config(a.small, a.layers)
    batch, seq = (2, 16) if a.small else (4, 512)
    donated: list[int] = []  # --case decode: the arguments our step donates (its caches)
    if a.case == "decode":
        total, _ = decode_shapes(cfg, a.small)
        batch, seq = 1, 1
        contenders: dict[str, Callable[[], Program]] = {
            "ours": lambda: our_decode_program(cfg, a.small, total, donated, a.mlir_dir),
            "jax": lambda: jax_decode_program(cfg, a.small),
        }
    else:
        contenders = {
            "ours": lambda: our_step_program(cfg, batch, seq, a.mlir_dir),
            "jax": lambda: jax_program(cfg, batch, seq, False),
        }
    if a.jax_flatten and a.case == "train":
        contenders["jax, rows flattened"] = lambda: jax_program(cfg, batch, seq, True)
    for path in a.modules:  # variants of our step: compiled with its donation, its integers in range
        limit = total if a.case == "decode" else cfg.vocab
        contenders[path] = lambda path=path, limit=limit: our_program(pathlib.Path(path).read_text(), path, limit,
                                                                      donate=tuple(donated))
    what = "decode step" if a.case == "decode" else "training step"
    print(f"{what}, {cfg.layers} layers, batch {batch} x {seq}, on {platform}")
    results = {}
    for name, build in contenders.items():
        hlo, arguments, run, sync = build()
        row = summarize(hlo)
        if a.hlo_dir:
            os.makedirs(a.hlo_dir, exist_ok=True)
            pathlib.Path(a.hlo_dir, re.sub(r"\W+", "_", name).strip("_") + ".hlo.txt").write_text(hlo)
        if a.profile:
            prepared = [arguments() for _ in range(a.profile)]
            for args in prepared:
                sync(args)
            row["profile"] = profile_calls(lambda: run(prepared.pop()), sync, a.profile, top=a.top or None)
        if name in a.modules or name == "ours":
            row["donated"] = list(donated)
        results[name] = row
        top = ", ".join(f"{t} x{n}" for t, n in list(row["copies_by_type"].items())[:6])
        print(f"  {name:24s} layout copies {row['layout_copies']:4d} ({top})  fusions {row['fusions']}")
        if "profile" in row:
            print("        " + brief(row["profile"]).replace("\n", "\n        "))
    if a.profile and "profile" in results.get("ours", {}) and "profile" in results.get("jax", {}):
        listed = f"the top {a.top} ops of each" if a.top else "every op"
        print(f"  {listed} by what it writes, ms per call (ops per call): ours | jax")
        for group, mine, theirs in compare_by_output_type(results["ours"]["profile"], results["jax"]["profile"]):
            print(f"    {mine[1]:8.3f} ({mine[0]:3.0f}) | {theirs[1]:8.3f} ({theirs[0]:3.0f})  {group[:120]}")
    if a.json:
        pathlib.Path(a.json).write_text(json.dumps({"config": {**cfg.__dict__, "case": a.case, "batch": batch, "seq": seq,
                                                               "platform": platform, "bf16_scores": a.bf16_scores},
                                                    "contenders": results},
                                                   indent=1, default=str))


if __name__ == "__main__":
    sys.exit(main())
