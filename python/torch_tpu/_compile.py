"""Compiling one ATen FX graph for the device: import -> passes -> runtime compile,
with graceful fallback to PyTorch eager for ops the converter cannot lower."""

from __future__ import annotations

import logging
import time
import weakref
from typing import Any, Callable

import torch
import torch.fx
import torch.utils._pytree as pytree

from torch_tpu.compiler.context import make_context
from torch_tpu.compiler.diagnostics import DiagnosticEngine
from torch_tpu.compiler.importer import import_graph, is_supported
from torch_tpu.compiler.importer.dynamic import has_symbolic_shapes
from torch_tpu.compiler.importer.locations import describe_node, op_name
from torch_tpu.compiler.lowering import LoweringError, UnsupportedOpError
from torch_tpu.compiler.lowering.registry import DynamicLimit
from torch_tpu.compiler.lowering.collectives import is_collective_node
from torch_tpu.compiler.pipeline import run_pipeline

from . import _timing, config
from ._dump import GraphDump
from ._errors import TorchTpuCompileError
from ._fingerprint import FxGraphFingerprint
from ._precision import current_mode, warn_cost

log = logging.getLogger("torch_tpu")

PIPELINE_VERSION = "1"
_reported_fallbacks: set[str] = set()
_context = None


def _shared_context():
    # One MLIR context per process: creating one costs ~0.2 s; modules are independent.
    global _context
    if _context is None:
        _context = make_context()
    return _context


def pipeline_for(mode: str, before: tuple[str, ...] = (), after: tuple[str, ...] = ()) -> str:
    """The frontend's pipeline: verify, the steps `before`, precision, the steps `after`."""
    # PyTorch's precision setting is authoritative for every matrix op of a graph, so
    # it overrides whatever a lowering chose.
    steps = ("torchtpu-verify", *before, f"torchtpu-set-precision{{mode={mode} override=true}}", *after)
    return f"builtin.module({','.join(steps)})"


class _ResidentParameters:
    """Parameters stay on the device between calls: each nn.Parameter is uploaded once
    and again only when its storage (`data_ptr`) or `_version` changes (an optimizer step,
    `p.data = ...`). Entries hold weak references, so models can be freed."""

    def __init__(self) -> None:
        self._entries: dict[int, tuple] = {}

    def get(self, tensor: torch.Tensor, client):
        key = id(tensor)
        entry = self._entries.get(key)
        pointer, version = tensor.data_ptr(), tensor._version
        if entry is not None and entry[0]() is tensor and entry[1] == pointer and entry[2] == version:
            return entry[3]
        buffer = client.to_device(tensor.detach())
        ref = weakref.ref(tensor, lambda _, k=key: self._entries.pop(k, None))
        self._entries[key] = (ref, pointer, version, buffer)
        return buffer

    def __len__(self) -> int:
        return len(self._entries)


RESIDENT_PARAMETERS = _ResidentParameters()


class CompiledGraph:
    """A callable running one imported graph on the device: torch tensors in, the
    graph's output structure (torch tensors and constants) out."""

    def __init__(self, executable, imported) -> None:
        self.executable = executable
        self.imported = imported
        self._input_specs = [s for s in imported.inputs if s.role == "input"]
        self._needs_rng = any(s.role == "rng_state" for s in imported.inputs)
        self._outputs = imported.outputs
        self._tree = imported.output_tree
        self._client = executable.client

    def __call__(self, *args):
        results = self.executable(*self.prepare_inputs(args))
        leaves = [results[o.index] if o.kind == "tensor" else o.value for o in self._outputs]
        return pytree.tree_unflatten(leaves, self._tree)

    def prepare_inputs(self, args) -> list:
        """The executable's arguments for the graph's inputs `args`."""
        inputs = []
        for spec, arg in zip(self._input_specs, args):
            if isinstance(arg, torch.nn.Parameter):
                arg = RESIDENT_PARAMETERS.get(arg, self._client)
            elif arg is None:
                # aot_autograd's effect tokens are None at run time; in the module they
                # are empty tensors that only order side effects.
                arg = torch.empty(spec.shape, dtype=spec.dtype)
            elif not isinstance(arg, torch.Tensor):
                arg = torch.tensor(arg, dtype=spec.dtype)
            inputs.append(arg)
        if self._needs_rng:
            # Seeded from PyTorch's generator, so torch.manual_seed makes runs repeatable.
            seed = torch.randint(0, 2**62, (2,), dtype=torch.int64).to(torch.uint64)
            inputs.append(seed)
        return inputs


