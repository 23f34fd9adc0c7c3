"""torch_tpu vs JAX on one TPU chip (issue 28): each case runs ours and `jax.jit` of the
identical computation with identical weights in the same process, on the same PjRT client.

    python bench/tpu.py [--cases 1,2,...] [--json PATH] [--small] [--repeats R]

`--small` shrinks every size so that the whole run takes seconds on XLA:CPU (a smoke run:
its times and MFU mean nothing). Without it the sizes are the issue's, sized for one TPU
v5e chip (15.7 GiB HBM, 197 TFLOP/s bf16 peak; `--peak-tflops` changes the peak).

Cases:
  1 matmul    bf16 4096^3: jax.jit vs eager tpu `a @ a` vs torch.compile(lambda a: a @ a)
  2 mlp       compiled bf16 MLP, 8 x (Linear(4096) + ReLU), batch 2048, tpu tensors
  3 host-mlp  compiled f32 MLP, 4 x Linear(1024) (ReLU between), batch 64, host tensors in
              and out (jax: device_put + np.asarray per call, weights on the device); also
              ours with the model on the device and only x/out crossing
  4 eager-add eager `x + y` on 1k floats, back to back: per-op time vs jnp op by op
  5 transfer  host<->device bandwidth at 1 MB and 256 MB, both directions
  6 prefill   Llama-style decoder (RMSNorm, RoPE, SwiGLU, GQA, bf16, 16 layers,
              d_model 1536, 16 heads / 4 kv heads, vocab 32000: 495 M parameters),
              batch 2 x 2048 tokens, torch.compile on tpu tensors
  7 train     a training step of that model (cross entropy, backward, AdamW, bf16
              parameters), batch 4 x 512 tokens (the AdamW states of ours and of JAX do
              not share the chip: the contenders run one after the other): the whole step
              under torch.compile (in Strict mode, and in FUSED mode: its graphs recorded into
              one program per step), and the eager step in FUSED mode, vs jax.value_and_grad
              + AdamW written in jnp, jitted with the state donated
  8 decode    greedy decoding with a static KV cache (batch 1, 32 prompt + 96 new tokens),
              argmax inside the compiled step: one compiled step per token vs a jitted
              JAX step per token; compiles counted

Conventions:
  * ratio = JAX time / ours: > 1 means ours is faster.
  * time/call: a timed block of N calls (after warm-up) ends with a device sync
    (torch.tpu.synchronize() / block_until_ready); the block's time / N; the median of R
    blocks. Contenders alternate block by block, each block starting once the process's
    other threads are idle (_common.wait_for_idle_threads).
  * FLOPs are model FLOPs counted analytically: 2*m*n*k per matmul; the decoder:
    2 * (parameters outside the embedding table) per token + attention 4 * S * S * d
    per sequence and layer (the full square, not halved for the causal mask); training =
    3 x forward. MFU = FLOPs / time / peak (the bf16 peak, also for the f32 case).
  * bytes/call: host->device and device->host bytes of ours, from the runtime's counters
    (torch_tpu.runtime.transfer_stats(), counted at its gateway to jaxlib), over the
    timed blocks; on XLA:CPU, zero-copy transfers (aliased host memory) count 0 and
    DLPack exports are counted apart. JAX's are by construction (what the case passes).
    Beside them, ours' programs executed per call (programs_per_call: one for a compiled
    call or an eager op on dense tpu tensors, whose storages pass as they are).
  * Correctness first: each case compares ours with JAX (||diff|| / ||jax|| within the
    tolerance, bf16 2e-2 (4e-2 for the 16-layer decoder's logits), f32 3e-3, and
    max |diff| / max |jax| within 5x it; training:
    the first steps' losses and their drop) and prints it; a case that disagrees is marked
    FAILED and the exit status is 1, so a fast wrong answer cannot pass.
  * Each case also reports ours' ops that fell back to PyTorch eager and Dynamo's graph
    breaks (JSON: "fallbacks", "graph_breaks").
  * "host N%": how much of a block's time passed before its last call returned (JSON:
    host_s_per_call). Near 100 %, the calls wait for the host (Python, dispatch); well
    below, for the device (the decode loop was host-bound at 99 % before its written
    inputs were donated, 77 % after, as JAX's). "first call": the host time of a block's
    first call (JSON: first_call_s): the device is idle until that call launches, so each
    block pays it once.
  * The JSON file is rewritten after every case, so a run cut short keeps what it measured;
    `--deadline-s` skips the cases that would start after it.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import platform as _platform
import statistics
import sys
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import fmt_s, wait_for_idle_threads  # noqa: E402

PEAK_TFLOPS_V5E = 197.0
# Relative RMS tolerances; "bf16-deep": the 16-layer decoder's logits, where rounding to
# bf16 at different places (XLA keeps f32 inside fusions where it chooses) compounds over
# the layers: measured 1.1e-2 at 16 layers (d_model 256, XLA:CPU); a wrong mask, rotation
# or missing layer gives 0.3 and more.
TOL = {"bf16": 2e-2, "bf16-deep": 4e-2, "f32": 3e-3}
CASE_NAMES = {1: "matmul", 2: "mlp", 3: "host-mlp", 4: "eager-add", 5: "transfer", 6: "prefill", 7: "train",
              8: "decode"}


# ---------------------------------------------------------------------------------------------
# the shared client and the transfer counter
# ---------------------------------------------------------------------------------------------

def share_jax_client() -> str:
    """Makes JAX's PjRT client the torch_tpu runtime's (`runtime.client.install_client`),
    before torch_tpu makes one: one client per process, so ours and JAX's buffers live on
    the same device through the same client (a second libtpu client in one process is not
    something to count on). Returns the platform."""
    import jax

    from torch_tpu.runtime import client as runtime_client

    device = jax.devices()[0]
    runtime_client.install_client(device.platform, device.client)
    return device.platform


class TransferCounter:
    """Ours' host<->device bytes and program launches, read from the runtime's own
    counters (`torch_tpu.runtime.transfer_stats()`: counted at its one gateway to jaxlib,
    every Client.to_device, argument converter, host copy and launch). JAX's own
    transfers and launches do not pass there, even on a shared client."""

    installed = True

    def snapshot(self) -> tuple[int, ...]:
        """(upload bytes, of them aliased on XLA:CPU, download bytes, DLPack exports, XLA
        compiles of ours -- the runtime cache's statistics: a steady contender compiles
        nothing in its timed blocks -- and programs executed)."""
        from torch_tpu.runtime import get_client, transfer_stats

        s = transfer_stats()
        return (s.upload_bytes, s.aliased_upload_bytes, s.download_bytes, s.dlpack_exports,
                get_client().cache.stats.compiles, s.programs_executed)


COUNTER = TransferCounter()


# ---------------------------------------------------------------------------------------------
# timing, checks, results
# ---------------------------------------------------------------------------------------------

@dataclass
class Contender:
    """One contender of a case: `fn()` runs one call, `sync(result)` waits for it."""

    fn: Callable[[], Any]
    sync: Callable[[Any], Any]
    side: str  # "ours" or "jax"
    flops: float = 0.0  # model FLOPs per call
    jax_bytes: tuple[int, int] | None = None  # JAX: (h2d, d2h) bytes per call, by construction
    extra: dict = field(default_factory=dict)


def torch_sync(_result: Any = None) -> None:
    import torch

    torch.tpu.synchronize()


def jax_sync(result: Any) -> Any:
    import jax

    return jax.block_until_ready(result)


class _CollectorClock:
    """The seconds and collections (per generation) of Python's cyclic garbage collector
    since `reset()`, from `gc.callbacks`: how much of a host-bound contender's time is the
    collector (a FUSED step's was ~13 % before `TORCH_TPU_FUSED_GC_THRESHOLD`)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.collections = [0, 0, 0]
        self._started = 0.0
        gc.callbacks.append(self._on_gc)

    def reset(self) -> None:
        self.seconds = 0.0
        self.collections = [0, 0, 0]

    def _on_gc(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._started
            self.collections[min(info.get("generation", 0), 2)] += 1


_COLLECTOR: list = []  # the one `_CollectorClock`, made by the first timed block


def time_blocks(contenders: dict[str, Contender], calls: int, repeats: int, warmup: int) -> dict[str, dict]:
    """Per contender: the median over `repeats` blocks of the per-call seconds of a block of
    `calls` calls ended by one sync, the blocks' samples, ours' transfer bytes per call, and
    the host's share: the seconds until the block's last call returned, before the sync
    (`host_s_per_call`; near `s_per_call`, the host is what the calls wait for), the
    seconds until the block's first call returned (`first_call_s`: the device idles until
    that call launched, so a block pays it once), and the
    garbage collector's seconds per call and collections per generation in the timed blocks
    (`gc_s_per_call`, `gc_collections`)."""
    if not _COLLECTOR:
        _COLLECTOR.append(_CollectorClock())
    clock = _COLLECTOR[0]
    for c in contenders.values():
        for _ in range(warmup):
            c.sync(c.fn())
    if GC_FREEZE[0]:
        gc.collect()
        gc.freeze()
    samples: dict[str, list[float]] = {name: [] for name in contenders}
    host: dict[str, list[float]] = {name: [] for name in contenders}
    first: dict[str, list[float]] = {name: [] for name in contenders}
    moved = {name: [0] * 6 for name in contenders}
    collected = {name: [0.0, [0, 0, 0]] for name in contenders}
    for _ in range(repeats):
        for name, c in contenders.items():
            wait_for_idle_threads()
            before = COUNTER.snapshot()
            clock.reset()
            t0 = time.perf_counter()
            out = c.fn()
            first_returned = time.perf_counter()
            for _ in range(calls - 1):
                out = c.fn()
            returned = time.perf_counter()
            c.sync(out)
            samples[name].append((time.perf_counter() - t0) / calls)
            host[name].append((returned - t0) / calls)
            first[name].append(first_returned - t0)
            collected[name][0] += clock.seconds
            collected[name][1] = [a + b for a, b in zip(collected[name][1], clock.collections)]
            del out
            for i, (a, b) in enumerate(zip(before, COUNTER.snapshot())):
                moved[name][i] += b - a
    gc.unfreeze()
    rows = {name: _summary(contenders[name], samples[name], moved[name], calls * repeats) for name in contenders}
    for name, row in rows.items():
        row["host_s_per_call"] = statistics.median(host[name])
        row["first_call_s"] = statistics.median(first[name])
        row["gc_s_per_call"] = collected[name][0] / (calls * repeats)
        row["gc_collections"] = collected[name][1]
        if PROFILE_CALLS[0]:
            from _xprof import profile_calls

            row["profile"] = profile_calls(contenders[name].fn, contenders[name].sync, PROFILE_CALLS[0])
    return rows


def time_each(contenders: dict[str, Contender], repeats: int, warmup: int,
              prepare: dict[str, Callable[[], Any]]) -> dict[str, dict]:
    """As `time_blocks` for calls that wait for themselves (transfers): `prepare[name]()`
    (untimed, synced) makes the call's input, then the call alone is timed; median of `repeats`."""
    for name, c in contenders.items():
        for _ in range(warmup):
            c.sync(c.fn(prepare[name]()))
    samples: dict[str, list[float]] = {name: [] for name in contenders}
    moved = {name: [0] * 6 for name in contenders}
    for _ in range(repeats):
        for name, c in contenders.items():
            arg = prepare[name]()
            wait_for_idle_threads()
            before = COUNTER.snapshot()
            t0 = time.perf_counter()
            c.sync(c.fn(arg))
            samples[name].append(time.perf_counter() - t0)
            del arg
            for i, (a, b) in enumerate(zip(before, COUNTER.snapshot())):
                moved[name][i] += b - a
    return {name: _summary(contenders[name], samples[name], moved[name], repeats) for name in contenders}


def _summary(c: Contender, samples: list[float], moved: list[int], calls: int) -> dict:
    s = statistics.median(samples)
    row: dict[str, Any] = {"side": c.side, "s_per_call": s, "samples_s": samples, "flops_per_call": c.flops}
    row["tflops"] = c.flops / s / 1e12 if c.flops and s > 0 else None
    row["mfu"] = row["tflops"] / ARGS_PEAK[0] if row["tflops"] is not None else None
    if c.side == "jax":
        h2d, d2h = c.jax_bytes or (0, 0)
        row.update(h2d_bytes_per_call=h2d, d2h_bytes_per_call=d2h, bytes_counted="by construction")
    else:
        h2d, aliased, d2h, exports, compiles, programs = moved
        row.update(h2d_bytes_per_call=(h2d - aliased) / calls, h2d_aliased_bytes_per_call=aliased / calls,
                   d2h_bytes_per_call=d2h / calls, dlpack_exports_per_call=exports / calls,
                   xla_compiles_in_timed_blocks=compiles, programs_per_call=programs / calls,
                   bytes_counted="runtime counters")
    row.update(c.extra)
    return row


ARGS_PEAK = [PEAK_TFLOPS_V5E]
PROFILE_CALLS = [0]  # --profile N: N more calls of each contender under jax.profiler (0: none)
GC_FREEZE = [False]  # --gc-freeze: gc.freeze() after the warm-up calls of time_blocks


def to_f32(value: Any) -> Any:
    """A float64 NumPy array of a torch tensor (any device) or JAX array."""
    import numpy as np

    if hasattr(value, "detach"):
        import torch

        return value.detach().to("cpu").to(torch.float64).numpy()
    return np.asarray(value).astype(np.float64)


def compare(ours: Any, ref: Any, kind: str) -> dict:
    """Ours against JAX's value: rel_rms = ||ours - ref|| / ||ref|| must be within the
    tolerance of `kind` ("bf16", "f32"), and rel_err = max |ours - ref| / max |ref|
    within 5x it (one element far off fails even when the rest agree). The RMS is the
    gate of the deep bf16 models, whose largest element difference over 10^8 logits sits
    in the tail of the rounding noise; a wrong answer gives ~1."""
    import numpy as np

    a, b = to_f32(ours), to_f32(ref)
    if a.shape != b.shape:
        return {"max_abs_err": None, "rel_err": None, "rel_rms": None, "tol": TOL[kind], "ok": False,
                "why": f"shape {list(a.shape)} vs jax {list(b.shape)}"}
    if not a.size:
        return {"max_abs_err": 0.0, "rel_err": 0.0, "rel_rms": 0.0, "tol": TOL[kind], "ok": True}
    diff = np.abs(a - b)
    err, scale = float(diff.max()), float(np.abs(b).max())
    rel = err / scale if scale > 0 else err
    norm = float(np.sqrt(np.mean(b * b)))
    rms = float(np.sqrt(np.mean(diff * diff)))
    rel_rms = rms / norm if norm > 0 else rms
    ok = bool(np.isfinite(a).all()) and rel_rms <= TOL[kind] and rel <= 5 * TOL[kind]
    return {"max_abs_err": err, "rel_err": rel, "rel_rms": rel_rms, "tol": TOL[kind], "ok": ok}


def seconds(fn: Callable[[], Any]) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def bf16_to_jax(t: Any) -> Any:
    """A JAX device array with the exact value of a CPU torch tensor (bf16 through
    float32, which holds every bf16 value)."""
    import jax
    import jax.numpy as jnp
    import torch

    if t.dtype == torch.bfloat16:
        return jax.device_put(t.detach().float().numpy()).astype(jnp.bfloat16)
    return jax.device_put(t.detach().contiguous().numpy())


def jax_precision() -> str:
    """JAX's matmul precision equal to the one ours runs float32 matmuls at (PyTorch's
    float32_matmul_precision: medium -> DEFAULT, high -> HIGH, highest -> HIGHEST)."""
    from torch_tpu.program.precision import current_mode

    return {"medium": "default", "high": "high", "highest": "highest"}[current_mode()]


# ---------------------------------------------------------------------------------------------
# cases 1-5: matmul, MLPs, eager op, transfers
# ---------------------------------------------------------------------------------------------

def case_matmul(small: bool, reps: dict, options: dict) -> dict:
    import jax
    import torch

    n = 256 if small else 4096
    torch.manual_seed(0)
    a_cpu = torch.randn(n, n).to(torch.bfloat16)
    a = a_cpu.to("tpu")
    a_j = bf16_to_jax(a_cpu)
    jitted = jax.jit(lambda x: x @ x)
    compiled = torch.compile(lambda x: x @ x, backend="tpu")
    flops = 2.0 * n**3
    ref = jitted(a_j)
    checks = {"eager tpu": compare(a @ a, ref, "bf16"), "torch.compile": compare(compiled(a), ref, "bf16")}
    contenders = {
        "jax.jit": Contender(lambda: jitted(a_j), jax_sync, "jax", flops),
        "eager tpu": Contender(lambda: a @ a, torch_sync, "ours", flops),
        "torch.compile": Contender(lambda: compiled(a), torch_sync, "ours", flops),
    }
    rows = time_blocks(contenders, reps["calls"], reps["repeats"], warmup=2)
    return {"config": {"n": n, "dtype": "bfloat16"}, "checks": checks, "contenders": rows}


def _mlp(width: int, layers: int, relu_last: bool, dtype: Any) -> Any:
    import torch.nn as nn

    mods: list[Any] = []
    for i in range(layers):
        mods.append(nn.Linear(width, width))
        if relu_last or i < layers - 1:
            mods.append(nn.ReLU())
    return nn.Sequential(*mods).to(dtype)


def _jax_mlp(relu_last: bool, precision: str | None = None) -> Callable:
    import jax.numpy as jnp

    def forward(params, x):
        for i, (w, b) in enumerate(params):
            x = jnp.matmul(x, w.T, precision=precision) + b
            if relu_last or i < len(params) - 1:
                x = jnp.maximum(x, 0)
        return x

    return forward


def _mlp_params(model: Any) -> list:
    import torch.nn as nn

    return [(bf16_to_jax(m.weight), bf16_to_jax(m.bias)) for m in model if isinstance(m, nn.Linear)]


def case_mlp(small: bool, reps: dict, options: dict) -> dict:
    import jax
    import torch

    width, layers, batch = (128, 8, 64) if small else (4096, 8, 2048)
    torch.manual_seed(0)
    model = _mlp(width, layers, relu_last=True, dtype=torch.bfloat16)
    x_cpu = torch.randn(batch, width).to(torch.bfloat16)
    params, x_j = _mlp_params(model), bf16_to_jax(x_cpu)
    jitted = jax.jit(_jax_mlp(relu_last=True))
    model = model.to("tpu")
    x = x_cpu.to("tpu")
    compiled = torch.compile(model, backend="tpu")
    flops = 2.0 * batch * width * width * layers
    with torch.no_grad():
        checks = {"torch.compile": compare(compiled(x), jitted(params, x_j), "bf16")}
        contenders = {
            "jax.jit": Contender(lambda: jitted(params, x_j), jax_sync, "jax", flops),
            "torch.compile": Contender(lambda: compiled(x), torch_sync, "ours", flops),
        }
        rows = time_blocks(contenders, reps["calls"], reps["repeats"], warmup=2)
    return {"config": {"width": width, "layers": layers, "batch": batch, "dtype": "bfloat16"}, "checks": checks,
            "contenders": rows}


def case_host_mlp(small: bool, reps: dict, options: dict) -> dict:
    import jax
    import numpy as np
    import torch

    width, layers, batch = (128, 4, 16) if small else (1024, 4, 64)
    torch.manual_seed(0)
    model = _mlp(width, layers, relu_last=False, dtype=torch.float32)
    xs = [torch.randn(batch, width) for _ in range(4)]  # a new host batch each call
    xs_np = [x.numpy() for x in xs]
    params = _mlp_params(model)
    precision = jax_precision()
    jitted = jax.jit(_jax_mlp(relu_last=False, precision=precision))
    compiled = torch.compile(model, backend="tpu")
    on_device = torch.compile(_mlp(width, layers, relu_last=False, dtype=torch.float32).to("tpu"), backend="tpu")
    on_device._orig_mod.load_state_dict(model.state_dict())
    turn = [0]

    def nxt() -> int:
        turn[0] = (turn[0] + 1) % len(xs)
        return turn[0]

    def jax_call():
        return np.asarray(jitted(params, jax.device_put(xs_np[nxt()])))

    flops = 2.0 * batch * width * width * layers
    io = batch * width * 4
    with torch.no_grad():
        ref = np.asarray(jitted(params, jax.device_put(xs_np[0])))
        checks = {"torch.compile, host model": compare(compiled(xs[0]), ref, "f32"),
                  "torch.compile, tpu model": compare(on_device(xs[0].to("tpu")).cpu(), ref, "f32")}
        contenders = {
            "jax.jit": Contender(jax_call, lambda r: r, "jax", flops, jax_bytes=(io, io)),
            "torch.compile, host model": Contender(lambda: compiled(xs[nxt()]), lambda r: r, "ours", flops),
            "torch.compile, tpu model": Contender(lambda: on_device(xs[nxt()].to("tpu")).cpu(), lambda r: r, "ours",
                                                  flops),
        }
        rows = time_blocks(contenders, reps["calls"] * 5, reps["repeats"], warmup=3)
    return {"config": {"width": width, "layers": layers, "batch": batch, "dtype": "float32",
                       "jax_precision": precision, "x_and_out_bytes": io,
                       "weights_bytes": sum(p.numel() * 4 for p in model.parameters())},
            "checks": checks, "contenders": rows}


def case_eager_add(small: bool, reps: dict, options: dict) -> dict:
    import jax
    import torch

    n = 1000
    torch.manual_seed(0)
    x_cpu, y_cpu = torch.randn(n), torch.randn(n)
    x, y = x_cpu.to("tpu"), y_cpu.to("tpu")
    x_j, y_j = jax.device_put(x_cpu.numpy()), jax.device_put(y_cpu.numpy())
    checks = {"eager tpu": compare(x + y, x_j + y_j, "f32")}
    contenders = {
        "jnp op by op": Contender(lambda: x_j + y_j, jax_sync, "jax"),
        "eager tpu": Contender(lambda: x + y, torch_sync, "ours"),
    }
    rows = time_blocks(contenders, reps["calls"] * 50, reps["repeats"], warmup=20)
    return {"config": {"n": n, "dtype": "float32", "ops_per_block": reps["calls"] * 50}, "checks": checks,
            "contenders": rows}


def case_transfer(small: bool, reps: dict, options: dict) -> dict:
    import jax
    import numpy as np
    import torch

    sizes = (64 << 10, 1 << 20) if small else (1 << 20, 256 << 20)
    rows: dict[str, dict] = {}
    checks: dict[str, dict] = {}
    pairs: dict[str, str] = {}  # ours -> the JAX contender it is compared with
    config: dict[str, Any] = {"sizes_bytes": list(sizes), "dtype": "float32"}
    copy = jax.jit(lambda a, s: a * s)  # a fresh device value per call (the scale is an argument)
    one_j = jax.device_put(np.float32(1.0))
    for size in sizes:
        label = f"{size >> 20} MB" if size >= 1 << 20 else f"{size >> 10} KB"
        host = torch.randn(size // 4)
        host_np = host.numpy()
        src = host.to("tpu")
        src_j = jax.device_put(host_np)
        one = torch.ones((), device="tpu")
        checks[f"h2d {label}"] = compare(host.to("tpu"), jax.device_put(host_np), "f32")
        checks[f"d2h {label}"] = compare((src * one).cpu(), np.asarray(copy(src_j, one_j)), "f32")
        repeats = reps["repeats"] * 2

        def fresh_torch():
            t = src * one
            torch.tpu.synchronize()
            return t

        def fresh_jax():
            return copy(src_j, one_j).block_until_ready()

        h2d = {
            f"h2d {label} jax.device_put": Contender(lambda _: jax.device_put(host_np), jax_sync, "jax",
                                                     jax_bytes=(size, 0), extra={"bytes": size}),
            f"h2d {label} t.to('tpu')": Contender(lambda _: host.to("tpu"), torch_sync, "ours",
                                                  extra={"bytes": size}),
        }
        d2h = {
            f"d2h {label} np.asarray": Contender(lambda a: np.asarray(a), lambda r: r, "jax", jax_bytes=(0, size),
                                                 extra={"bytes": size}),
            f"d2h {label} t.cpu()": Contender(lambda t: t.cpu(), lambda r: r, "ours", extra={"bytes": size}),
        }
        names = list(h2d) + list(d2h)
        pairs[names[1]], pairs[names[3]] = names[0], names[2]
        none = dict.fromkeys(h2d, lambda: None)
        rows.update(time_each(h2d, repeats, 2, none))
        rows.update(time_each(d2h, repeats, 2, dict(zip(d2h, (fresh_jax, fresh_torch)))))
        del src, src_j, host, host_np
        gc.collect()
    for row in rows.values():
        row["GB_per_s"] = row["bytes"] / row["s_per_call"] / 1e9
    return {"config": config, "checks": checks, "contenders": rows, "pairs": pairs}


# ---------------------------------------------------------------------------------------------
# the Llama-style decoder, in torch and in jax.numpy (the same weights, by state_dict name)
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class LlamaConfig:
    vocab: int = 32000
    d_model: int = 1536
    layers: int = 16
    heads: int = 16
    kv_heads: int = 4
    ffn: int = 4096
    max_seq: int = 2048
    eps: float = 1e-5
    rope_theta: float = 10000.0

    @property
    def head_dim(self) -> int:
        return self.d_model // self.heads

    def params(self) -> int:
        d, kv = self.d_model, self.kv_heads * self.head_dim
        per_layer = 2 * d * d + 2 * d * kv + 3 * d * self.ffn + 2 * d
        return 2 * self.vocab * d + self.layers * per_layer + d

    def matmul_params(self) -> int:
        """Parameters that multiply every token (all but the embedding table and the norms)."""
        d, kv = self.d_model, self.kv_heads * self.head_dim
        return self.vocab * d + self.layers * (2 * d * d + 2 * d * kv + 3 * d * self.ffn)

    def forward_flops(self, batch: int, seq: int) -> float:
        """2 * matmul parameters per token + attention (QK^T and PV over the full S x S)."""
        return 2.0 * self.matmul_params() * batch * seq + 4.0 * batch * seq * seq * self.d_model * self.layers

    def decode_flops(self, batch: int, context: int) -> float:
        """One token per sequence attending over `context` cached positions."""
        return 2.0 * self.matmul_params() * batch + 4.0 * batch * context * self.d_model * self.layers


SMALL_LLAMA = LlamaConfig(vocab=256, d_model=64, layers=2, heads=4, kv_heads=2, ffn=128, max_seq=64)


def torch_llama(cfg: LlamaConfig) -> Any:
    """The decoder as a torch nn.Module (bf16 after `.to(torch.bfloat16)`): `forward(ids)`
    (prefill / training logits) and `decode(ids, pos, k_caches, v_caches)` (one token per
    sequence at position `pos`, a 1-element int64 tensor; the caches are written in place;
    returns the logits and the greedy next token)."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    class RMSNorm(nn.Module):
        def __init__(self, d: int) -> None:
            super().__init__()
            self.weight = nn.Parameter(torch.ones(d))

        def forward(self, x):
            h = x.float()
            h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + cfg.eps)
            return self.weight * h.to(x.dtype)

    def rotate(x, cos, sin):
        x1, x2 = x.chunk(2, dim=-1)
        return x * cos + torch.cat((-x2, x1), dim=-1) * sin

    class Attention(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            d, hd = cfg.d_model, cfg.head_dim
            self.wq = nn.Linear(d, cfg.heads * hd, bias=False)
            self.wk = nn.Linear(d, cfg.kv_heads * hd, bias=False)
            self.wv = nn.Linear(d, cfg.kv_heads * hd, bias=False)
            self.wo = nn.Linear(cfg.heads * hd, d, bias=False)

        def project(self, x, cos, sin):
            b, s, _ = x.shape
            hd = cfg.head_dim
            q = self.wq(x).view(b, s, cfg.heads, hd).transpose(1, 2)
            k = self.wk(x).view(b, s, cfg.kv_heads, hd).transpose(1, 2)
            v = self.wv(x).view(b, s, cfg.kv_heads, hd).transpose(1, 2)
            return rotate(q, cos, sin), rotate(k, cos, sin), v

        @staticmethod
        def expand(kv):  # grouped-query attention: each kv head serves heads/kv_heads query heads
            b, h, s, hd = kv.shape
            rep = cfg.heads // cfg.kv_heads
            return kv[:, :, None].expand(b, h, rep, s, hd).reshape(b, h * rep, s, hd)

        def forward(self, x, cos, sin):
            b, s, _ = x.shape
            q, k, v = self.project(x, cos, sin)
            o = F.scaled_dot_product_attention(q, self.expand(k), self.expand(v), is_causal=True)
            return self.wo(o.transpose(1, 2).reshape(b, s, -1))

        def decode(self, x, cos, sin, pos, k_cache, v_cache):
            b = x.shape[0]
            q, k, v = self.project(x, cos, sin)
            k_cache.index_copy_(2, pos, k)
            v_cache.index_copy_(2, pos, v)
            scores = (q @ self.expand(k_cache).transpose(-1, -2)).float() / math.sqrt(cfg.head_dim)
            visible = torch.arange(k_cache.shape[2], device=x.device) <= pos
            probs = scores.masked_fill(~visible, float("-inf")).softmax(-1).to(x.dtype)
            return self.wo((probs @ self.expand(v_cache)).transpose(1, 2).reshape(b, 1, -1))

    class MLP(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.gate = nn.Linear(cfg.d_model, cfg.ffn, bias=False)
            self.up = nn.Linear(cfg.d_model, cfg.ffn, bias=False)
            self.down = nn.Linear(cfg.ffn, cfg.d_model, bias=False)

        def forward(self, x):
            return self.down(F.silu(self.gate(x)) * self.up(x))

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.attn_norm, self.attn = RMSNorm(cfg.d_model), Attention()
            self.mlp_norm, self.mlp = RMSNorm(cfg.d_model), MLP()

        def forward(self, x, cos, sin):
            x = x + self.attn(self.attn_norm(x), cos, sin)
            return x + self.mlp(self.mlp_norm(x))

        def decode(self, x, cos, sin, pos, k_cache, v_cache):
            x = x + self.attn.decode(self.attn_norm(x), cos, sin, pos, k_cache, v_cache)
            return x + self.mlp(self.mlp_norm(x))

    class Llama(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(cfg.vocab, cfg.d_model)
            self.layers = nn.ModuleList(Block() for _ in range(cfg.layers))
            self.norm = RMSNorm(cfg.d_model)
            self.lm_head = nn.Linear(cfg.d_model, cfg.vocab, bias=False)
            cos, sin = rope_tables(cfg)
            self.register_buffer("rope_cos", torch.from_numpy(cos), persistent=False)
            self.register_buffer("rope_sin", torch.from_numpy(sin), persistent=False)

        def forward(self, ids):
            s = ids.shape[1]
            cos, sin = self.rope_cos[:s], self.rope_sin[:s]
            x = self.embed(ids)
            for layer in self.layers:
                x = layer(x, cos, sin)
            return self.lm_head(self.norm(x))

        def decode(self, ids, pos, k_caches, v_caches):
            cos, sin = self.rope_cos.index_select(0, pos), self.rope_sin.index_select(0, pos)
            x = self.embed(ids)
            for layer, k_cache, v_cache in zip(self.layers, k_caches, v_caches):
                x = layer.decode(x, cos, sin, pos, k_cache, v_cache)
            logits = self.lm_head(self.norm(x))
            return logits, logits.argmax(-1)

    return Llama()


def rope_tables(cfg: LlamaConfig) -> tuple[Any, Any]:
    """cos and sin, [max_seq, head_dim] float32 (the rotate-half layout); buffers of the
    module, so they become bf16 with it (as the activations they multiply)."""
    import numpy as np

    inv = 1.0 / cfg.rope_theta ** (np.arange(0, cfg.head_dim, 2, dtype=np.float64) / cfg.head_dim)
    angles = np.outer(np.arange(cfg.max_seq, dtype=np.float64), inv)
    angles = np.concatenate([angles, angles], axis=-1)
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


def jax_params(model: Any) -> dict:
    """The model's parameters and buffers as JAX device arrays, by state_dict name (bf16
    stays bf16, exactly)."""
    named = list(model.named_parameters()) + list(model.named_buffers())
    return {name: bf16_to_jax(t) for name, t in named}


def jax_llama(cfg: LlamaConfig, flatten_rows: bool = False) -> tuple[Callable, Callable]:
    """(forward(params, ids) -> logits, decode(params, ids, pos, k_caches, v_caches) ->
    (logits, next ids, k_caches, v_caches)): the torch module's computation in jax.numpy.
    `flatten_rows`: each linear layer flattens its input's leading dims around a 2-D
    product, as PyTorch's `nn.Linear` does (`bench/hlo_layouts.py` compares the layouts)."""
    import jax
    import jax.numpy as jnp

    hd, rep = cfg.head_dim, cfg.heads // cfg.kv_heads

    def linear(p, name, x):
        if flatten_rows:
            return (x.reshape(-1, x.shape[-1]) @ p[name + ".weight"].T).reshape(*x.shape[:-1], -1)
        return x @ p[name + ".weight"].T

    def rms(p, name, x):
        h = x.astype(jnp.float32)
        h = h * jax.lax.rsqrt(jnp.mean(h * h, axis=-1, keepdims=True) + cfg.eps)
        return p[name + ".weight"] * h.astype(x.dtype)

    def rotate(x, cos, sin):
        x1, x2 = jnp.split(x, 2, axis=-1)
        return x * cos + jnp.concatenate([-x2, x1], axis=-1) * sin

    def project(p, pre, x, cos, sin):
        b, s, _ = x.shape
        q = linear(p, pre + "wq", x).reshape(b, s, cfg.heads, hd).transpose(0, 2, 1, 3)
        k = linear(p, pre + "wk", x).reshape(b, s, cfg.kv_heads, hd).transpose(0, 2, 1, 3)
        v = linear(p, pre + "wv", x).reshape(b, s, cfg.kv_heads, hd).transpose(0, 2, 1, 3)
        return rotate(q, cos, sin), rotate(k, cos, sin), v

    def attend(q, k, v, mask):
        k, v = jnp.repeat(k, rep, axis=1), jnp.repeat(v, rep, axis=1)
        scores = (q @ k.swapaxes(-1, -2)).astype(jnp.float32) / math.sqrt(hd)
        probs = jax.nn.softmax(jnp.where(mask, scores, -jnp.inf), axis=-1).astype(v.dtype)
        return probs @ v

    def mlp(p, pre, x):
        return linear(p, pre + "down", jax.nn.silu(linear(p, pre + "gate", x)) * linear(p, pre + "up", x))

    def forward(p, ids):
        b, s = ids.shape
        cos, sin = p["rope_cos"][:s], p["rope_sin"][:s]
        x = p["embed.weight"][ids]
        causal = jnp.tril(jnp.ones((s, s), dtype=bool))
        for i in range(cfg.layers):
            pre = f"layers.{i}."
            q, k, v = project(p, pre + "attn.", rms(p, pre + "attn_norm", x), cos, sin)
            o = attend(q, k, v, causal)
            x = x + linear(p, pre + "attn.wo", o.transpose(0, 2, 1, 3).reshape(b, s, -1))
            x = x + mlp(p, pre + "mlp.", rms(p, pre + "mlp_norm", x))
        return linear(p, "lm_head", rms(p, "norm", x))

    def decode(p, ids, pos, k_caches, v_caches):
        b = ids.shape[0]
        cos = jax.lax.dynamic_slice_in_dim(p["rope_cos"], pos[0], 1)
        sin = jax.lax.dynamic_slice_in_dim(p["rope_sin"], pos[0], 1)
        x = p["embed.weight"][ids]
        new_k, new_v = [], []
        for i in range(cfg.layers):
            pre = f"layers.{i}."
            q, k, v = project(p, pre + "attn.", rms(p, pre + "attn_norm", x), cos, sin)
            kc = jax.lax.dynamic_update_slice_in_dim(k_caches[i], k, pos[0], axis=2)
            vc = jax.lax.dynamic_update_slice_in_dim(v_caches[i], v, pos[0], axis=2)
            new_k.append(kc)
            new_v.append(vc)
            visible = jnp.arange(kc.shape[2]) <= pos[0]
            o = attend(q, kc, vc, visible)
            x = x + linear(p, pre + "attn.wo", o.transpose(0, 2, 1, 3).reshape(b, 1, -1))
            x = x + mlp(p, pre + "mlp.", rms(p, pre + "mlp_norm", x))
        logits = linear(p, "lm_head", rms(p, "norm", x))
        return logits, jnp.argmax(logits, axis=-1), new_k, new_v

    return forward, decode


# ---------------------------------------------------------------------------------------------
# cases 6-8: the decoder's prefill, training step and greedy decoding
# ---------------------------------------------------------------------------------------------

_BASE: dict = {}


def llama_config(small: bool, layers: int | None) -> LlamaConfig:
    cfg = SMALL_LLAMA if small else LlamaConfig()
    if layers:
        cfg = LlamaConfig(**{**cfg.__dict__, "layers": layers})
    return cfg


def base_llama(cfg: LlamaConfig) -> Any:
    """The bf16 model on the CPU with seeded random weights, built once per process;
    cases take deep copies (`.to("tpu")` moves a module in place)."""
    import torch

    if _BASE.get("cfg") != cfg:
        _BASE.clear()
        torch.manual_seed(0)
        _BASE["cfg"], _BASE["model"] = cfg, torch_llama(cfg).to(torch.bfloat16).eval()
    return _BASE["model"]


def first_call(fn: Callable[[], Any], sync: Callable[[Any], Any]) -> tuple[float, Any]:
    """Seconds of a first call (trace + compile + run) and its result."""
    t0 = time.perf_counter()
    out = fn()
    sync(out)
    return time.perf_counter() - t0, out


def case_prefill(small: bool, reps: dict, options: dict) -> dict:
    import copy

    import jax
    import jax.numpy as jnp
    import torch

    cfg = llama_config(small, options.get("layers"))
    batch, seq = (1, 32) if small else (2, 2048)
    base = base_llama(cfg)
    params = jax_params(base)
    forward, _ = jax_llama(cfg)
    jitted = jax.jit(forward)
    model = copy.deepcopy(base).to("tpu")
    compiled = torch.compile(model, backend="tpu")
    ids_cpu = torch.randint(0, cfg.vocab, (batch, seq), generator=torch.Generator().manual_seed(1))
    ids, ids_j = ids_cpu.to("tpu"), jax.device_put(ids_cpu.numpy().astype("int32"))
    flops = cfg.forward_flops(batch, seq)
    with torch.no_grad():
        t_jax, ref = first_call(lambda: jitted(params, ids_j), jax_sync)
        t_ours, out = first_call(lambda: compiled(ids), torch_sync)
        checks = {"torch.compile": compare(out, ref, "bf16-deep")}
        del out, ref
        contenders = {
            "jax.jit": Contender(lambda: jitted(params, ids_j), jax_sync, "jax", flops,
                                 extra={"first_call_s": t_jax}),
            "torch.compile": Contender(lambda: compiled(ids), torch_sync, "ours", flops,
                                       extra={"first_call_s": t_ours}),
        }
        rows = time_blocks(contenders, reps["calls_big"], reps["repeats_big"], warmup=1)
    del jnp
    return {"config": {**cfg.__dict__, "params": cfg.params(), "batch": batch, "seq": seq, "dtype": "bfloat16"},
            "checks": checks, "contenders": rows}


def _torch_train_step(model: Any, cfg: LlamaConfig, compile_step: bool,
                      grads_kept: bool = False) -> tuple[Callable, str]:
    """(step(ids, targets) -> loss, how it is compiled): the user's training step, AdamW on
    the bf16 parameters; the whole step (optimizer included) under torch.compile when
    `compile_step`, else eager (the FUSED contender). Its gradients are dropped after
    `opt.step()` (`zero_grad(set_to_none=True)` at the step's end: the order of PyTorch's
    tutorial, nanoGPT and the Hugging Face Trainer), as JAX's step keeps none; `grads_kept`
    drops them at the next step's start instead (torchtitan's order), so each step's
    gradients stay readable after it: the step's program then writes them too (one more
    output per parameter, written from the matrix products that compute them)."""
    import torch
    import torch.nn.functional as F

    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)

    def make(forward: Callable) -> Callable:
        def step(ids, targets):
            if grads_kept:
                opt.zero_grad(set_to_none=True)
            logits = forward(ids)
            loss = F.cross_entropy(logits.float().view(-1, cfg.vocab), targets.view(-1))
            loss.backward()
            opt.step()
            if not grads_kept:
                opt.zero_grad(set_to_none=True)
            return loss.detach()

        return step

    if not compile_step:
        return make(model), "eager"
    return torch.compile(make(model), backend="tpu"), "whole step (forward, backward, AdamW) compiled"


def _jax_train_step(cfg: LlamaConfig, trainable: list[str], flatten_rows: bool = False) -> Callable:
    """jax.value_and_grad of the same loss + AdamW as torch.optim.AdamW computes it (states
    in the parameters' dtype, bias corrections, decoupled weight decay), jitted with the
    parameters and states donated. `flatten_rows`: see `jax_llama`."""
    import jax
    import jax.numpy as jnp

    forward, _ = jax_llama(cfg, flatten_rows)
    lr, b1, b2, eps, wd = 1e-3, 0.9, 0.95, 1e-8, 0.1

    def loss_fn(p, consts, ids, targets):
        logits = forward({**p, **consts}, ids).astype(jnp.float32).reshape(-1, cfg.vocab)
        logz = jax.nn.logsumexp(logits, axis=-1)
        picked = jnp.take_along_axis(logits, targets.reshape(-1, 1), axis=-1)[:, 0]
        return jnp.mean(logz - picked)

    def step(p, m, v, t, consts, ids, targets):
        loss, g = jax.value_and_grad(loss_fn)(p, consts, ids, targets)
        t = t + 1
        c1, c2 = 1 - b1 ** t, 1 - b2 ** t
        new_p, new_m, new_v = {}, {}, {}
        for k in trainable:
            mk = m[k] + (g[k] - m[k]) * (1 - b1)
            vk = v[k] * b2 + g[k] * g[k] * (1 - b2)
            pk = p[k] * (1 - lr * wd)
            denom = (jnp.sqrt(vk) / jnp.sqrt(c2)).astype(vk.dtype) + eps
            new_p[k] = (pk - (lr / c1) * (mk / denom)).astype(p[k].dtype)
            new_m[k], new_v[k] = mk, vk
        return loss, new_p, new_m, new_v, t

    return jax.jit(step, donate_argnums=(0, 1, 2))


# What case 7's contenders set to pick their variant (`case_train.run_ours`), unset after each.
_TRAIN_VARIANT_VARIABLES = ("TORCH_TPU_FUSE_COMPILED_STEP", "TORCH_TPU_COMPILED_STEP_START",
                            "TORCH_TPU_EARLY_STEP_LAUNCH", "TORCH_TPU_ATTENTION_KERNEL")


def _progress(name: str, row: dict, first_s: float) -> None:
    """One contender's time as soon as it is measured (the case's table comes at its end): a
    run cut short by its time limit -- each variant of case 7 compiles the whole step, ~200 s
    at 16 layers on the chip -- still says what it measured."""
    print(f"    .. {name}: {fmt_s(row['s_per_call'])} a step (first {first_s:.1f} s incl. compiles)", flush=True)


def case_train(small: bool, reps: dict, options: dict) -> dict:
    """The contenders run one after the other (ours compiled, ours FUSED, JAX), each with
    its own copy of the model and AdamW state, freed before the next: two sets of AdamW
    states of the full model would not leave room for activations on one chip."""
    import copy

    import jax
    import jax.numpy as jnp
    import torch
    from torch._inductor import config as inductor_config

    from torch_tpu.device import EagerMode, _early_launch, _fused, set_eager_mode

    emulating = inductor_config.emulate_precision_casts  # the process's settings, restored after each variant
    sdp_reduced = torch.backends.cuda.fp16_bf16_reduction_math_sdp_allowed()
    cfg = llama_config(small, options.get("layers"))
    batch, seq = (2, 16) if small else (4, 512)
    check_steps = 3
    base = base_llama(cfg)
    gen = torch.Generator().manual_seed(2)
    ids_cpu = torch.randint(0, cfg.vocab, (batch, seq), generator=gen)
    tgt_cpu = torch.randint(0, cfg.vocab, (batch, seq), generator=gen)
    flops = 3 * cfg.forward_flops(batch, seq)
    rows: dict[str, dict] = {}
    losses: dict[str, list[float]] = {}
    notes: dict[str, str] = {}

    def restore_settings() -> None:
        """What a variant set (its environment variables, the two PyTorch switches) back to
        the process's, and the device's memory released, before the next contender."""
        for variable in _TRAIN_VARIANT_VARIABLES:
            os.environ.pop(variable, None)
        inductor_config.emulate_precision_casts = emulating
        torch.backends.cuda.allow_fp16_bf16_reduction_math_sdp(sdp_reduced)
        release()

    def run_ours(name: str, fused: bool, compiled: bool, each_graph: bool = False, split: bool = False,
                 late: bool = False, emulate: bool = False, scores16: bool = False, pallas: bool = False,
                 grads_kept: bool = False) -> None:
        # emulate: the compiled graphs round each op's 16-bit result as eager does (inductor's
        # emulate_precision_casts), where by default they read such intermediates unrounded
        # (torchtpu-elide-roundings): the program the step compiled to before the 21st session.
        inductor_config.emulate_precision_casts = emulate
        # scores16: attention's Q K^T rounded to bf16 before its softmax, as JAX's reference
        # attention computes it (PyTorch's allow_fp16_bf16_reduction_math_sdp, off by default).
        torch.backends.cuda.allow_fp16_bf16_reduction_math_sdp(scores16)
        if pallas:  # the Pallas flash kernels at any length (auto: from 1024 tokens)
            os.environ["TORCH_TPU_ATTENTION_KERNEL"] = "pallas"
        if each_graph:  # Strict mode running each graph when it is called (as before issue 28's change)
            os.environ["TORCH_TPU_FUSE_COMPILED_STEP"] = "0"
        if late:  # the deferred step launched at its end only, not at its forward's call
            os.environ["TORCH_TPU_EARLY_STEP_LAUNCH"] = "0"
        if split:  # the forward run when called, the backward and AdamW deferred into one program
            os.environ["TORCH_TPU_COMPILED_STEP_START"] = "backward"
        model = copy.deepcopy(base).to("tpu").train()
        ids, tgt = ids_cpu.to("tpu"), tgt_cpu.to("tpu")
        step, how = _torch_train_step(model, cfg, compile_step=compiled, grads_kept=grads_kept)
        if fused:
            def call():
                with set_eager_mode(EagerMode.FUSED):  # leaving the mode flushes: one program per step
                    return step(ids, tgt)
        else:
            def call():
                return step(ids, tgt)
        t0 = time.perf_counter()
        losses[name] = [float(call().item()) for _ in range(check_steps)]
        first = time.perf_counter() - t0
        call()  # a step's one program compiles in the background (FUSED; Strict's deferred graphs): wait for it
        _fused.wait_for_compiles()
        if fused:
            how = (f"{how}, in FUSED mode: its graphs recorded into one program per step" if compiled else
                   "eager step in FUSED mode (one fused program per step)")
        else:
            how = (f"{how}, Strict mode, each graph run when called (TORCH_TPU_FUSE_COMPILED_STEP=0)" if each_graph
                   else f"{how}, Strict mode: the forward run when called, the backward and AdamW deferred into "
                        "one program (TORCH_TPU_COMPILED_STEP_START=backward)" if split
                   else f"{how}, Strict mode: its graphs deferred into one program per step")
        if late:
            how += " (TORCH_TPU_EARLY_STEP_LAUNCH=0)"
        if emulate:
            how += ", each op's 16-bit result rounded (torch._inductor.config.emulate_precision_casts)"
        if scores16:
            how += ", attention scores rounded to bf16 (torch.backends.cuda.allow_fp16_bf16_reduction_math_sdp)"
        if pallas:
            how += ", attention as the Pallas flash kernels (TORCH_TPU_ATTENTION_KERNEL=pallas)"
        if grads_kept:
            how += ", gradients kept after the step (zero_grad at the next step's start)"
        notes[name] = how
        c = Contender(call, torch_sync, "ours", flops, extra={"first_calls_s": first, "variant": how})
        launched = dict(_early_launch.STATS)
        rows.update(time_blocks({name: c}, reps["calls_big"], reps["repeats_big"], warmup=1))
        _progress(name, rows[name], first)
        # Steps launched at their forward's call, and how many kept their launched results.
        rows[name]["early_launch"] = {k: v - launched[k] for k, v in _early_launch.STATS.items()}
        del model, step, c, call, ids, tgt
        restore_settings()
        rows[name]["live_arrays_after"] = live_arrays()

    def run_cpu_eager(name: str) -> None:
        """PyTorch's own eager step on the host's CPU (--small only: tiny tensors), whose time
        is PyTorch's per-op cost on this host (dispatch, autograd, the modules' and AdamW's
        Python), the floor of any eager step that dispatches op by op, FUSED's included."""
        model = copy.deepcopy(base).train()
        step, _ = _torch_train_step(model, cfg, compile_step=False)
        t0 = time.perf_counter()
        losses[name] = [float(step(ids_cpu, tgt_cpu).item()) for _ in range(check_steps)]
        notes[name] = "eager step on the host CPU (PyTorch's kernels; with --small: its per-op cost on this host)"
        c = Contender(lambda: step(ids_cpu, tgt_cpu), lambda _r: None, "ours", flops,
                      extra={"first_calls_s": time.perf_counter() - t0, "variant": notes[name]})
        rows.update(time_blocks({name: c}, reps["calls_big"], reps["repeats_big"], warmup=1))
        del model, step, c

    if "cpu-eager" in options.get("train_variants", ()):
        if small:
            run_cpu_eager("PyTorch eager, CPU")
        else:  # the full model's step on the host's CPU measures its arithmetic, for minutes
            print("    cpu-eager: skipped without --small (it measures PyTorch's per-op cost on tiny tensors)")
    variants = options.get("train_variants", {"compiled", "compiled-fused", "fused"})
    for variant, name, fused, compiled in (("compiled", "torch.compile", False, True),
                                           ("compiled-each", "torch.compile, each graph", False, True),
                                           ("compiled-split", "torch.compile, forward first", False, True),
                                           ("compiled-late", "torch.compile, launched at its end", False, True),
                                           ("compiled-emulate", "torch.compile, rounded per op", False, True),
                                           ("compiled-scores16", "torch.compile, bf16 scores", False, True),
                                           ("compiled-pallas", "torch.compile, Pallas attention", False, True),
                                           ("compiled-grads-kept", "torch.compile, gradients kept", False, True),
                                           ("compiled-fused", "torch.compile, FUSED", True, True),
                                           ("fused", "FUSED eager", True, False)):
        if variant not in variants:
            continue
        try:
            run_ours(name, fused=fused, compiled=compiled, each_graph=variant == "compiled-each",
                     split=variant == "compiled-split", late=variant == "compiled-late",
                     emulate=variant == "compiled-emulate", scores16=variant == "compiled-scores16",
                     pallas=variant == "compiled-pallas", grads_kept=variant == "compiled-grads-kept")
        except Exception as err:  # noqa: BLE001 - reported, then the other contenders still run
            notes[name] = f"failed: {type(err).__name__}: {err}"
            losses[name] = [math.nan]
            traceback.print_exc()
            restore_settings()

    trainable = [n for n, _ in base.named_parameters()]
    consts = {n: bf16_to_jax(b) for n, b in base.named_buffers()}
    jstep = _jax_train_step(cfg, trainable)
    state = {"p": {n: bf16_to_jax(t) for n, t in base.named_parameters()}}
    state["m"] = {k: jnp.zeros_like(a) for k, a in state["p"].items()}
    state["v"] = {k: jnp.zeros_like(a) for k, a in state["p"].items()}
    state["t"] = jnp.zeros((), jnp.float32)
    ids_j = jax.device_put(ids_cpu.numpy().astype("int32"))
    tgt_j = jax.device_put(tgt_cpu.numpy().astype("int32"))

    def jax_call():
        loss, state["p"], state["m"], state["v"], state["t"] = jstep(state["p"], state["m"], state["v"], state["t"],
                                                                     consts, ids_j, tgt_j)
        return loss

    t0 = time.perf_counter()
    losses["jax.jit"] = [float(jax_call()) for _ in range(check_steps)]
    first = time.perf_counter() - t0
    c = Contender(jax_call, jax_sync, "jax", flops, extra={"first_calls_s": first})
    rows.update(time_blocks({"jax.jit": c}, reps["calls_big"], reps["repeats_big"], warmup=1))
    _progress("jax.jit", rows["jax.jit"], first)
    state.clear()

    checks = {}
    for name in (n for n in losses if n != "jax.jit"):
        checks[name] = _loss_check(losses[name], losses["jax.jit"])
    return {"config": {**cfg.__dict__, "params": cfg.params(), "batch": batch, "seq": seq, "dtype": "bfloat16",
                       "optimizer": "AdamW(lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)",
                       "variants": notes},
            "checks": checks, "contenders": rows, "losses": losses}


def _loss_check(ours: list[float], ref: list[float]) -> dict:
    """The losses of the first steps agree (bf16 tolerance, relative) and so does what the
    updates did to the loss (step 1 -> last), which tests backward and AdamW too."""
    rel = max(abs(a - b) / max(abs(b), 1e-6) for a, b in zip(ours, ref))
    d_ours, d_ref = ours[0] - ours[-1], ref[0] - ref[-1]
    drop_err = abs(d_ours - d_ref)
    ok = all(math.isfinite(x) for x in ours) and rel <= TOL["bf16"] and drop_err <= 0.1 * abs(d_ref) + 0.02
    return {"max_abs_err": max(abs(a - b) for a, b in zip(ours, ref)), "rel_err": rel, "tol": TOL["bf16"],
            "loss_drop": d_ours, "jax_loss_drop": d_ref, "ok": ok}


def case_decode(small: bool, reps: dict, options: dict) -> dict:
    import copy

    import jax
    import jax.numpy as jnp
    import torch

    cfg = llama_config(small, options.get("layers"))
    batch, prompt, new = (1, 4, 8) if small else (1, 32, 96)
    total = prompt + new
    base = base_llama(cfg)
    params = jax_params(base)
    _, decode = jax_llama(cfg)
    model = copy.deepcopy(base).to("tpu")
    step = torch.compile(model.decode, backend="tpu")
    jstep = jax.jit(decode, donate_argnums=(3, 4))
    shape = (batch, cfg.kv_heads, total, cfg.head_dim)
    caches = [[torch.zeros(shape, dtype=torch.bfloat16, device="tpu") for _ in range(cfg.layers)] for _ in range(2)]
    jcaches = {"k": [jnp.zeros(shape, jnp.bfloat16) for _ in range(cfg.layers)],
               "v": [jnp.zeros(shape, jnp.bfloat16) for _ in range(cfg.layers)]}
    prompt_cpu = torch.randint(0, cfg.vocab, (batch, prompt), generator=torch.Generator().manual_seed(3))
    # Laid out as the argmax tokens fed back later (strides (1, 1)): a slice keeps the
    # prompt's row stride, and Dynamo would compile the step again for the first new token.
    prompt_t = [prompt_cpu[:, i:i + 1].clone(memory_format=torch.contiguous_format).to("tpu") for i in range(prompt)]
    prompt_j = [jax.device_put(prompt_cpu[:, i:i + 1].numpy().astype("int32")) for i in range(prompt)]
    pos_t = [torch.tensor([i]).to("tpu") for i in range(total)]
    pos_j = [jax.device_put(jnp.array([i], jnp.int32)) for i in range(total)]

    def loop_torch():
        tok, generated, first_logits = prompt_t[0], [], None
        for i in range(total - 1):
            logits, nxt = step(tok, pos_t[i], caches[0], caches[1])
            if i + 1 < prompt:
                tok = prompt_t[i + 1]
            else:
                tok = nxt
                generated.append(nxt)
                first_logits = logits if first_logits is None else first_logits
        return generated, first_logits

    def loop_jax():
        tok, generated, first_logits = prompt_j[0], [], None
        for i in range(total - 1):
            logits, nxt, jcaches["k"], jcaches["v"] = jstep(params, tok, pos_j[i], jcaches["k"], jcaches["v"])
            if i + 1 < prompt:
                tok = prompt_j[i + 1]
            else:
                tok = nxt
                generated.append(nxt)
                first_logits = logits if first_logits is None else first_logits
        return generated, first_logits

    stats = torch._dynamo.utils.counters["stats"]
    from torch_tpu.runtime import get_client

    cache_stats = get_client().cache.stats
    graphs0, compiles0 = stats["unique_graphs"], cache_stats.compiles
    with torch.no_grad():
        t_ours, (gen_t, logits_t) = first_call(loop_torch, torch_sync)
        graphs1, compiles1 = stats["unique_graphs"], cache_stats.compiles
        t_jax, (gen_j, logits_j) = first_call(loop_jax, jax_sync)
        checks = {"torch.compile": compare(logits_t, logits_j, "bf16-deep")}
        toks_t = [int(t.cpu().reshape(-1)[0]) for t in gen_t]
        toks_j = [int(jax.device_get(t).reshape(-1)[0]) for t in gen_j]
        agree = next((i for i, (a, b) in enumerate(zip(toks_t, toks_j)) if a != b), len(toks_t))
        checks["torch.compile"]["tokens_equal_before_first_difference"] = agree
        del gen_t, gen_j, logits_t, logits_j
        steps = total - 1
        flops = sum(cfg.decode_flops(batch, i + 1) for i in range(steps))
        contenders = {
            "jax.jit step per token": Contender(loop_jax, jax_sync, "jax", flops),
            "torch.compile step per token": Contender(loop_torch, torch_sync, "ours", flops),
        }
        rows = time_blocks(contenders, 1, reps["repeats_big"], warmup=1)
    jit_cache = getattr(jstep, "_cache_size", lambda: None)()
    for row in rows.values():
        row["tokens_per_s"] = batch * steps / row["s_per_call"]
        row["s_per_token"] = row["s_per_call"] / steps
    rows["torch.compile step per token"].update(
        first_loop_s=t_ours, dynamo_graphs_first_loop=graphs1 - graphs0, xla_compiles_first_loop=compiles1 - compiles0,
        dynamo_graphs_after_first_loop=stats["unique_graphs"] - graphs1)
    rows["jax.jit step per token"].update(first_loop_s=t_jax, jit_cache_entries=jit_cache)
    return {"config": {**cfg.__dict__, "params": cfg.params(), "batch": batch, "prompt": prompt, "new_tokens": new,
                       "steps_per_loop": steps, "cache_len": total, "dtype": "bfloat16"},
            "checks": checks, "contenders": rows}


# ---------------------------------------------------------------------------------------------
# driver
# ---------------------------------------------------------------------------------------------

def _fmt_bytes(n: float | None) -> str:
    if n is None:
        return "-"
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n:.0f} B"


