"""Shared pieces of the runtime tests: small StableHLO modules and subprocess helpers."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def add_module(shape: str = "2x3", dtype: str = "f32", name: str = "add") -> str:
    t = f"tensor<{shape}x{dtype}>" if shape else f"tensor<{dtype}>"
    return textwrap.dedent(
        f"""\
        module @{name} {{
          func.func public @main(%a: {t}, %b: {t}) -> {t} {{
            %0 = stablehlo.add %a, %b : {t}
            return %0 : {t}
          }}
        }}
        """
    )


def scale_module(factor: float, shape: str = "4") -> str:
    """x * factor: a family of distinct modules (distinct cache keys)."""
    t = f"tensor<{shape}xf32>"
    return textwrap.dedent(
        f"""\
        module @scale {{
          func.func public @main(%a: {t}) -> {t} {{
            %c = stablehlo.constant dense<{factor:.1f}> : {t}
            %0 = stablehlo.multiply %a, %c : {t}
            return %0 : {t}
          }}
        }}
        """
    )


def identity_module(dtype: str, shape: str = "2x3") -> str:
    """Returns its argument (XLA copies it into a new output buffer): dtype round trips."""
    t = f"tensor<{shape}x{dtype}>"
    return textwrap.dedent(
        f"""\
        module @ident {{
          func.func public @main(%a: {t}) -> {t} {{
            return %a : {t}
          }}
        }}
        """
    )


def allreduce_module(n: int, shape: str = "4") -> str:
    t = f"tensor<{shape}xf32>"
    groups = ", ".join(str(i) for i in range(n))
    return textwrap.dedent(
        f"""\
        module @allreduce {{
          func.func public @main(%a: {t}) -> ({t}, tensor<ui32>) {{
            %0 = "stablehlo.all_reduce"(%a) ({{
              ^bb0(%x: tensor<f32>, %y: tensor<f32>):
                %s = stablehlo.add %x, %y : tensor<f32>
                stablehlo.return %s : tensor<f32>
            }}) {{replica_groups = dense<[[{groups}]]> : tensor<1x{n}xi64>}} : ({t}) -> {t}
            %r = stablehlo.replica_id : tensor<ui32>
            return %0, %r : {t}, tensor<ui32>
          }}
        }}
        """
    )


def mlp_module(layers: int, width: int = 64, batch: int = 8) -> str:
    """A `layers`-deep MLP (dot + bias + relu per layer), weights as arguments."""
    x = f"tensor<{batch}x{width}xf32>"
    w = f"tensor<{width}x{width}xf32>"
    b = f"tensor<{width}xf32>"
    args = [f"%x: {x}"] + [f"%w{i}: {w}, %b{i}: {b}" for i in range(layers)]
    body = [f"    %zero = stablehlo.constant dense<0.0> : {x}"]
    cur = "%x"
    for i in range(layers):
        body += [
            f"    %d{i} = stablehlo.dot_general {cur}, %w{i}, contracting_dims = [1] x [0] : ({x}, {w}) -> {x}",
            f"    %bb{i} = stablehlo.broadcast_in_dim %b{i}, dims = [1] : ({b}) -> {x}",
            f"    %s{i} = stablehlo.add %d{i}, %bb{i} : {x}",
            f"    %h{i} = stablehlo.maximum %s{i}, %zero : {x}",
        ]
        cur = f"%h{i}"
    return (
        f"module @mlp{layers} {{\n  func.func public @main({', '.join(args)}) -> {x} {{\n"
        + "\n".join(body)
        + f"\n    return {cur} : {x}\n  }}\n}}\n"
    )


def run_python(code: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    """Runs `code` in a fresh interpreter of this venv, with the repository's environment."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("TORCH_TPU_CACHE")}
    full_env.pop("WORLD_SIZE", None)
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True, text=True, env=full_env, timeout=timeout, cwd=REPO, check=False,
    )
