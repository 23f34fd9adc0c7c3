"""Bounded dynamism in the frontend: bounds for a graph's size symbols, the passes that
make the module runnable, and the callable that pads inputs to their bounds and slices
outputs back (docs/explanation/bounded-dynamism.md).

The compiled program takes every dynamic input padded to its bound plus one `i32` size per
dynamic dimension, and returns padded outputs plus their sizes (`torchtpu-materialize-bounds`).
A size above its bound recompiles once with a larger bound.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import sympy
import torch
import torch.nn.functional as F
import torch.utils._pytree as pytree

from torch_tpu.compiler.importer.dynamic import symbol_bounds_from

from . import config
from ._output_layout import apply_layout, output_layouts

log = logging.getLogger("torch_tpu")

MIN_POW2_BOUND = 16

# Where the padded-buffer form of bounded dynamism is used. Every platform today: XLA:CPU
# has no bounded-dynamic parameters (PadToStatic is unimplemented for them) and torch
# tensors cannot carry a dynamic shape across DLPack on any platform. A TPU runtime that
# passes bounded buffers natively would drop the platform from this set and skip the pass
# (untested: no TPU here).
MATERIALIZE_BOUNDS_PLATFORMS = frozenset({"cpu", "cuda", "tpu"})


def next_pow2(n: int) -> int:
    return 1 << max(int(n) - 1, 0).bit_length()


def policy_bound(size: int) -> int:
    """TORCH_TPU_DYNAMIC_BOUND for a dimension of `size` whose maximum is unknown."""
    raw = (config.get_str("TORCH_TPU_DYNAMIC_BOUND") or "pow2").strip().lower()
    if raw == "pow2":
        return max(next_pow2(size), MIN_POW2_BOUND)
    try:
        fixed = int(raw)
    except ValueError:
        raise ValueError(
            f"TORCH_TPU_DYNAMIC_BOUND={raw!r}: use 'pow2' or a positive integer"
        ) from None
    if fixed <= 0:
        raise ValueError(f"TORCH_TPU_DYNAMIC_BOUND={raw!r}: use 'pow2' or a positive integer")
    return max(fixed, next_pow2(size))


def initial_bounds(gm: torch.fx.GraphModule) -> dict[sympy.Symbol, int]:
    return symbol_bounds_from(gm, policy_bound)


def bounds_passes(platform: str) -> tuple[str, ...]:
    """The pipeline steps that make a bounded module runnable on `platform`."""
    if platform in MATERIALIZE_BOUNDS_PLATFORMS:
        return ("torchtpu-annotate-bounds", "torchtpu-materialize-bounds")
    return ("torchtpu-annotate-bounds",)


def settings_key(bounds: dict[sympy.Symbol, int]) -> str:
    return "bounds=" + ",".join(
        f"{s}:{b}" for s, b in sorted(bounds.items(), key=lambda kv: str(kv[0]))
    )


class DynamicCompiledGraph:
    """Runs a graph compiled at bounds: pads dynamic inputs to their bounds, passes the
    sizes, slices outputs back to their logical sizes. A size above its bound recompiles
    (once per growth) through `recompile(new_bounds)`."""

    def __init__(
        self,
        compiled,
        gm: torch.fx.GraphModule,
        bounds: dict[sympy.Symbol, int],
        recompile: Callable[[dict], Any],
        name: str = "graph",
    ) -> None:
        self.name = name
        self.compiled = compiled
        self.bounds = bounds
        self._recompile = recompile
        imported = compiled.imported
        self._specs = [s for s in imported.inputs if s.role == "input"]
        # Narrowed outputs are views of padded buffers: laid out as eager's (a copy).
        self._layouts = output_layouts(gm, len(imported.outputs))
        # Where each size symbol can be read from the call's arguments.
        self._symbol_sources: dict[sympy.Symbol, tuple[int, int | None]] = {}
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        for i, node in enumerate(placeholders):
            val = node.meta.get("val")
            if isinstance(val, torch.Tensor):
                for d, s in enumerate(val.shape):
                    if isinstance(s, torch.SymInt) and isinstance(s.node.expr, sympy.Symbol):
                        self._symbol_sources.setdefault(s.node.expr, (i, d))
            elif isinstance(val, torch.SymInt) and isinstance(val.node.expr, sympy.Symbol):
                self._symbol_sources.setdefault(val.node.expr, (i, None))

    def _grown_bounds(self, args) -> dict[sympy.Symbol, int] | None:
        grown = dict(self.bounds)
        changed = False
        for sym, (i, d) in self._symbol_sources.items():
            arg = args[i]
            size = int(arg.shape[d]) if d is not None else int(arg)
            if size > grown.get(sym, size):
                grown[sym] = max(next_pow2(size), 2 * grown[sym])
                changed = True
        return grown if changed else None

    def __call__(self, *args):
        grown = self._grown_bounds(args)
        if grown is not None:
            log.warning(
                "torch_tpu: an input size exceeds its compiled bound; recompiling %s with bounds %s "
                "(set torch._dynamo.mark_dynamic(..., max=) or TORCH_TPU_DYNAMIC_BOUND to avoid this)",
                self.name,
                {str(k): v for k, v in grown.items()},
            )
            fresh = self._recompile(grown)
            self.__dict__.update(fresh.__dict__)
        compiled = self.compiled
        padded, sizes = [], []
        for spec, arg in zip(self._specs, args):
            if spec.dynamic_dims and isinstance(arg, torch.Tensor):
                sizes.extend(
                    torch.tensor(arg.shape[d], dtype=torch.int32) for d in spec.dynamic_dims
                )
                arg = _pad_to(arg, spec.shape)
            padded.append(arg)
        inputs = compiled.prepare_inputs(padded)
        results = compiled.executable(*inputs, *sizes)
        outputs = compiled.imported.outputs
        count = compiled.imported.num_results
        size_results = iter(results[count:])
        leaves = []
        for o, layout in zip(outputs, self._layouts):
            if o.kind == "tensor":
                value = results[o.index]
                for d in o.dynamic_dims:
                    value = value.narrow(d, 0, int(next(size_results)))
                leaves.append(apply_layout(value, layout))
            elif o.kind == "symint":
                leaves.append(int(results[o.index]))
            else:
                leaves.append(o.value)
        return pytree.tree_unflatten(leaves, compiled.imported.output_tree)


def _pad_to(t: torch.Tensor, shape) -> torch.Tensor:
    if tuple(t.shape) == tuple(shape):
        return t
    pads: list[int] = []
    for size, bound in reversed(list(zip(t.shape, shape))):
        pads += [0, int(bound) - int(size)]
    return F.pad(t.detach() if not t.requires_grad else t, pads)


__all__ = ["DynamicCompiledGraph", "bounds_passes", "initial_bounds", "policy_bound"]