def add_ratios(result: dict) -> None:
    """ratio = JAX time / ours (> 1: ours faster), for each of ours' rows against its JAX
    contender (`pairs`, else the case's only JAX contender)."""
    rows = result["contenders"]
    jax_rows = [n for n, r in rows.items() if r["side"] == "jax"]
    pairs = result.get("pairs", {})
    for name, row in rows.items():
        if row["side"] != "ours":
            continue
        ref = pairs.get(name) or (jax_rows[0] if len(jax_rows) == 1 else None)
        if ref in rows:
            row["vs"] = ref
            row["ratio_jax_over_ours"] = rows[ref]["s_per_call"] / row["s_per_call"]


def print_case(num: int, result: dict) -> None:
    name = CASE_NAMES[num]
    if "error" in result:
        print(f"[{num}] {name}: ERROR {result['error']}")
        return
    checks = ", ".join(
        f"{k}: {'ok' if c['ok'] else 'FAILED'} ({_err_text(c)})" if c.get("rel_err") is not None
        else f"{k}: FAILED ({c.get('why')})" for k, c in result["checks"].items())
    print(f"[{num}] {name}  ({result['wall_s']:.1f} s incl. compiles)  check vs jax: {checks}")
    if result.get("fallbacks") or result.get("graph_breaks"):
        ops = sorted({m.split(" has no lowering")[0].removeprefix("torch_tpu: ") for m in result["fallbacks"]})
        print(f"    ours: {len(ops)} op(s) fell back to PyTorch eager ({', '.join(ops) or '-'}); "
              f"{result['graph_breaks']} Dynamo graph break(s)")
    for cname, row in result["contenders"].items():
        ratio = f"{row['ratio_jax_over_ours']:.2f}x" if "ratio_jax_over_ours" in row else ("ref" if row["side"] == "jax" else "-")
        tflops = f"{row['tflops']:.2f}" if row.get("tflops") is not None else "-"
        mfu = f"{100 * row['mfu']:.1f}%" if row.get("mfu") is not None else "-"
        extra = ""
        if "GB_per_s" in row:
            extra = f"  {row['GB_per_s']:.2f} GB/s"
        if "tokens_per_s" in row:
            extra = f"  {row['tokens_per_s']:.0f} tok/s"
        if row.get("programs_per_call", 0) > 1:
            extra += f"  ({row['programs_per_call']:.1f} programs per call)"
        if row.get("host_s_per_call") is not None and row["s_per_call"] > 0:
            extra += f"  host {100 * row['host_s_per_call'] / row['s_per_call']:.0f}%"
            if row.get("first_call_s") is not None:
                extra += f", first call {fmt_s(row['first_call_s'])}"
        if row["side"] == "ours" and row.get("xla_compiles_in_timed_blocks"):
            extra += f"  ({row['xla_compiles_in_timed_blocks']} compiles while timed)"
        if row.get("gc_s_per_call") and row["s_per_call"] > 0 and row["gc_s_per_call"] >= 0.01 * row["s_per_call"]:
            extra += f"  gc {100 * row['gc_s_per_call'] / row['s_per_call']:.0f}%"
        early = row.get("early_launch")
        if early and (early["launches"] or cname.startswith("torch.compile")):
            # A compiled step's launches at its forward (kept / launched): 0/0, it ran at its end.
            extra += f"  early {early['hits']}/{early['launches']}"
        print(f"    {cname:<32} {fmt_s(row['s_per_call']):>10} {ratio:>7} {tflops:>8} {mfu:>7} "
              f"{_fmt_bytes(row['h2d_bytes_per_call']):>9} {_fmt_bytes(row['d2h_bytes_per_call']):>9}{extra}")
        if "profile" in row:
            from _xprof import brief

            print("        " + brief(row["profile"]))


