"""Decode loop with a static KV cache updated in place (`cache[:, :, pos] = k`): torch_tpu's
view passes (`options={"functionalize": "torchtpu"}`) versus aot_autograd's
functionalization, both through backend "tpu" on the same device, side by side.

    .venv/bin/python bench/kv_cache.py [--batch 4] [--heads 8] [--seq 1024] [--dim 64]
                                       [--calls 200] [--rounds 5]

Contenders: the view passes (written caches donated, the default), the view passes with
TORCH_TPU_DONATE_WRITTEN_INPUTS=0 (no donation), and aot_autograd.

Reported per contender:
  * ops in the compiled StableHLO module (TORCH_TPU_DUMP_DIR's final.mlir);
  * from XLA's optimized HLO of that module: donated (input_output_alias) parameters,
    `copy` instructions and the bytes they move, whether the cache update is a
    dynamic-update-slice / scatter on the aliased buffer;
  * host-side bytes copied per step, from the module signature and the runtime's rules:
    each updated cache returned by the module is copied back into the caller's tensor
    (aot_autograd's epilogue, or torch_tpu's write-back of aliased results), and each
    donated argument is first copied into a private device buffer, because XLA:CPU does
    not reuse memory that a torch tensor owns (measured: the donated output is a fresh
    buffer). On an accelerator with device-resident caches neither copy would exist;
  * step time: median wall time per decode step over interleaved rounds, and median
    process CPU time (all threads; less disturbed by other processes on a loaded machine).

Not a test: nothing here is asserted.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
from _common import fmt_ratio, fmt_s, interleaved_timings


class DecodeStep(torch.nn.Module):
    """One attention decode step: project the token, write k/v at `pos` into the static
    caches, attend over the caches."""

    def __init__(self, heads: int, dim: int, update: str, attention: str = "matmul") -> None:
        super().__init__()
        self.heads, self.dim, self.update, self.attention = heads, dim, update, attention
        self.qkv = torch.nn.Linear(heads * dim, 3 * heads * dim)

    def forward(self, x, k_cache, v_cache, pos):
        b = x.shape[0]
        q, k, v = self.qkv(x).view(b, 3, self.heads, 1, self.dim).unbind(1)
        if self.update == "setitem":
            k_cache[:, :, pos] = k
            v_cache[:, :, pos] = v
        elif self.update == "static":
            k_cache[:, :, 5] = k.squeeze(2)
            v_cache[:, :, 5] = v.squeeze(2)
        else:
            k_cache.index_copy_(2, pos, k)
            v_cache.index_copy_(2, pos, v)
        if self.attention == "matmul":
            scores = (q @ k_cache.transpose(-1, -2)) / self.dim**0.5
            return (scores.softmax(-1) @ v_cache).reshape(b, -1)
        # The same attention as broadcast multiply + sum: no bmm reshapes of the cache.
        scores = (q * k_cache).sum(-1) / self.dim**0.5
        return (scores.softmax(-1).unsqueeze(-1) * v_cache).sum(2).reshape(b, -1)


def host_copy_bytes(final_mlir: str, cache_type: str) -> int:
    """Write-back of every returned cache plus the copy-in of every donated argument."""
    signature = final_mlir[final_mlir.index("func.func @main"):]
    signature = signature[: signature.index("{\n")]
    results = signature.rsplit("->", 1)[1]
    written_back = results.count(cache_type)
    donated = signature.count("tf.aliasing_output")
    return (written_back + donated) * _type_bytes(cache_type)


def _type_bytes(tensor_type: str) -> int:
    dims = re.findall(r"(\d+)x", tensor_type)
    n = 1
    for d in dims:
        n *= int(d)
    return n * 4


_COPY = re.compile(r"=\s*(\w+)\[([\d,]*)\][^=]*\scopy\(")
_BYTES = {"f32": 4, "f16": 2, "bf16": 2, "s32": 4, "s64": 8, "pred": 1, "f64": 8}


def hlo_facts(final_mlir: str) -> dict:
    """Facts from XLA's optimized HLO of the module in `final_mlir`."""
    from torch_tpu.runtime import get_client

    exe = get_client().compile(final_mlir)
    hlo = exe._raw.hlo_modules()[0].to_string()
    header = hlo.splitlines()[0]
    aliases = re.findall(r"\((\d+), \{\}, may-alias\)", header)
    copies = _COPY.findall(hlo)
    copy_bytes = 0
    for dtype, dims in copies:
        n = 1
        for d in filter(None, dims.split(",")):
            n *= int(d)
        copy_bytes += n * _BYTES.get(dtype, 4)
    return {
        "donated params": len(aliases),
        "copy instrs": len(copies),
        "copy bytes": copy_bytes,
        "dynamic-update-slice": hlo.count(" dynamic-update-slice("),
        "scatter": hlo.count(" scatter("),
    }


