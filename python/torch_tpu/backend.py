"""The Dynamo backend "tpu": `torch.compile(model, backend="tpu")`.

Registered through the `torch_dynamo_backends` entry point (pyproject.toml), so it
works without importing torch_tpu. Graphs go through aot_autograd (forward and
backward graphs, functionalized, decomposed with the compiler's one decomposition
table), then each ATen graph is imported, run through the pass pipeline and compiled
by the PjRT runtime.
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
_KNOWN_OPTIONS = {"functionalize"}


@dataclass(frozen=True)
class BackendOptions:
    """`torch.compile(..., options={...})` for backend "tpu"."""

    functionalize: str = "aot_autograd"  # or "torchtpu" (view passes; not available yet)

    @classmethod
    def parse(cls, options: dict | None) -> "BackendOptions":
        options = dict(options or {})
        unknown = set(options) - _KNOWN_OPTIONS
        if unknown:
            raise ValueError(
                f"torch_tpu backend: unknown option(s) {sorted(unknown)}; known: {sorted(_KNOWN_OPTIONS)}"
            )
        parsed = cls(**options)
        if parsed.functionalize != "aot_autograd":
            raise ValueError(
                f"torch_tpu backend: functionalize={parsed.functionalize!r} is not available yet; "
                "only 'aot_autograd' is implemented"
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


def tpu_backend(gm: torch.fx.GraphModule, example_inputs, options: dict | None = None, **_: Any):
    """Dynamo backend entry point. Graphs with symbolic sizes (`mark_dynamic`,
    `dynamic=True`) compile once at bounds (bounded dynamism, `_dynamic.py`)."""
    BackendOptions.parse(options)
    return _aot_backend()(gm, example_inputs)


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
        # back (the torchtpu view passes will turn this into buffer donation).
        keep_inference_input_mutations=False,
    )