def _err_text(check: dict) -> str:
    if check.get("rel_rms") is not None:
        return f"rms {check['rel_rms']:.1e}, max {check['rel_err']:.1e}"
    return f"loss rel {check['rel_err']:.1e}, drop {check['loss_drop']:.3f} vs {check['jax_loss_drop']:.3f}"


def parse_cases(text: str) -> list[int]:
    names = {v: k for k, v in CASE_NAMES.items()}
    out = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        num = int(part) if part.isdigit() else names.get(part)
        if num not in CASE_NAMES:
            raise SystemExit(f"--cases: unknown case {part!r}; use numbers 1-8 or names {', '.join(names)}")
        out.append(num)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", default="1,2,3,4,5,6,7,8", help="comma-separated numbers or names")
    ap.add_argument("--small", action="store_true", help="tiny sizes, for XLA:CPU smoke runs")
    ap.add_argument("--json", metavar="PATH", help="write every figure as JSON")
    ap.add_argument("--repeats", type=int, default=None, help="timed blocks per contender (default 5; 3 for 6-8)")
    ap.add_argument("--calls", type=int, default=None, help="calls per timed block (default 10; 3 for 6-7)")
    ap.add_argument("--layers", type=int, default=None, help="decoder layers of cases 6-8 (default 16; --small 2)")
    ap.add_argument("--peak-tflops", type=float, default=PEAK_TFLOPS_V5E, help="peak for MFU (TPU v5e bf16: 197)")
    ap.add_argument("--train-variants", default="compiled,compiled-fused,fused",
                    help="ours' contenders of case 7: compiled (Strict: the step's graphs deferred into one "
                         "program), compiled-each (Strict with TORCH_TPU_FUSE_COMPILED_STEP=0: each graph run "
                         "when called), compiled-split (Strict with TORCH_TPU_COMPILED_STEP_START=backward: the "
                         "forward run when called, the backward and AdamW one program), compiled-late (Strict with "
                         "TORCH_TPU_EARLY_STEP_LAUNCH=0: the step launched at its end only), compiled-emulate (Strict, each "
                         "op's 16-bit result rounded as eager's: torch._inductor.config.emulate_precision_casts), "
                         "compiled-scores16 (attention's Q K^T rounded to bf16, as JAX's reference attention: "
                         "torch.backends.cuda.allow_fp16_bf16_reduction_math_sdp(True)), compiled-pallas "
                         "(TORCH_TPU_ATTENTION_KERNEL=pallas: the Pallas flash kernels at 512 tokens too), "
                         "compiled-grads-kept (zero_grad at the step's start, not after opt.step(): each step's "
                         "gradients stay readable after it, so its program writes them), "
                         "compiled-fused (the "
                         "compiled step in FUSED mode), fused (the eager step in FUSED mode), cpu-eager (PyTorch's eager "
                         "step on the host CPU, --small only: PyTorch's per-op floor on this host)")
    ap.add_argument("--deadline-s", type=float, default=None,
                    help="skip the cases that would start after this many seconds of the run")
    ap.add_argument("--profile", type=int, default=0, metavar="N",
                    help="after timing, N more calls of each contender under jax.profiler: device time "
                         "per program, per op kind and the largest ops (JSON: row 'profile')")
    ap.add_argument("--gc-freeze", action="store_true",
                    help="gc.freeze() after each case's warm-up calls (both contenders share the process): "
                         "timed blocks without Python's full garbage collections over the warm process's objects")
    ap.add_argument("--own-client", action="store_true",
                    help="let torch_tpu make its own PjRT client instead of sharing JAX's")
    args = ap.parse_args(argv)
    cases = parse_cases(args.cases)
    ARGS_PEAK[0] = args.peak_tflops
    PROFILE_CALLS[0] = args.profile
    GC_FREEZE[0] = args.gc_freeze
    repeats = args.repeats or (2 if args.small else 5)
    calls = args.calls or (3 if args.small else 10)
    reps = {"repeats": repeats, "calls": calls, "repeats_big": args.repeats or (2 if args.small else 3),
            "calls_big": args.calls or (2 if args.small else 3)}
    os.environ.setdefault("TORCH_TPU_CACHE_L2", "0")  # our compiles are real compiles, as JAX's

    started = time.perf_counter()
    import jax

    platform = jax.devices()[0].platform  # JAX's client; nothing of ours exists yet
    client = "own"
    if not args.own_client:
        try:
            client = share_jax_client()
        except Exception as err:  # noqa: BLE001 - torch_tpu then makes its own client
            print(f"could not share JAX's client ({type(err).__name__}: {err}); torch_tpu makes its own")
    import torch

    import torch_tpu

    header = {
        "platform": platform, "device": str(jax.devices()[0].device_kind), "client": client,
        "jax": jax.__version__, "torch": torch.__version__, "torch_tpu": getattr(torch_tpu, "__version__", "?"),
        "host": _platform.node(), "small": args.small, "peak_tflops": args.peak_tflops, "reps": reps,
        "gc_freeze": args.gc_freeze,
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "ratio": "jax time / ours (> 1: ours faster)",
    }
    print(f"torch_tpu vs jax on {header['device']} ({platform}; client: {client}); jax {header['jax']}, "
          f"torch {header['torch']}; peak {args.peak_tflops} TFLOP/s{'; --small' if args.small else ''}")
    print("ratio = JAX time / ours (> 1: ours faster); time = median over blocks of per-call time; "
          "bytes: ours from the runtime counters, JAX by construction")
    print(f"    {'contender':<32} {'time':>10} {'ratio':>7} {'TFLOP/s':>8} {'MFU':>7} {'h2d/call':>9} {'d2h/call':>9}")
    results: dict[str, dict] = {}
    failed = False
    options = {"layers": args.layers, "train_variants": set(filter(None, args.train_variants.split(",")))}
    for num in cases:
        elapsed = time.perf_counter() - started
        if args.deadline_s is not None and elapsed > args.deadline_s:
            print(f"[{num}] {CASE_NAMES[num]}: skipped (--deadline-s {args.deadline_s:g} passed at {elapsed:.0f} s)")
            results[f"{num}-{CASE_NAMES[num]}"] = {"skipped": f"deadline passed at {elapsed:.0f} s"}
            continue
        result = run_case(num, args.small, reps, options)
        results[f"{num}-{CASE_NAMES[num]}"] = result
        failed |= "error" in result or not all(c.get("ok") for c in result["checks"].values())
        print_case(num, result)
        header["total_wall_s"] = time.perf_counter() - started
        if args.json:
            write_json(args.json, header, results)
    print(f"total {header['total_wall_s']:.1f} s" if cases else "no case selected")
    return 1 if failed else 0