def _fill_placeholder_meta(gm: torch.fx.GraphModule, example_inputs) -> None:
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if example_inputs is None:
        return
    for node, example in zip(placeholders, example_inputs):
        if "val" not in node.meta and example is not None:
            node.meta["val"] = example


def compile_whole_graph(gm: torch.fx.GraphModule, name: str = "graph", symbol_bounds=None):
    """Compiles a graph every node of which has a lowering. Raises LoweringError. A graph
    with symbolic sizes compiles at bounds (`symbol_bounds`, else from its ShapeEnv and
    TORCH_TPU_DYNAMIC_BOUND) and returns a `_dynamic.DynamicCompiledGraph`."""
    from torch_tpu.runtime import get_client

    from . import _dynamic

    if symbol_bounds is None and has_symbolic_shapes(gm):
        symbol_bounds = _dynamic.initial_bounds(gm)

    timings: dict[str, float] = {}
    start = time.perf_counter()
    client = get_client()
    mode = current_mode()
    if client.platform == "tpu":
        warn_cost(mode)
    settings = f"pipeline={PIPELINE_VERSION};precision={mode}"
    if symbol_bounds is not None:
        settings += ";" + _dynamic.settings_key(symbol_bounds)
    fingerprint = FxGraphFingerprint(gm, settings)
    with _timing.phase("convert", timings):
        imported = import_graph(gm, context=_shared_context(), symbol_bounds=symbol_bounds)
    dump = GraphDump(f"{name}-{_short_hash(fingerprint)}")
    if dump.enabled:
        dump.write("fx_graph.py", gm.print_readable(print_output=False))
        dump.write_inputs(imported.inputs)
        dump.write_stage("imported", imported.text(debug_info=True))
    with _timing.phase("passes", timings):
        engine = DiagnosticEngine()
        after = _dynamic.bounds_passes(client.platform) if symbol_bounds is not None else ()
        pipeline = pipeline_for(mode, after=after)
        ok = run_pipeline(imported.module.operation, pipeline, engine)
        if not ok:
            raise TorchTpuCompileError(
                f"torch_tpu: the compiler pipeline failed on graph {name}:\n{engine.format()}\n"
                "Set TORCH_TPU_DUMP_DIR to get the module and reproduce with torchtpu-opt."
            )
    if dump.enabled:
        dump.write("final.mlir", imported.text(debug_info=True))
    with _timing.phase("xla_compile", timings):
        executable = client.compile(imported.module, fingerprint=fingerprint)
    total = time.perf_counter() - start
    slow = float(config.get_str("TORCH_TPU_SLOW_COMPILE_S") or 3.0)
    if total > slow:
        log.info(
            "torch_tpu: compiling %s (%d nodes) took %.1fs: %s", name, imported.node_count, total,
            ", ".join(f"{k} {v:.2f}s" for k, v in timings.items()),
        )
    compiled = CompiledGraph(executable, imported)
    if symbol_bounds is None:
        return compiled
    return _dynamic.DynamicCompiledGraph(
        compiled, gm, symbol_bounds, lambda bounds: compile_whole_graph(gm, name, bounds), name
    )


def _short_hash(fingerprint: FxGraphFingerprint) -> str:
    import xxhash

    shapeless, dims = fingerprint.cache_fingerprint()
    return xxhash.xxh3_64_hexdigest(shapeless + b"|" + dims)[:12]


def _report_fallback(node: torch.fx.Node, reason: str) -> None:
    name = op_name(node)
    documented = isinstance(reason, DynamicLimit)
    if config.get_bool("TORCH_TPU_STRICT"):
        advice = "or mark the dimension static" if documented else "or report the op to torch_tpu"
        raise TorchTpuCompileError(
            f"torch_tpu: {describe_node(node)}: {reason} (TORCH_TPU_STRICT=1 forbids falling back "
            f"to PyTorch eager; unset it to run this op in eager, {advice})"
        )
    if name not in _reported_fallbacks:
        _reported_fallbacks.add(name)
        if documented:
            # A limit of bounded dynamism (docs/explanation/bounded-dynamism.md), not a
            # missing lowering: nothing to report.
            log.warning("torch_tpu: %s cannot be compiled (%s).", name, reason)
            return
        log.warning(
            "torch_tpu: %s cannot be compiled (%s); it runs in PyTorch eager. Please report "
            "the op name to the torch_tpu issue tracker so it gets a lowering.", name, reason,
        )


class _CompiledSubmodule(torch.nn.Module):
    def __init__(self, compiled: CompiledGraph) -> None:
        super().__init__()
        self.compiled = compiled

    def forward(self, *args):
        return self.compiled(*args)


