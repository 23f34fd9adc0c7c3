"""Per-call overhead of compiled graphs (issue 17), as ratios measured in one process:

* `x + 1` on 8 floats: ours vs inductor vs jax.jit vs eager (fixed per-call cost), with
  the cost of Dynamo's guard check, of our graph callable and of the executable alone,
  and the floor any XLA backend meets: Dynamo's frame (a backend returning a ready
  tuple; one running eager) and bare jaxlib (execute + DLPack out) called from that
  frame; wall time and the calling thread's CPU time side by side;
* the MLP (4 x Linear(1024,1024)+ReLU, batch 64) vs jax.jit;
* one pre-LN transformer block (d=512, 8 heads, seq 128, batch 8) vs jax.jit;
  both beside a floor: the model under torch.compile with jax.jit itself as the backend's
  callable (input prepared once, output back by DLPack), i.e. what Dynamo's frame alone
  adds to JAX for that model;
* the quickstart model's first call (Dynamo + aot_autograd + convert + passes + XLA),
  L2 cache off, the best of `--first-calls` fresh compiles;
* `decode` (issue 28, not in the default cases): the host cost of one compiled greedy
  decode step of bench/tpu.py's Llama (`--small`, `--layers`, 16 by default: ~180 tpu
  tensor arguments, 32 KV caches written in place), split into Dynamo's frame, its
  guards, its disable wrapper, and our graph callable's stages (arguments, launch,
  results, write-back), each timed alone on the calling thread's CPU clock (wall time
  where that clock is coarse: `_common.host_clock`): XLA:CPU's worker threads run the
  program, so this is host time, not device time.

    .venv/bin/python bench/overhead.py [--rounds 9] [--calls 40] [--skip-inductor]
    .venv/bin/python bench/overhead.py --cases decode [--layers 16] [--profile]

JAX is given the parameters as arguments (a jit closing over its weights lets XLA fold
them as constants). Contenders are interleaved in short blocks per round and each
round's median is kept; the reported figure is the median over rounds, so load from
other processes hits every contender alike. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from functools import partial

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("TORCH_TPU_CACHE_L2", "0")

from _common import host_clock, wait_for_idle_threads  # noqa: E402


def _round_medians(contenders: dict, rounds: int, calls: int, settle=None) -> dict[str, float]:
    """Median over `rounds` of each contender's median per-call seconds in that round;
    `settle` (e.g. `_common.wait_for_idle_threads`) runs untimed before each block."""
    per_round: dict[str, list[float]] = {k: [] for k in contenders}
    for fn, sync in contenders.values():
        for _ in range(3):
            sync(fn())
    for _ in range(rounds):
        for name, (fn, sync) in contenders.items():
            if settle is not None:
                settle()
            samples = []
            for _ in range(calls):
                t0 = time.perf_counter()
                sync(fn())
                samples.append(time.perf_counter() - t0)
            per_round[name].append(statistics.median(samples))
    return {k: statistics.median(v) for k, v in per_round.items()}


def _jax_params(model):
    import jax
    import numpy as np

    return {
        name: jax.device_put(np.ascontiguousarray(t.detach().numpy()))
        for name, t in list(model.named_parameters()) + list(model.named_buffers())
        if t.is_floating_point()
    }


def _model_case(model, x, jax_fn, rounds: int, calls: int) -> dict[str, float]:
    import jax
    import torch

    torch._dynamo.reset()
    ours = torch.compile(model, backend="tpu")
    params = _jax_params(model)
    x_dev = jax.device_put(x.numpy())
    jitted = jax.jit(jax_fn)
    fresh = [torch.randn_like(x) for _ in range(4)]
    turn = iter(range(1 << 62))

    def jax_as_backend(gm, example):
        # The floor of any Dynamo backend on XLA: the graph's callable is jax.jit itself,
        # on a device input prepared once, its result handed back by DLPack.
        return lambda *args: (torch.from_dlpack(jitted(params, x_dev)),)

    floor = torch.compile(model, backend=jax_as_backend)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), model(x), rtol=1e-3, atol=1e-3)
        contenders = {
            "ours": (lambda: ours(x), lambda r: r),
            # A new input tensor every call: no device array to reuse (see tiny_case).
            "ours, new input each call": (lambda: ours(fresh[next(turn) % 4]), lambda r: r),
            "jax": (lambda: jitted(params, x_dev), lambda r: r.block_until_ready()),
            "floor: dynamo + jax.jit": (lambda: floor(x), lambda r: r),
        }
        # The previous block's XLA (Eigen) workers and the eager check's OpenMP workers
        # must not spin on the 2 cores while the next contender runs.
        return _round_medians(contenders, rounds, calls, settle=wait_for_idle_threads)


def tiny_case(rounds: int, calls: int, inductor: bool) -> tuple[dict[str, float], dict[str, float]]:
    """Per-call seconds of each contender: wall (median of round medians), thread CPU (best)."""
    import jax
    import torch

    def f(x):
        return x + 1

    x = torch.randn(8)
    torch._dynamo.reset()
    ours = torch.compile(f, backend="tpu")
    contenders = {"ours": (lambda: ours(x), lambda r: r)}
    # The same input tensor every call lets the executable reuse the device array aliasing
    # it; a new tensor every call (a data loader's batches) makes one per call: both shown.
    fresh = [torch.randn(8) for _ in range(16)]
    turn = iter(range(1 << 62))
    contenders["ours, new input each call"] = (lambda: ours(fresh[next(turn) % 16]), lambda r: r)
    if inductor:
        ind = torch.compile(f)
        contenders["inductor"] = (lambda: ind(x), lambda r: r)
    jitted = jax.jit(lambda a: a + 1)
    x_dev = jax.device_put(x.numpy())
    contenders["jax"] = (lambda: jitted(x_dev), lambda r: r.block_until_ready())
    contenders["eager"] = (lambda: f(x), lambda r: r)
    with torch.no_grad():
        ours(x)
        # Where our per-call time goes: Dynamo's guards (checked, never disabled), the
        # compiled graph's callable (argument plan -> executable -> outputs), and the
        # executable alone; the rest of `ours` is Dynamo's frame evaluation.
        guards = [e.guard_manager for e in _cache_entries(f)]
        if guards:
            contenders["dynamo guards"] = (lambda: [g.check({"x": x}) for g in guards], lambda r: r)
        graph = _compiled_graph()
        if graph is not None:
            contenders["ours: graph callable"] = (lambda: graph(x), lambda r: r)
            fast = graph.fast_path()  # what `ours` runs from its second call (None: the graph)
            if fast is not None:
                contenders["ours: fast path"] = (lambda: fast(x), lambda r: r)
            contenders["ours: executable"] = (lambda: graph.executable(x), lambda r: r)
            contenders.update(_floor_contenders(graph.executable, x))
        wall = _round_medians(contenders, rounds, calls * 10)
        return wall, _thread_cpu(contenders, rounds, calls * 10)


def _floor_contenders(executable, x) -> dict:
    """What torch and jaxlib cost whoever the backend is, for the x + 1 graph: Dynamo's
    frame with a backend that computes nothing (returns a ready tuple) or runs eager
    (`gm.forward`), bare jaxlib (the input aliased, execute, the result to torch by DLPack
    -- off XLA:CPU by its host copy -- outside Dynamo), and the floor: that bare jaxlib
    call as the backend's callable, i.e. Dynamo's frame + execute + the cheapest
    host->device->host round trip. `ours` minus
    the floor is ours to cut; the floor minus `dynamo: returns a tuple` is what running
    jaxlib inside a compiled frame costs (measured: several times its cost outside one)."""
    import numpy as np
    import torch

    from torch_tpu.runtime import _jaxlib

    device = executable.devices[0]
    aval = executable._in_avals[0]
    execute_sharded = executable._raw.execute_sharded
    handlers = executable._handlers
    from_dlpack, to_dlpack = torch._C._from_dlpack, _jaxlib.buffer_to_dlpack
    host = x.numpy()
    put = _jaxlib.batched_device_put
    array = put(aval, device._sharding, [host], device._raw_list, True, False, _jaxlib.ZERO_COPY, True)

    if device.platform == "cpu":
        def to_torch(out):
            return from_dlpack(to_dlpack(out))
    else:  # a TPU or GPU array is no DLPack device here: its host copy, as ours reads it
        def to_torch(out):
            return torch.from_numpy(np.array(_jaxlib.host_value(out, True)))

    def bare_jaxlib(*_):
        (out,) = execute_sharded([array]).consume_with_handlers(handlers)
        return (to_torch(out),)

    ready = (torch.randn(8),)
    backends = {
        "dynamo: returns a tuple": lambda gm, example: (lambda *_: ready),
        "dynamo: gm.forward (eager)": lambda gm, example: gm.forward,
        "floor: dynamo + bare jaxlib": lambda gm, example: bare_jaxlib,
    }
    contenders = {"bare jaxlib: execute + dlpack": (lambda: bare_jaxlib(x), lambda r: r)}
    for name, backend in backends.items():
        compiled = torch.compile(_fresh_add_one(), backend=backend)  # a code object each
        compiled(x)
        contenders[name] = (lambda c=compiled: c(x), lambda r: r)
    return contenders


def _fresh_add_one():
    """`lambda x: x + 1` with a code object of its own (Dynamo caches per code object)."""
    namespace: dict = {}
    exec(compile("def add_one(x):\n    return x + 1\n", f"<add_one {id(namespace)}>", "exec"), namespace)
    return namespace["add_one"]


def _thread_cpu(contenders: dict, rounds: int, calls: int) -> dict[str, float]:
    """The calling thread's CPU seconds per call (`time.thread_time`), best of `rounds`
    blocks of `calls` calls: what one thread spends, less exposed than wall time to
    other processes on a loaded machine (it does not count time spent descheduled)."""
    best = {k: float("inf") for k in contenders}
    for _ in range(rounds):
        for name, (fn, sync) in contenders.items():
            t0 = time.thread_time()
            for _ in range(calls):
                sync(fn())
            best[name] = min(best[name], (time.thread_time() - t0) / calls)
    return best


def _cache_entries(fn) -> list:
    try:
        from torch._dynamo.eval_frame import _debug_get_cache_entry_list
    except ImportError:  # a PyTorch without it: no guard figure
        return []
    return list(_debug_get_cache_entry_list(fn.__code__))


def _compiled_graph():
    """The most recent `CompiledGraph` (the backend's callable for a Dynamo graph)."""
    import gc

    from torch_tpu.backend._compile import CompiledGraph

    graphs = [o for o in gc.get_objects() if type(o) is CompiledGraph]
    return graphs[-1] if graphs else None


def quickstart_first_call(repeats: int) -> float:
    import torch

    from torch_tpu.examples.quickstart import TinyGPT

    torch.manual_seed(0)
    model = TinyGPT(seq=64).eval()
    ids = torch.randint(0, 512, (4, 64))
    best = float("inf")
    for _ in range(repeats):
        torch._dynamo.reset()
        compiled = torch.compile(model, backend="tpu")
        from torch_tpu.runtime import get_client

        get_client().cache.clear_l1()  # a real XLA compile every time
        t0 = time.perf_counter()
        with torch.no_grad():
            compiled(ids)
        best = min(best, time.perf_counter() - t0)
    return best


def decode_case(rounds: int, calls: int, layers: int, profile: bool) -> dict[str, float]:
    """Thread CPU µs per call (median over rounds of each round's mean) of one compiled
    decode step and of its parts, each called alone with the arguments Dynamo passes."""
    import copy

    import torch

    import tpu as T

    cfg = T.llama_config(True, layers)
    model = copy.deepcopy(T.base_llama(cfg)).to("tpu")
    step = torch.compile(model.decode, backend="tpu")
    total = 12
    shape = (1, cfg.kv_heads, total, cfg.head_dim)
    caches = [[torch.zeros(shape, dtype=torch.bfloat16, device="tpu") for _ in range(cfg.layers)] for _ in range(2)]
    tok = torch.randint(0, cfg.vocab, (1, 1), generator=torch.Generator().manual_seed(0)).to("tpu")
    positions = [torch.tensor([i]).to("tpu") for i in range(total)]
    turn = iter(range(1 << 62))

    def decode():
        return step(tok, positions[next(turn) % total], caches[0], caches[1])

    with torch.no_grad():
        for _ in range(3):
            decode()
        # The flat arguments Dynamo passes to the graph's callable (its global in the
        # traced function's module), caught on one call.
        name = next(k for k in vars(T) if k.startswith("__compiled_fn"))
        compiled_fn = vars(T)[name]
        caught: list = []

        def catch(*args):
            caught.append(args)
            return compiled_fn(*args)

        vars(T)[name] = catch
        decode()
        vars(T)[name] = compiled_fn
        (flat,) = caught
        ours = compiled_fn._torchdynamo_orig_callable
        frame_locals = {"self": model, "ids": tok, "pos": positions[0], "k_caches": caches[0], "v_caches": caches[1]}
        guards = [e.guard_manager for e in _cache_entries(type(model).decode)]
        contenders = {
            "step (Dynamo frame + guards + graph)": decode,
            "Dynamo guards": lambda: [g.check(frame_locals) for g in guards],
            "Dynamo's disable wrapper + ours": lambda: compiled_fn(*flat),
            "ours: graph callable": lambda: ours(*flat),
        }
        contenders.update(_decode_stages(flat, ours))
        for fn in contenders.values():
            fn()
        if profile:
            import cProfile
            import pstats

            prof = cProfile.Profile()
            prof.enable()
            for _ in range(calls):
                decode()
            prof.disable()
            pstats.Stats(prof).sort_stats("tottime").print_stats(25)
        clock, clock_name = host_clock()
        per_round: dict[str, list[float]] = {k: [] for k in contenders}
        for _ in range(rounds):
            for key, fn in contenders.items():
                t0 = clock()
                for _ in range(calls):
                    fn()
                per_round[key].append((clock() - t0) / calls)
        torch.tpu.synchronize()
    return {k: statistics.median(v) for k, v in per_round.items()} | {
        "arguments": len(flat), "clock": clock_name,
        "spread": {k: (min(v), max(v)) for k, v in per_round.items()}}


class _NotLaunched(Exception):
    pass


def _decode_stages(flat: tuple, ours) -> dict:
    """Our graph callable's stages, each alone on the same arguments. With the device
    fast path (`Invoker.device_caller`): the arguments' buffers read in one loop, the
    launch, the results made and the updated caches written into their inputs. Before it
    (an older tree): the argument plan, the launch through the converters, the results as
    tpu tensors, and the write-back by `copy_`."""
    import gc
    import inspect

    import torch

    from torch_tpu.program.invoker import Invoker
    from torch_tpu.program.tpu_tensors import tpu_tensors

    invokers = [o for o in gc.get_objects() if type(o) is Invoker and o.plan.device_index is not None
                and len(o.plan._specs) == len(flat)]
    if not invokers:
        return {}
    invoker = invokers[-1]
    executable, index, device = invoker.executable, invoker.plan.device_index, tpu_tensors()
    positions = inspect.getclosurevars(ours).nonlocals.get("written", [])
    results = len(executable.signature.results)
    if hasattr(invoker, "device_caller"):
        from torch_tpu.runtime import dtypes

        def dtype(spec):
            return dtypes.torch_dtype(spec.element_type)

        arg_specs = [(tuple(a.shape), dtype(a), a.element_type) for a in executable.signature.args]
        result_specs = [(tuple(r.shape), dtype(r)) for r in executable.signature.results]
        writes = {results - len(positions) + k: p for k, p in enumerate(positions)}
        launch = executable.buffer_launcher()
        launched: list = []

        def no_launch(buffers):  # the arguments' loop alone: no program, no results
            launched.append(buffers)
            raise _NotLaunched

        reader = device.graph_caller(arg_specs, result_specs, executable.devices[0], index, no_launch,
                                     invoker.host_results, writes)

        def read_only():
            try:
                reader(flat)
            except _NotLaunched:
                launched.clear()

        try:
            reader(flat)
        except _NotLaunched:
            pass
        buffers = launched.pop()
        # The program donates the caches it writes: a launch outside the call would take
        # their storages' own buffers, so each launch here gets fresh copies of those.
        donated = tuple(executable.donated_args)

        def launch_copies():
            given = list(buffers)
            for p in donated:
                given[p] = given[p].copy()
            return launch(given)

        fast = invoker.device_caller(list, writes)
        outs = launch_copies()
        relaunched = device.graph_caller(arg_specs, result_specs, executable.devices[0], index, lambda _: outs,
                                         invoker.host_results, writes)

        def without_launch():  # the arguments' loop, then the results and writes of one launch
            with torch.no_grad():
                return relaunched(flat)

        def whole_call():
            with torch.no_grad():
                return fast(*flat)

        return {
            "  arguments (buffers read in one loop)": read_only,
            f"  launch (buffer_launcher: PjRT execute; {len(donated)} donated copied first)": launch_copies,
            f"  arguments + results + {len(writes)} writes (no launch)": without_launch,
            f"  whole fast call (+ results, {len(writes)} writes)": whole_call,
        }
    arguments = invoker.arguments(flat)
    buffers = executable.execute(arguments)
    wrap = device.result
    made = [wrap(b, index) for b in buffers]
    own = len(made) - len(positions)
    written = [(flat[i], made[own + k]) for k, i in enumerate(positions)]

    def write_back():
        with torch.no_grad():
            for dst, src in written:
                dst.copy_(src)

    return {
        "  arguments (plan: tensors -> buffers)": lambda: invoker.arguments(flat),
        "  launch (converters + PjRT execute)": lambda: executable.execute(arguments),
        "  results (buffers -> tpu tensors)": lambda: [wrap(b, index) for b in buffers],
        f"  write-back ({len(written)} copy_)": write_back,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--calls", type=int, default=40, help="calls per contender per round (x10 for x + 1)")
    p.add_argument("--first-calls", type=int, default=2)
    p.add_argument("--skip-inductor", action="store_true")
    p.add_argument("--cases", default="tiny,mlp,block,first", help="also: decode")
    p.add_argument("--layers", type=int, default=16, help="decode: the Llama's layers (bench/tpu.py --small)")
    p.add_argument("--profile", action="store_true", help="decode: print a cProfile of the step first")
    args = p.parse_args(argv)
    cases = set(args.cases.split(","))

    import torch

    import models as M

    MLP, GPT, _ = M._torch_models()
    if "tiny" in cases:
        t, cpu = tiny_case(args.rounds, args.calls, not args.skip_inductor)
        print("x + 1 (8 floats), per call: wall (median) / calling thread's CPU (best)")
        for k in t:
            print(f"  {k:34s} {t[k] * 1e6:7.1f} µs  {cpu[k] * 1e6:7.1f} µs")
        ratios = ", ".join(f"ours/{k} {t['ours'] / t[k]:.2f}x (CPU {cpu['ours'] / cpu[k]:.2f}x)"
                           for k in ("inductor", "jax", "eager") if k in t)
        print(f"  {ratios}")
        floor = "floor: dynamo + bare jaxlib"
        if floor in cpu:
            frame = cpu["dynamo: returns a tuple"]
            print(f"  thread CPU: Dynamo's frame {frame * 1e6:.1f} µs; jaxlib in that frame "
                  f"{(cpu[floor] - frame) * 1e6:.1f} µs (bare {cpu['bare jaxlib: execute + dlpack'] * 1e6:.1f}); "
                  f"ours above the floor {(cpu['ours'] - cpu[floor]) * 1e6:.1f} µs")
    if "mlp" in cases:
        torch.manual_seed(0)
        t = _model_case(MLP().eval(), torch.randn(64, 1024), M.jax_mlp, args.rounds, args.calls)
        print(f"MLP 4x1024 b64: ours {t['ours'] * 1e3:.3f} ms (new input each call "
              f"{t['ours, new input each call'] * 1e3:.3f} ms), jax {t['jax'] * 1e3:.3f} ms; "
              f"ours/jax {t['ours'] / t['jax']:.3f}x; floor (jax.jit as the Dynamo backend) "
              f"{t['floor: dynamo + jax.jit'] / t['jax']:.3f}x")
    if "block" in cases:
        torch.manual_seed(0)
        model = GPT(layers=1).eval()
        t = _model_case(model, torch.randn(8, 128, 512), partial(M.jax_gpt, layers=1), args.rounds,
                        max(4, args.calls // 4))
        print(f"block d512 8x128: ours {t['ours'] * 1e3:.3f} ms, jax {t['jax'] * 1e3:.3f} ms; "
              f"ours/jax {t['ours'] / t['jax']:.3f}x; floor (jax.jit as the Dynamo backend) "
              f"{t['floor: dynamo + jax.jit'] / t['jax']:.3f}x")
    if "decode" in cases:
        t = decode_case(args.rounds, args.calls, args.layers, args.profile)
        spread = t.pop("spread")
        print(f"decode step, --small --layers {args.layers}: {t.pop('arguments')} arguments; "
              f"µs per call on the {t.pop('clock')} clock (median of rounds, [min, max])")
        for k, v in t.items():
            lo, hi = spread[k]
            print(f"  {k:42s} {v * 1e6:8.1f}  [{lo * 1e6:.1f}, {hi * 1e6:.1f}]")
    if "first" in cases:
        print(f"quickstart first call (L2 off, best of {args.first_calls}): "
              f"{quickstart_first_call(args.first_calls):.2f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
