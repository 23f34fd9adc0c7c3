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

import functools
import itertools
import logging
import os
import re
from dataclasses import dataclass
from typing import Any

import torch

from . import _dynamo_funcnames, _dynamo_local_map, _dynamo_optimizer
from ._aliasing_prims import decompose_aliasing_prims
from ._compile import STARTS_STEP, compile_graph
from ._input_writes import take_input_writes, with_input_writes
from ._saved_inputs import take_saved_inputs, with_saved_inputs
from ._tensor_index import rewrite_scalar_tensor_indices
from ._view_graphs import only_views

log = logging.getLogger("torch_tpu")

# Dynamo resolves backend "tpu" (importing this module) before it traces: its trace-log
# headers stop tokenizing source files while those logs are off (_dynamo_funcnames.py).
_dynamo_funcnames.install()
# ... and its check for local_map-wrapped functions stops importing context parallelism
# (_dynamo_local_map.py).
_dynamo_local_map.install()
# ... and its compiled optimizer steps keep step counts on the tpu device, as on CUDA
# (_dynamo_optimizer.py).
_dynamo_optimizer.install()

_graph_ids = itertools.count()
_KNOWN_OPTIONS = {"functionalize", "partitioner"}
_PARTITIONERS = ("min_cut", "default")


@dataclass(frozen=True)
class BackendOptions:
    """`torch.compile(..., options={...})` for backend "tpu"."""

    # "aot_autograd": aot_autograd functionalizes views and in-place ops.
    # "torchtpu": inference graphs keep them; torch_tpu's view passes resolve them and
    # inputs written in place are updated through donated, aliased results.
    functionalize: str = "aot_autograd"
    # How aot_autograd splits a training graph into forward and backward programs:
    # "min_cut" (inductor's default too) recomputes cheap elementwise work in the backward
    # where that saves fewer bytes than keeping its result (on the chip, a training step's
    # forward wrote every f32 norm intermediate and the f32 log-softmax of the logits to
    # HBM for the backward to read back: docs/explanation/performance.md); "default" saves
    # every intermediate the backward reads.
    partitioner: str = "min_cut"

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
        if parsed.partitioner not in _PARTITIONERS:
            raise ValueError(
                f"torch_tpu backend: partitioner={parsed.partitioner!r} is not known; "
                "use 'min_cut' (default: recompute cheap elementwise work in the backward) or "
                "'default' (save every intermediate the backward reads)"
            )
        return parsed


def _boxed(fn):
    from torch._functorch.aot_autograd import make_boxed_func

    return make_boxed_func(fn)


def _traced_function() -> str:
    """The qualified name of the Python function Dynamo is tracing (`Model.forward`), as a
    safe file name (dump folders are named after graphs); "" outside a Dynamo trace (tests
    calling the backend directly)."""
    from torch._guards import TracingContext

    codes = getattr(TracingContext.try_get(), "traced_code", None) or []
    if not codes:
        return ""
    code = codes[0]
    qualname = getattr(code, "co_qualname", code.co_name).replace(".<locals>", "")  # 3.11+
    return re.sub(r"[^A-Za-z0-9_.]+", "_", qualname).strip("_")


def _graph_name(source: str, graph_id: int, role: str) -> str:
    """`Model.forward-g3-forward`: the traced function (so cache listings and dumps say
    which code a graph came from), the graph's id and its role."""
    return f"{source}-g{graph_id}-{role}" if source else f"g{graph_id}-{role}"


def _placeholder_sources(gm: torch.fx.GraphModule) -> list[str | None]:
    """The Python source Dynamo recorded for each input of its graph
    (`L['self']._modules['fc']._parameters['weight']`), None where there is none."""
    sources = []
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            grapharg = node.meta.get("grapharg")
            source = getattr(grapharg, "source", None)
            sources.append(source.name if source is not None and hasattr(source, "name") else None)
    return sources


def _record_sources(gm: torch.fx.GraphModule, sources: list[str | None]) -> None:
    """Maps aot_autograd's inputs to Dynamo's sources through their descriptors
    (`PlainAOTInput(idx=k)`: the k-th input of Dynamo's graph), for dumps."""
    from ..program.dump import ARGUMENT_SOURCES

    mapping = {}
    for node in gm.graph.nodes:
        index = getattr(node.meta.get("desc"), "idx", None) if node.op == "placeholder" else None
        if isinstance(index, int) and 0 <= index < len(sources) and sources[index] is not None:
            mapping[node.name] = sources[index]
    gm.meta[ARGUMENT_SOURCES] = mapping