def compile_graph(gm: torch.fx.GraphModule, example_inputs=None, name: str = "graph") -> Callable[..., Any]:
    """Compiles `gm` (an ATen graph with meta['val'] on its nodes). Nodes without a
    lowering, or whose lowering rejects their arguments, run in PyTorch eager; the rest
    runs compiled."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    # aot_autograd may call compilers with its FakeTensorMode active; constants baked
    # into the module are real tensors and must be read as such.
    with unset_fake_temporarily():
        return _compile_graph(gm, example_inputs, name)


def _compile_graph(gm: torch.fx.GraphModule, example_inputs, name: str) -> Callable[..., Any]:
    _fill_placeholder_meta(gm, example_inputs)
    rejected: dict[str, str] = {}
    for node in gm.graph.nodes:
        if node.op == "call_function" and not is_supported(node):
            rejected[node.name] = _unsupported_reason(node)
        elif node.op == "call_function" and is_collective_node(node):
            rejected[node.name] = "collectives run through torch.distributed in a one-device graph (see torch_tpu.spmd)"
    # A lowering may still reject specific arguments; retry with that node in eager.
    for _ in range(64):
        try:
            if not rejected:
                return compile_whole_graph(gm, name)
            return _compile_partitioned(gm, rejected, name)
        except LoweringError as err:
            if err.node is None:
                raise
            if err.node.name in rejected:
                # An eager node's result cannot enter a compiled part (a size of it has no
                # finite bound, say): its consumers run in eager as well.
                users = [u for u in err.node.users if u.op == "call_function" and u.name not in rejected]
                if not users:
                    raise
                reason = f"its input {err.node.name} cannot be compiled ({err.reason})"
                if isinstance(err.reason, DynamicLimit):
                    reason = DynamicLimit(reason)
                for user in users:
                    rejected[user.name] = reason
                continue
            rejected[err.node.name] = err.reason if not isinstance(err, UnsupportedOpError) else "no lowering for this op"
    raise TorchTpuCompileError(f"torch_tpu: too many ops of graph {name} fell back to eager")


def _unsupported_reason(node: torch.fx.Node) -> str:
    val = node.meta.get("val")
    if not isinstance(node.target, torch._ops.OpOverload) and isinstance(val, (torch.SymInt, torch.SymFloat)):
        # A Python function on symbolic sizes (math.trunc of a scale times a size): the
        # graph computes it in eager and passes the result in.
        return DynamicLimit(
            "a Python function on symbolic sizes is not lowered with bounded dynamism; it runs in eager"
        )
    return "no lowering for this op"


def _compile_partitioned(gm: torch.fx.GraphModule, rejected: dict[str, str], name: str):
    from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
    from torch.fx.passes.operator_support import OperatorSupport

    for node in gm.graph.nodes:
        if node.name in rejected:
            _report_fallback(node, rejected[node.name])

    class _Support(OperatorSupport):
        def is_node_supported(self, submodules, node: torch.fx.Node) -> bool:
            return node.op == "call_function" and node.name not in rejected and is_supported(node)

    # Partition a copy: a retry after a rejected lowering starts from the original graph.
    copy = torch.fx.GraphModule(gm, _copy_graph(gm.graph))
    partitioner = CapabilityBasedPartitioner(copy, _Support(), allows_single_node_partition=True)
    fused = partitioner.fuse_partitions(partitioner.propose_partitions())
    for node in list(fused.graph.nodes):
        if node.op != "call_module":
            continue
        sub = getattr(fused, node.target)
        placeholders = [p for p in sub.graph.nodes if p.op == "placeholder"]
        for p, arg in zip(placeholders, node.args):
            if isinstance(arg, torch.fx.Node) and "val" in arg.meta:
                p.meta["val"] = arg.meta["val"]
        try:
            compiled = compile_whole_graph(sub, f"{name}-{node.target}")
        except LoweringError as err:
            # Map the failing node back to the parent graph by name.
            raise LoweringError(err.reason, _find(gm, err.node.name if err.node else "")) from err
        setattr(fused, node.target, _CompiledSubmodule(compiled))
    fused.recompile()
    return fused


def _copy_graph(graph: torch.fx.Graph) -> torch.fx.Graph:
    new = torch.fx.Graph()
    env: dict = {}
    out = new.graph_copy(graph, env)
    new.output(out)
    for old, copied in env.items():
        copied.name = old.name
        copied.meta = dict(old.meta)
    return new


def _find(gm: torch.fx.GraphModule, name: str) -> torch.fx.Node | None:
    for node in gm.graph.nodes:
        if node.name == name:
            return node
    return None
