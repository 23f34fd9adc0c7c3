"""Bounded dynamism in the frontend: bounds for a graph's size symbols, the passes that
make the module runnable, and the callable that pads inputs to their bounds and slices
outputs back (docs/explanation/bounded-dynamism.md).

The compiled program takes every dynamic input padded to its bound plus one `i32` size per
dynamic dimension, and returns padded outputs plus their sizes (`torchtpu-materialize-bounds`).
A size above its bound recompiles once with a larger bound.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import sympy
import torch
import torch.nn.functional as F
import torch.utils._pytree as pytree

from torch_tpu.compiler.importer.dynamic import symbol_bounds_from

from ..core import config
from ._dynamic_alias import plan_views, rebuild
from ..program.output_layout import apply_layout, output_layouts
from ..program.protocols import precision_sensitive

log = logging.getLogger("torch_tpu")

MIN_POW2_BOUND = 16

# Where the padded-buffer form of bounded dynamism is used. Every platform today: XLA:CPU
# has no bounded-dynamic parameters (PadToStatic is unimplemented for them) and torch
# tensors cannot carry a dynamic shape across DLPack on any platform. A TPU runtime that
# passes bounded buffers natively would drop the platform from this set and skip the pass
# (untested: no TPU here).
MATERIALIZE_BOUNDS_PLATFORMS = frozenset({"cpu", "cuda", "tpu"})


def mark_dynamic(
    tensor: torch.Tensor, dim: int | Sequence[int], *, max: int, min: int | None = None  # noqa: A002
) -> None:
    """Marks `tensor`'s dimension(s) `dim` dynamic, every size in [min, max] served by one
    compile at bound `max` (docs/explanation/bounded-dynamism.md):

        torch_tpu.mark_dynamic(ids, 1, max=512)        # lengths 1..512, one compile

    Wraps `torch._dynamo.mark_dynamic` with what PyTorch 2.13 needs for that to hold:
    a `min` (without one Dynamo fails with "not simple sympy type NoneType"; default 1),
    and for a `min` below 2 `torch.fx.experimental._config.backed_size_oblivious = True`
    (process-wide; without it Dynamo specializes size 1 and a size-1 input raises
    ConstraintViolationError). Call it before each call with a new tensor, as with
    `torch._dynamo.mark_dynamic`."""
    dims = [dim] if isinstance(dim, int) else list(dim)
    if not dims or not all(isinstance(d, int) for d in dims):
        raise TypeError(f"torch_tpu.mark_dynamic: dim must be an int or a list of ints, got {dim!r}")
    low = 1 if min is None else int(min)
    if isinstance(max, bool) or not isinstance(max, int) or max < 2:
        raise ValueError(f"torch_tpu.mark_dynamic: max must be an int >= 2, got {max!r}")
    if low < 0 or low >= max:
        raise ValueError(f"torch_tpu.mark_dynamic: need 0 <= min < max, got min={low}, max={max}")
    for d in dims:
        if not -tensor.dim() <= d < tensor.dim():
            raise IndexError(f"torch_tpu.mark_dynamic: dim {d} is out of range for a {tensor.dim()}-d tensor")
    if low < 2:
        _allow_size_one()
    for d in dims:
        torch._dynamo.mark_dynamic(tensor, d % tensor.dim(), min=low, max=max)


def _allow_size_one() -> None:
    import torch.fx.experimental._config as fx_config

    if not fx_config.backed_size_oblivious:
        fx_config.backed_size_oblivious = True
        log.info(
            "torch_tpu.mark_dynamic: set torch.fx.experimental._config.backed_size_oblivious = True "
            "so that size 1 shares the dynamic graph (PyTorch would specialize it)"
        )


def next_pow2(n: int) -> int:
    return 1 << max(int(n) - 1, 0).bit_length()


def policy_bound(size: int) -> int:
    """TORCH_TPU_DYNAMIC_BOUND for a dimension of `size` whose maximum is unknown."""
    bound = config.get("TORCH_TPU_DYNAMIC_BOUND")  # "pow2" or a positive int
    if bound == "pow2":
        return max(next_pow2(size), MIN_POW2_BOUND)
    return max(bound, next_pow2(size))


def initial_bounds(gm: torch.fx.GraphModule) -> dict[sympy.Symbol, int]:
    return symbol_bounds_from(gm, policy_bound)


def bounds_mode(platform: str) -> str:
    """The `bounds` option of the compile pipeline that makes a bounded module runnable
    on `platform`."""
    return "materialize" if platform in MATERIALIZE_BOUNDS_PLATFORMS else "annotate"


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
        # How warnings name each symbol for users: Dynamo's source (`L['ids'].size()[1]`).
        self._symbol_names: dict[sympy.Symbol, str] = {}
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        for i, node in enumerate(placeholders):
            val = node.meta.get("val")
            if isinstance(val, torch.Tensor):
                for d, s in enumerate(val.shape):
                    if isinstance(s, torch.SymInt) and isinstance(s.node.expr, sympy.Symbol):
                        self._symbol_sources.setdefault(s.node.expr, (i, d))
                        self._symbol_names.setdefault(s.node.expr, _describe_size(s, f"input {i} ({node.name}) dim {d}"))
            elif isinstance(val, torch.SymInt) and isinstance(val.node.expr, sympy.Symbol):
                self._symbol_sources.setdefault(val.node.expr, (i, None))
                self._symbol_names.setdefault(val.node.expr, _describe_size(val, f"input {i} ({node.name})"))
        # Outputs that are views of an input or of another output: eager's views, rebuilt
        # at each call's sizes (aot_autograd regenerates them from their metadata).
        self._views = plan_views(gm, len(imported.outputs), set(self._symbol_sources))


    @property
    def precision_sensitive(self) -> bool:
        """The graph compiled at the current bounds' (`program.protocols.PrecisionAware`)."""
        return precision_sensitive(self.compiled)

    def _grown_bounds(self, args) -> tuple[dict[sympy.Symbol, int], list[str]] | None:
        """The bounds to recompile with when a size exceeds its bound, and what grew
        (named for users), or None."""
        grown = dict(self.bounds)
        growth: list[str] = []
        for sym, (i, d) in self._symbol_sources.items():
            arg = args[i]
            size = int(arg.shape[d]) if d is not None else int(arg)
            if size > grown.get(sym, size):
                old = grown[sym]
                grown[sym] = max(next_pow2(size), 2 * old)
                growth.append(f"{self._symbol_names.get(sym, sym)}: size {size} > bound {old}, new bound {grown[sym]}")
        return (grown, growth) if growth else None

    def __call__(self, *args):
        grown = self._grown_bounds(args)
        if grown is not None:
            grown, growth = grown
            log.warning(
                "torch_tpu: an input size exceeds its compiled bound; recompiling %s (%s). To "
                "compile once, give the largest size: torch_tpu.mark_dynamic(tensor, dim, max=...), "
                "or TORCH_TPU_DYNAMIC_BOUND=<size>",
                self.name, "; ".join(growth),
            )
            fresh = self._recompile(grown)
            self.__dict__.update(fresh.__dict__)
        compiled = self.compiled
        padded, sizes = pad_to_bounds(self._specs, args)
        inputs = compiled.prepare_inputs(padded)
        results = compiled.invoker.run([*inputs, *sizes])  # tpu tensors stay on the device
        outputs = compiled.imported.outputs
        leaves = narrow_to_sizes(results, outputs, compiled.imported.num_results)
        leaves = [apply_layout(leaf, layout) if o.kind == "tensor" else leaf
                  for leaf, o, layout in zip(leaves, outputs, self._layouts)]
        if self._views:
            leaves = rebuild(leaves, self._views, args, self._symbol_values(args))
        return pytree.tree_unflatten(leaves, compiled.imported.output_tree)

    def _symbol_values(self, args) -> dict[sympy.Symbol, int]:
        return {sym: int(args[i].shape[d]) if d is not None else int(args[i])
                for sym, (i, d) in self._symbol_sources.items()}