def count_ops(final_mlir: str) -> int:
    return len(re.findall(r"^\s*(?:%\S+ = )?\"?(?:stablehlo|chlo)\.", final_mlir, re.MULTILINE))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--attention", choices=("matmul", "elementwise"), default="matmul",
                        help="q @ k^T / p @ v (bmm of the reshaped caches) or multiply + sum")
    parser.add_argument("--update", choices=("setitem", "index_copy", "static"), default="setitem",
                        help="cache[:, :, pos] = k with a tensor pos (index_put_), cache.index_copy_(2, pos, k), "
                        "or cache[:, :, 5] = k (a static position: select + copy_)")
    args = parser.parse_args()

    dump = tempfile.mkdtemp(prefix="kv_cache_bench_")
    os.environ["TORCH_TPU_DUMP_DIR"] = dump
    torch.manual_seed(0)
    model = DecodeStep(args.heads, args.dim, args.update, args.attention).eval()
    shape = (args.batch, args.heads, args.seq, args.dim)
    cache_bytes = 2 * torch.zeros(shape).numel() * 4
    contenders = {}
    state = {}
    facts = {}
    runs = (
        ("views, donated", {"functionalize": "torchtpu"}, "1"),
        ("views, not donated", {"functionalize": "torchtpu"}, "0"),
        ("aot_autograd", {}, "1"),
    )
    for name, options, donate in runs:
        os.environ["TORCH_TPU_DONATE_WRITTEN_INPUTS"] = donate
        torch._dynamo.reset()
        before = set(os.listdir(dump))
        compiled = torch.compile(model, backend="tpu", options=options)
        k_cache, v_cache = torch.zeros(shape), torch.zeros(shape)
        x = torch.randn(args.batch, args.heads * args.dim)
        pos = torch.tensor([0])
        with torch.no_grad():
            expected_k, expected_v = k_cache.clone(), v_cache.clone()
            ref = model(x, expected_k, expected_v, pos)
            got = compiled(x, k_cache, v_cache, pos)
        ok = all(torch.allclose(a, b, atol=1e-4) for a, b in ((got, ref), (k_cache, expected_k), (v_cache, expected_v)))
        graphs = sorted(set(os.listdir(dump)) - before)
        finals = [Path(dump, g, "final.mlir") for g in graphs if Path(dump, g, "final.mlir").exists()]
        text = finals[-1].read_text() if finals else ""
        facts[name] = {"matches eager": ok, "graphs": len(finals), "ops": count_ops(text), **(hlo_facts(text) if text else {})}
        cache_type = "tensor<" + "x".join(map(str, shape)) + "xf32>"
        facts[name]["host bytes/step"] = host_copy_bytes(text, cache_type) if text else "-"
        state[name] = (compiled, x, k_cache, v_cache, pos)

        def step(name=name):
            c, xx, kc, vc, p = state[name]
            with torch.no_grad():
                return c(xx, kc, vc, p)

        contenders[name] = (step, lambda r: r)

    timings = interleaved_timings(contenders, {n: args.calls for n in contenders}, args.rounds)
    print(f"decode step ({args.attention} attention, update {args.update}), KV caches {list(shape)} x2 "
          f"(f32, {cache_bytes / 2**20:.1f} MiB); "
          f"{args.calls} steps per contender over {args.rounds} interleaved rounds")
    keys = ["matches eager", "graphs", "ops", "donated params", "copy instrs", "copy bytes",
            "dynamic-update-slice", "scatter", "host bytes/step"]
    print(f"{'':24}" + "".join(f"{n:>20}" for n in facts))
    for key in keys:
        print(f"{key:24}" + "".join(f"{facts[n].get(key, '-')!s:>20}" for n in facts))
    print(f"{'step time (median)':24}" + "".join(f"{fmt_s(timings[n].median):>20}" for n in facts))
    print(f"{'step CPU time (median)':24}" + "".join(f"{fmt_s(timings[n].cpu_median):>20}" for n in facts))
    peer = timings["aot_autograd"].median
    for name in ("views, donated", "views, not donated"):
        print(f"step time ratio {name} / aot_autograd: {fmt_ratio(timings[name].median, peer)} "
              f"(CPU time: {fmt_ratio(timings[name].cpu_median, timings['aot_autograd'].cpu_median)})")
    shutil.rmtree(dump, ignore_errors=True)


if __name__ == "__main__":
    main()