def _make_compiler(role: str, graph_id: int, source: str, sources: list[str | None] | None = None,
                   direct: dict | None = None):
    """`direct`: for the inference compiler, receives the compiled graph under "inference"
    when aot_autograd's runtime wrappers would do nothing for it (`_wrappers_are_noops`)."""

    def compiler(gm: torch.fx.GraphModule, example_inputs):
        if role == "inference" and only_views(gm):
            return _boxed(gm)  # nothing to compute: eager views read no value (`_view_graphs.py`)
        if sources:
            _record_sources(gm, sources)
        taken, written = [], []
        if role in ("forward", "backward"):
            gm.meta[STARTS_STEP] = role
        if role == "forward":
            _mark_visible_outputs(gm)
            taken = take_saved_inputs(gm)
        if role != "backward":
            from ._dynamic_alias import ALIASES_REPLAYED

            # After take_saved_inputs: the writes' new values are appended after the
            # outputs whose positions it recorded.
            written = take_input_writes(gm)
            gm.meta[ALIASES_REPLAYED] = True
        compiled = compile_graph(gm, example_inputs, name=_graph_name(source, graph_id, role), input_writes=written)
        if taken:
            compiled = with_saved_inputs(compiled, taken)
        if written:
            compiled = with_input_writes(compiled, written)
        if direct is not None and _wrappers_are_noops(gm, len(sources or ())):
            direct["inference"] = compiled
        return _boxed(lambda *args: compiled(*args))

    return compiler


def _wrappers_are_noops(gm: torch.fx.GraphModule, dynamo_inputs: int) -> bool:
    """Whether aot_autograd's runtime wrappers around an inference graph would only pass
    arguments in and results out, so Dynamo may call the compiled graph directly: no
    input mutation to write back, no output aliasing an input or an intermediate to
    regenerate, no effect tokens, RNG offsets, tensor subclasses, dynamic output dims or
    grad-mode change, autocast off (the wrapper would disable it), and the graph takes
    exactly Dynamo's inputs (no deduplicated or synthetic-base arguments, no lifted
    parameters)."""
    from torch._guards import TracingContext

    meta = getattr(TracingContext.try_get(), "fw_metadata", None)
    if meta is None:
        return False
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    values = [n.meta.get("val") for n in placeholders]
    return (
        len(placeholders) == dynamo_inputs
        and all(isinstance(v, torch.Tensor) and not _has_symbolic_size(v) for v in values)
        and meta.num_mutated_inp_runtime_indices == 0
        and meta.num_outputs_aliased == 0
        and meta.num_intermediate_bases == 0
        and meta.num_outputs_rng_offset == 0
        and not meta.tokens
        and not meta.dynamic_outputs
        and meta.grad_enabled_mutation is None
        and all(type(m).__name__ == "PlainTensorMeta" or isinstance(m, int) for m in meta.subclass_inp_meta)
        and not torch._C._is_any_autocast_enabled()
    )


def _has_symbolic_size(value: torch.Tensor) -> bool:
    return any(isinstance(d, torch.SymInt) for d in value.shape)


def _mark_visible_outputs(gm: torch.fx.GraphModule) -> None:
    """How many outputs of an aot_autograd forward graph the user sees (the rest are saved
    for the backward): outputs the user sees get eager's strides (`_output_layout`)."""
    from torch._guards import TracingContext

    from ..program.output_layout import VISIBLE_OUTPUTS

    metadata = getattr(TracingContext.try_get(), "fw_metadata", None)
    visible = getattr(metadata, "num_forward_returns", None)
    if isinstance(visible, int):
        gm.meta[VISIBLE_OUTPUTS] = visible


def tpu_backend(gm: torch.fx.GraphModule, example_inputs, options: dict | None = None, **_: Any):
    """Dynamo backend entry point. Graphs with symbolic sizes (`mark_dynamic`,
    `dynamic=True`) compile once at bounds (bounded dynamism, `_dynamic.py`).

    `options` (`torch.compile(..., options={...})`):
    `functionalize`: "aot_autograd" (default) or "torchtpu" (inference graphs keep views
    and in-place ops for torch_tpu's view passes; docs/explanation/views.md);
    `partitioner`: "min_cut" (default, as inductor: the backward recomputes cheap
    elementwise work instead of reading it back from memory) or "default" (the forward
    saves every intermediate the backward reads)."""
    parsed = BackendOptions.parse(options)
    decompose_aliasing_prims(gm)  # aot_autograd rejects prims returning views
    rewrite_scalar_tensor_indices(gm)  # x[:, pos] with a 0-d pos: a run-time position
    if parsed.functionalize == "torchtpu":
        return _views_backend(gm, example_inputs, parsed)
    return _compile_with_aot(gm, example_inputs, parsed)


def _compile_with_aot(gm: torch.fx.GraphModule, example_inputs, options: BackendOptions):
    """aot_autograd's compiled function, or, for an inference graph whose runtime wrappers
    would be no-ops (`_wrappers_are_noops`), our compiled graph itself: Dynamo then calls
    it without aot_autograd's wrapper layers (measured in bench/overhead.py)."""
    direct: dict = {}
    wrapped = _aot_backend(gm, options, direct)(gm, example_inputs)
    compiled = direct.get("inference")
    if compiled is None:
        return wrapped
    return torch._dynamo.disable(compiled, reason="do not trace a torch_tpu compiled graph")