def pad_to_bounds(specs, args) -> tuple[list, list[torch.Tensor]]:
    """The padded layout of a bounded module's inputs (`torchtpu-materialize-bounds`):
    each argument with dynamic dims (`specs[i].dynamic_dims`) padded with zeros to its
    bounds (`specs[i].shape`), and one i32 size per dynamic dim, in argument order, to
    pass after the other arguments."""
    padded, sizes = [], []
    for spec, arg in zip(specs, args):
        if spec.dynamic_dims and isinstance(arg, torch.Tensor):
            sizes.extend(torch.tensor(arg.shape[d], dtype=torch.int32) for d in spec.dynamic_dims)
            arg = _pad_to(arg, spec.shape)
        padded.append(arg)
    return padded, sizes


def narrow_to_sizes(results: Sequence, outputs: Sequence, num_results: int) -> list:
    """The output leaves of a bounded module's `results`: padded tensors narrowed to the
    sizes it returns after its `num_results` results, symbolic sizes as ints, constants."""
    size_results = iter(results[num_results:])
    leaves = []
    for o in outputs:
        if o.kind == "tensor":
            value = results[o.index]
            for d in o.dynamic_dims:
                value = value.narrow(d, 0, int(next(size_results)))
            leaves.append(value)
        elif o.kind == "symint":
            leaves.append(int(results[o.index]))
        else:
            leaves.append(o.value)
    return leaves


def _describe_size(size: torch.SymInt, fallback: str) -> str:
    """Dynamo's name for a size symbol (`L['ids'].size()[1]`), else `fallback`."""
    try:
        sources = size.node.shape_env.var_to_sources.get(size.node.expr) or []
        if not sources:
            return fallback
        name = sources[0].name  # a property in torch 2.13, a method before
        return str(name() if callable(name) else name)
    except Exception:  # noqa: BLE001 - a ShapeEnv without sources (graphs built by hand)
        return fallback


def _pad_to(t: torch.Tensor, shape) -> torch.Tensor:
    if tuple(t.shape) == tuple(shape):
        return t
    pads: list[int] = []
    for size, bound in reversed(list(zip(t.shape, shape))):
        pads += [0, int(bound) - int(size)]
    return F.pad(t.detach() if not t.requires_grad else t, pads)


__all__ = [
    "DynamicCompiledGraph", "bounds_mode", "initial_bounds", "mark_dynamic", "narrow_to_sizes",
    "pad_to_bounds", "policy_bound",
]