def run_case(num: int, small: bool, reps: dict, options: dict) -> dict:
    """One case's result, with its wall time (compiles included), ours' fallbacks to
    PyTorch eager (logged by torch_tpu) and Dynamo's graph breaks during it."""
    import logging

    import torch

    from _common import LogCounter

    fallbacks = LogCounter("runs in PyTorch eager")
    logger = logging.getLogger("torch_tpu")
    logger.addHandler(fallbacks)
    breaks = torch._dynamo.utils.counters["graph_break"]
    breaks_before = sum(breaks.values())
    t0 = time.perf_counter()
    try:
        result = CASE_FUNCS[num](small, reps, options)
        add_ratios(result)
    except Exception as err:  # noqa: BLE001 - one case failing must not hide the others
        traceback.print_exc()
        result = {"error": f"{type(err).__name__}: {err}", "checks": {}, "contenders": {}}
    finally:
        logger.removeHandler(fallbacks)
    result["wall_s"] = time.perf_counter() - t0
    result["fallbacks"] = [m.split(";")[0] for m in fallbacks.messages]
    result["graph_breaks"] = sum(breaks.values()) - breaks_before
    release()
    result["live_arrays_after"] = live_arrays()
    return result


def release() -> None:
    """Lets the device memory of a finished contender go: Dynamo's caches (their guards and
    compiled frames can keep a model's tensors alive) and garbage; the next case or
    contender needs the chip's memory."""
    import torch

    torch._dynamo.reset()
    gc.collect()


def live_arrays() -> int:
    """Arrays alive on the shared client (ours and JAX's): what a case left behind."""
    from torch_tpu.runtime import get_client

    return len(get_client()._raw.live_arrays())


def write_json(path: str, header: dict, results: dict) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as fh:
        json.dump({"header": header, "cases": results}, fh, indent=1, default=str)
    os.replace(tmp, path)


CASE_FUNCS: dict[int, Callable] = {1: case_matmul, 2: case_mlp, 3: case_host_mlp, 4: case_eager_add,
                                   5: case_transfer, 6: case_prefill, 7: case_train, 8: case_decode}


if __name__ == "__main__":
    sys.exit(main())
