"""Dispatch overhead: a tiny compiled function called from torch tensors to torch tensors,
torch_tpu.runtime versus jax.jit of the same function on the same XLA:CPU, measured side
by side in one process (median µs per call over interleaved rounds).

    .venv/bin/python bench/dispatch.py [--calls 2000] [--rounds 5]

Goal: ours <= 1.5x jax.jit. Not a test: nothing here is asserted.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

MODULE = """
module @tiny {
  func.func public @main(%a: tensor<4x4xf32>, %b: tensor<4x4xf32>) -> tensor<4x4xf32> {
    %0 = stablehlo.add %a, %b : tensor<4x4xf32>
    %1 = stablehlo.multiply %0, %b : tensor<4x4xf32>
    return %1 : tensor<4x4xf32>
  }
}
"""


def _median_us(fn, calls: int) -> float:
    samples = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples) * 1e6


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--calls", type=int, default=2000, help="calls per round per contender")
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds (the median is reported)")
    args = p.parse_args(argv)

    import torch
    from torch_tpu.runtime import get_client

    torch.manual_seed(0)
    x = torch.randn(4, 4)
    y = torch.randn(4, 4)
    expected = (x + y) * y

    client = get_client("cpu")
    exe = client.compile(MODULE, name="tiny.mlir")

    def ours():
        return exe(x, y)[0]

    bx, by = client.to_device(x), client.to_device(y)

    def ours_buffers():
        out = exe.execute([bx, by])[0]
        out.synchronize()
        return out

    try:
        import jax
    except ImportError:
        print("jax is not installed: only our numbers are shown", file=sys.stderr)
        jax = None

    contenders = {"torch_tpu exe(x, y) torch->torch": ours, "torch_tpu execute(buffers)+sync": ours_buffers}
    if jax is not None:
        cpu = jax.devices("cpu")[0]
        f = jax.jit(lambda a, b: (a + b) * b, device=cpu) if "device" in jax.jit.__code__.co_varnames else jax.jit(lambda a, b: (a + b) * b)

        def jax_torch():
            # the same torch -> torch contract: numpy views in, DLPack out
            return torch.from_dlpack(f(x.numpy(), y.numpy()))

        ja, jb = jax.device_put(x.numpy(), cpu), jax.device_put(y.numpy(), cpu)

        def jax_arrays():
            return f(ja, jb).block_until_ready()

        contenders["jax.jit f(x.numpy(), y.numpy()) torch->torch"] = jax_torch
        contenders["jax.jit f(arrays)+block"] = jax_arrays

    for name, fn in contenders.items():
        out = fn()
        value = out.to_torch() if hasattr(out, "to_torch") else out if isinstance(out, torch.Tensor) else torch.from_dlpack(out)
        if not torch.allclose(value, expected, rtol=1e-6, atol=1e-6):
            print(f"{name}: WRONG RESULT", file=sys.stderr)
            return 1
        for _ in range(200):
            fn()

    results: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(args.rounds):
        for name, fn in contenders.items():
            results[name].append(_median_us(fn, args.calls))

    med = {name: statistics.median(v) for name, v in results.items()}
    print(f"dispatch, tiny (a+b)*b on 4x4 f32, XLA:CPU, median of {args.rounds} rounds x {args.calls} calls")
    print(f"{'contender':<48} {'µs/call':>9}")
    for name, us in med.items():
        print(f"{name:<48} {us:>9.2f}")
    if jax is not None:
        ratio = med["torch_tpu exe(x, y) torch->torch"] / med["jax.jit f(x.numpy(), y.numpy()) torch->torch"]
        ratio_buf = med["torch_tpu execute(buffers)+sync"] / med["jax.jit f(arrays)+block"]
        print(f"ratio torch->torch  ours / jax.jit = {ratio:.2f}x   (goal <= 1.5x)")
        print(f"ratio device arrays ours / jax.jit = {ratio_buf:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
