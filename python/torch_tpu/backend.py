"""The Dynamo backend "tpu": `torch.compile(model, backend="tpu")`.

Registered through the `torch_dynamo_backends` entry point (pyproject.toml), so it
works without importing torch_tpu. Graphs go through aot_autograd (forward and
backward graphs, functionalized, decomposed with the compiler's one decomposition
table), then each ATen graph is imported, run through the pass pipeline and compiled
by the PjRT runtime. With `options={"functionalize": "torchtpu"}`, inference graphs
skip aot_autograd: their views and in-place ops go to torch_tpu's view passes
(`_inplace.py`, docs/explanation/views.md).
"""

from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass
from typing import Any

import torch

from ._compile import compile_graph

log = logging.getLogger("torch_tpu")

_graph_ids = itertools.count()
_logged_static = False
_KNOWN_OPTIONS = {"functionalize"}


@dataclass(frozen=True)
class BackendOptions:
    """`torch.compile(..., options={...})` for backend "tpu"."""

    # "aot_autograd": aot_autograd functionalizes views and in-place ops.
    # "torchtpu": inference graphs keep them; torch_tpu's view passes resolve them and
    # inputs written in place are updated through donated, aliased results.
    functionalize: str = "aot_autograd"

    @classmethod
    def parse(cls, options: dict | None) -> "BackendOptions":
        options = dict(options or {})
        unknown = set(options) - _KNOWN_OPTIONS
        if unknown:
            raise ValueError(
                f"torch_tpu backend: unknown option(s) {sorted(unknown)}; known: {sorted(_KNOWN_OPTIONS)}"
            )
        parsed = cls(**options)
        if parsed.functionalize not in ("aot_autograd", "torchtpu"):
            raise ValueError(
                f"torch_tpu backend: functionalize={parsed.functionalize!r} is not known; "
                "use 'aot_autograd' (default) or 'torchtpu'"
            )
        return parsed


def _boxed(fn):
    from torch._functorch.aot_autograd import make_boxed_func

    return make_boxed_func(fn)


def _make_compiler(role: str, graph_id: int):
    def compiler(gm: torch.fx.GraphModule, example_inputs):
        compiled = compile_graph(gm, example_inputs, name=f"g{graph_id}-{role}")
        return _boxed(lambda *args: compiled(*args))

    return compiler


def _has_symbolic_shapes(example_inputs) -> bool:
    for x in example_inputs:
        if isinstance(x, (torch.SymInt, torch.SymFloat)):
            return True
        if isinstance(x, torch.Tensor) and any(isinstance(s, torch.SymInt) for s in x.shape):
            return True
    return False


def tpu_backend(gm: torch.fx.GraphModule, example_inputs, options: dict | None = None, **_: Any):
    """Dynamo backend entry point."""
    global _logged_static
    parsed = BackendOptions.parse(options)
    if parsed.functionalize == "torchtpu":
        return _views_backend(gm, example_inputs)
    if _has_symbolic_shapes(example_inputs):
        if not _logged_static:
            _logged_static = True
            log.warning(
                "torch_tpu: dynamic shapes are not supported yet; compiling with static shapes "
                "(dynamic=False is forced) — each new input shape compiles once"
            )
        return _StaticSpecializer(gm)
    return _aot_backend()(gm, example_inputs)


def _views_backend(gm: torch.fx.GraphModule, example_inputs):
    """functionalize="torchtpu": inference graphs only; a graph that needs gradients goes
    through aot_autograd (logged once)."""
    from ._inplace import TorchTpuViewsGraph, log_once

    if torch.is_grad_enabled() and any(isinstance(x, torch.Tensor) and x.requires_grad for x in example_inputs):
        log_once("grad", "torch_tpu: functionalize='torchtpu' applies to inference graphs only; a graph "
                 "that requires gradients uses aot_autograd's functionalization (run under "
                 "torch.no_grad() or torch.inference_mode() to use the torchtpu view passes)")
        return _aot_backend()(gm, example_inputs)
    graph_id = next(_graph_ids)

    def fallback():
        # aot_autograd traces on fake copies; _StaticSpecializer (symbolic shapes only)
        # re-traces with the call's real tensors.
        if _has_symbolic_shapes(example_inputs):
            return _StaticSpecializer(gm)
        return _aot_backend()(gm, example_inputs)

    return TorchTpuViewsGraph(gm, f"g{graph_id}-inference", fallback)


def _aot_backend():
    """aot_autograd with torch_tpu's compilers for one Dynamo graph (forward, backward and
    inference graphs share its id in dump names)."""
    from torch._dynamo.backends.common import AotAutograd

    from torch_tpu.compiler.lowering.decompositions import decomposition_table

    graph_id = next(_graph_ids)
    return AotAutograd(
        fw_compiler=_make_compiler("forward", graph_id),
        bw_compiler=_make_compiler("backward", graph_id),
        inference_compiler=_make_compiler("inference", graph_id),
        decompositions=decomposition_table(),
        # Mutated inputs come back as extra outputs; aot_autograd's epilogue writes them
        # back (functionalize="torchtpu" uses the view passes and buffer donation instead).
        keep_inference_input_mutations=False,
    )


class _StaticSpecializer:
    """For a graph Dynamo traced with symbolic sizes: compile it once per concrete
    input signature (static shapes), as if dynamic=False had been given."""

    def __init__(self, gm: torch.fx.GraphModule) -> None:
        self.gm = gm
        self.compiled: dict[tuple, Any] = {}

    def __call__(self, *args):
        key = tuple(
            (tuple(a.shape), a.dtype, a.requires_grad) if isinstance(a, torch.Tensor) else (type(a), a)
            for a in args
        )
        fn = self.compiled.get(key)
        if fn is None:
            # Fake tracing: a real trace would run the graph's in-place ops on the
            # caller's tensors once more (input mutations applied twice).
            with torch._guards.tracing(None):
                specialized = torch.fx.experimental.proxy_tensor.make_fx(
                    self.gm, tracing_mode="fake", _allow_non_fake_inputs=True)(*args)
            backend = _aot_backend()
            fn = self.compiled[key] = backend(specialized, list(args))
        return fn(*args)
