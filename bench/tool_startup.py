"""Start-up time of `torchtpu-opt` on a `.mlir` file versus the bare import of jaxlib's
MLIR bindings, measured side by side as whole processes (median wall time over
interleaved runs). A run that imports no FX graph must not import torch.

    .venv/bin/python bench/tool_startup.py [--runs 15]

Goal: torchtpu-opt <= 0.4 s. Not a test: nothing here is asserted.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time

MODULE = """
func.func @f(%a: tensor<2x3xf32>, %b: tensor<3x4xf32>) -> tensor<2x4xf32> {
  %0 = stablehlo.dot_general %a, %b, contracting_dims = [1] x [0] : (tensor<2x3xf32>, tensor<3x4xf32>) -> tensor<2x4xf32>
  return %0 : tensor<2x4xf32>
}
"""


def _wall(argv: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()
    with tempfile.NamedTemporaryFile("w", suffix=".mlir", delete=False) as f:
        f.write(MODULE)
    commands = {
        "python -c 'import jaxlib.mlir.ir'": [sys.executable, "-c", "import jaxlib.mlir.ir"],
        "torchtpu-opt --torchtpu-verify": [sys.executable, "-m", "torch_tpu.tools.opt", f.name, "--torchtpu-verify"],
        "torchtpu-opt --torchtpu-compile-pipeline": [sys.executable, "-m", "torch_tpu.tools.opt", f.name,
                                                     "--torchtpu-compile-pipeline=precision=high"],
        "python -c 'import torch'": [sys.executable, "-c", "import torch"],
    }
    samples: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(args.runs):  # interleaved: load on the machine hits every command alike
        for name, argv in commands.items():
            samples[name].append(_wall(argv))
    base = statistics.median(samples["python -c 'import jaxlib.mlir.ir'"])
    print(f"{'command':45s} {'median s':>9s} {'vs bare jaxlib import':>22s}")
    for name, values in samples.items():
        median = statistics.median(values)
        print(f"{name:45s} {median:9.3f} {median / base:21.2f}x")


if __name__ == "__main__":
    main()