def _views_backend(gm: torch.fx.GraphModule, example_inputs, options: BackendOptions):
    """functionalize="torchtpu": inference graphs only; a graph that needs gradients goes
    through aot_autograd (logged once)."""
    from ._inplace import TorchTpuViewsGraph, log_once

    if torch.is_grad_enabled() and any(isinstance(x, torch.Tensor) and x.requires_grad for x in example_inputs):
        log_once("grad", "torch_tpu: functionalize='torchtpu' applies to inference graphs only; a graph "
                 "that requires gradients uses aot_autograd's functionalization (run under "
                 "torch.no_grad() or torch.inference_mode() to use the torchtpu view passes)")
        return _aot_backend(gm, options)(gm, example_inputs)
    graph_id = next(_graph_ids)

    symbolic = any(
        isinstance(x, (torch.SymInt, torch.SymFloat))
        or (isinstance(x, torch.Tensor) and any(isinstance(d, torch.SymInt) for d in x.shape))
        for x in example_inputs
    )

    def fallback(args):
        # Symbolic example inputs belong to Dynamo's trace, over by now: use the call's.
        return _aot_backend(gm, options)(gm, list(args) if symbolic else example_inputs)

    return TorchTpuViewsGraph(gm, _graph_name(_traced_function(), graph_id, "inference"), fallback)


def _aot_backend(dynamo_gm: torch.fx.GraphModule, options: BackendOptions, direct: dict | None = None):
    """aot_autograd with torch_tpu's compilers for one Dynamo graph (forward, backward and
    inference graphs share its id in dump names). `direct`: see `_make_compiler`."""
    from torch._functorch.partitioners import default_partition, min_cut_rematerialization_partition

    from torch_tpu.compiler.lowering.decompositions import tracing_decompositions

    graph_id = next(_graph_ids)
    # Read now: the backward graph compiles later, outside Dynamo's tracing context.
    source = _traced_function()
    sources = _placeholder_sources(dynamo_gm)
    return functools.partial(
        aot_compile,
        fw_compiler=_make_compiler("forward", graph_id, source, sources),
        bw_compiler=_make_compiler("backward", graph_id, source),
        inference_compiler=_make_compiler("inference", graph_id, source, sources, direct),
        decompositions=tracing_decompositions(),
        partition_fn=min_cut_rematerialization_partition if options.partitioner == "min_cut" else default_partition,
        # Writes into inputs stay in the graph (as in inductor): an inference graph's, and a
        # training forward's into inputs without gradients (BatchNorm's running statistics);
        # they become results the compiled graph writes back (`_input_writes.py`).
        keep_inference_input_mutations=True,
    )


def aot_compile(gm: torch.fx.GraphModule, example_inputs, **aot_options):
    """What Dynamo's `AotAutograd` backend helper does with `aot_options`, without the
    import it makes of `torch._inductor.debug` (much of inductor: 0.16 s CPU, 0.2-0.35 s wall
    on the first compile of a process, measured on a 2-core machine; bench/first_call.py)
    for a logging context that only acts under TORCH_COMPILE_DEBUG=1; with that set,
    `AotAutograd` itself runs. As there:
    nested inputs are flattened first, the backward compiler and the graphs it makes are
    never traced by Dynamo, and aot_autograd's counters are kept."""
    from torch._dynamo import disable
    from torch._dynamo.backends.common import AotAutograd
    from torch._dynamo.exc import TensorifyScalarRestartAnalysis
    from torch._dynamo.utils import counters, flatten_graph_inputs
    from torch._functorch.aot_autograd import aot_module_simplified

    if os.environ.get("TORCH_COMPILE_DEBUG", "0") == "1":
        return AotAutograd(**aot_options)(gm, example_inputs)
    if any(isinstance(x, (list, tuple, dict)) for x in example_inputs):
        return flatten_graph_inputs(gm, example_inputs, functools.partial(aot_compile, **aot_options))
    counters["aot_autograd"]["total"] += 1
    bw_compiler = aot_options["bw_compiler"]

    def compile_backward(*args, **kwargs):
        compiled = disable(bw_compiler, reason="do not trace backward compiler function")(*args, **kwargs)
        return disable(compiled, reason="do not trace generated backwards pass")

    try:
        compiled = aot_module_simplified(gm, example_inputs, **{**aot_options, "bw_compiler": compile_backward})
    except TensorifyScalarRestartAnalysis:
        raise
    except Exception:
        counters["aot_autograd"]["not_ok"] += 1
        raise
    counters["aot_autograd"]["ok"] += 1
    return disable(compiled, reason="do not trace AOT-compiled graph")
