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
from torch_tpu.compiler.fx_locations import describe_node, op_name
from torch_tpu.compiler.importer.storage_views import rebase_storage_views
from torch_tpu.compiler.lowering import LoweringError
from torch_tpu.compiler.lowering.collectives import is_collective_node
from torch_tpu.compiler.passes.set_precision import has_matrix_ops
from torch_tpu.compiler.pipelines import named_pipeline

from torch_tpu.runtime.errors import CompileError

from . import _fallback_reasons as fallback_reasons
from . import _recovery, _timing
from .core import config
from ._dump import ARGUMENT_SOURCES, GraphDump
from ._errors import TorchTpuCompileError
from ._fallback_reasons import FallbackReason
from ._fingerprint import FxGraphFingerprint
from ._output_layout import apply_layout, output_layouts
from ._precision import current_mode, warn_cost
from ._process_groups import process_groups_of

log = logging.getLogger("torch_tpu")

_reported_fallbacks: set[tuple[str, str]] = set()
_context = None


def _shared_context():
    # One MLIR context per process: creating one costs ~0.2 s; modules are independent.
    global _context
    if _context is None:
        _context = make_context()
    return _context


def pipeline_for(mode: str, bounds: str = "none") -> str:
    """The frontend's pipeline for a graph: `torchtpu-compile-pipeline` (compiler/pipelines.py)."""
    return named_pipeline("torchtpu-compile-pipeline", precision=mode, bounds=bounds)


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
    graph's output structure (torch tensors and constants) out. `precision_sensitive`:
    the module has matrix ops, so its program depends on the precision mode."""

    def __init__(self, executable, imported, precision_sensitive: bool = True) -> None:
        self.executable = executable
        self.imported = imported
        self.precision_sensitive = precision_sensitive
        self._input_specs = [s for s in imported.inputs if s.role == "input"]
        self._needs_rng = any(s.role == "rng_state" for s in imported.inputs)
        self._outputs = imported.outputs
        self._tree = imported.output_tree
        self._client = executable.client
        self._layouts: list | None = None

    def set_output_layouts(self, layouts: list) -> None:
        """Eager's layout per output leaf (`_output_layout`); results come back row-major,
        so only outputs eager lays out otherwise are copied."""
        layouts = [layout if isinstance(layout, tuple) else None for layout in layouts]
        self._layouts = layouts if any(layout is not None for layout in layouts) else None

    def __call__(self, *args):
        results = self.executable(*self.prepare_inputs(args))
        leaves = [results[o.index] if o.kind == "tensor" else o.value for o in self._outputs]
        if self._layouts is not None:
            leaves = [
                apply_layout(leaf, layout) if layout is not None else leaf
                for leaf, layout in zip(leaves, self._layouts)
            ]
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
    warn_cost(mode, client.platform)
    # The compiler's own code and versions are in the runtime's options key
    # (runtime.fingerprint.toolchain_fingerprint): the settings are this graph's choices.
    settings = f"precision={mode}"
    if symbol_bounds is not None:
        settings += ";" + _dynamic.settings_key(symbol_bounds)
    fingerprint = FxGraphFingerprint(gm, settings)
    dump = GraphDump(f"{name}-{_short_hash(fingerprint)}")
    if dump.enabled:
        dump.write("fx_graph.py", gm.print_readable(print_output=False))
    with _timing.phase("convert", timings):
        try:
            imported = import_graph(
                gm, context=_shared_context(), symbol_bounds=symbol_bounds, process_groups=process_groups_of(gm)
            )
        except LoweringError as err:
            dump.write_error("importing the graph", str(err))
            raise
    with _timing.phase("passes", timings):
        engine = DiagnosticEngine()
        bounds = _dynamic.bounds_mode(client.platform) if symbol_bounds is not None else "none"
        pipeline = pipeline_for(mode, bounds)
        ok = dump.run_pipeline(imported.module.operation, pipeline, engine)
        if not ok:
            raise TorchTpuCompileError(
                f"torch_tpu: the compiler pipeline failed on graph {name}:\n{engine.format()}\n"
                "Set TORCH_TPU_DUMP_DIR to get the module and reproduce with torchtpu-opt.",
                engine.diagnostics,
            )
    dump.write_inputs(imported.module.operation, imported.inputs, gm.meta.get(ARGUMENT_SOURCES))
    with _timing.phase("xla_compile", timings):
        executable = client.compile(imported.module, fingerprint=fingerprint, name=name)
    total = time.perf_counter() - start
    _report_slow_compile(name, imported.node_count, total, timings)
    compiled = CompiledGraph(executable, imported, has_matrix_ops(imported.module.operation))
    if symbol_bounds is None:
        compiled.set_output_layouts(output_layouts(gm, len(imported.outputs)))
        return compiled
    return _dynamic.DynamicCompiledGraph(
        compiled, gm, symbol_bounds, lambda bounds: compile_whole_graph(gm, name, bounds), name
    )


def _report_slow_compile(name: str, node_count: int, total: float, timings: dict[str, float]) -> None:
    """A compile slower than TORCH_TPU_SLOW_COMPILE_S is a WARNING (users see it by default:
    it explains a pause); faster ones are logged at DEBUG."""
    slow = config.get("TORCH_TPU_SLOW_COMPILE_S")
    level = logging.WARNING if total > slow else logging.DEBUG
    log.log(
        level, "torch_tpu: compiling %s (%d nodes) took %.1fs: %s", name, node_count, total,
        ", ".join(f"{k} {v:.2f}s" for k, v in timings.items()),
    )


def _short_hash(fingerprint: FxGraphFingerprint) -> str:
    import xxhash

    shapeless, dims = fingerprint.cache_fingerprint()
    return xxhash.xxh3_64_hexdigest(shapeless + b"|" + dims)[:12]


def _report_fallback(node: torch.fx.Node, reason: FallbackReason) -> None:
    name = op_name(node)
    if config.get("TORCH_TPU_STRICT"):
        documented = reason.kind == fallback_reasons.DYNAMIC_SHAPE
        advice = "or mark the dimension static" if documented else "or report the op to torch_tpu"
        raise TorchTpuCompileError(
            f"torch_tpu: {describe_node(node)}: {reason} (TORCH_TPU_STRICT=1 forbids falling back "
            f"to PyTorch eager; unset it to run this op in eager, {advice})"
        )
    # Once per op and reason: the same op may fall back for another reason elsewhere.
    if (name, reason.kind) not in _reported_fallbacks:
        _reported_fallbacks.add((name, reason.kind))
        log.warning("%s", reason.explain(name))


class _CompiledSubmodule(torch.nn.Module):
    def __init__(self, compiled: CompiledGraph) -> None:
        super().__init__()
        self.compiled = compiled

    def forward(self, *args):
        return self.compiled(*args)


class PrecisionKeyed:
    """A compiled graph per matmul precision mode, chosen when called: Dynamo guards
    `torch.set_float32_matmul_precision` but not `torch_tpu.precision`, so the mode in
    force at call time picks (and on first use compiles) the program. A graph without
    matrix ops has one program for every mode. Reading the mode costs a thread-local
    lookup and `torch.get_float32_matmul_precision()`: ~1.4 us measured, against ~28 us for
    the smallest compiled call."""

    def __init__(self, build: Callable[[], Callable[..., Any]]) -> None:
        self._build = build
        mode = current_mode()
        first = build()
        self._by_mode: dict[str, Callable[..., Any]] = {mode: first}
        self._any_mode = None if _precision_sensitive(first) else first

    def __call__(self, *args):
        if self._any_mode is not None:
            return self._any_mode(*args)
        mode = current_mode()
        fn = self._by_mode.get(mode)
        if fn is None:
            fn = self._by_mode[mode] = self._build()
        return fn(*args)


def _precision_sensitive(compiled) -> bool:
    if isinstance(compiled, CompiledGraph):
        return compiled.precision_sensitive
    inner = getattr(compiled, "compiled", None)  # _dynamic.DynamicCompiledGraph
    if isinstance(inner, CompiledGraph):
        return inner.precision_sensitive
    if isinstance(compiled, torch.fx.GraphModule):  # partitioned: compiled submodules
        return any(
            _precision_sensitive(m.compiled) for m in compiled.modules() if isinstance(m, _CompiledSubmodule)
        )
    return True


def compile_graph(gm: torch.fx.GraphModule, example_inputs=None, name: str = "graph") -> Callable[..., Any]:
    """Compiles `gm` (an ATen graph with meta['val'] on its nodes). Nodes without a
    lowering, or whose lowering rejects their arguments, run in PyTorch eager; the rest
    runs compiled, at the precision mode in force when called (`PrecisionKeyed`)."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    _fill_placeholder_meta(gm, example_inputs)

    def build():
        # aot_autograd may call compilers with its FakeTensorMode active; constants baked
        # into the module are real tensors and must be read as such.
        with unset_fake_temporarily():
            try:
                compiled = _compile_graph(gm, None, name)
            except _recovery.COMPILE_FAILURES as err:
                # The pipeline or XLA rejected the graph: compile it for concrete sizes or
                # run it in eager, never raise (unless TORCH_TPU_STRICT=1).
                return _recovery.recover(gm, name, err)
            if has_symbolic_shapes(gm):
                return _recovery.BoundedGraph(compiled, gm, name)
            return compiled

    return PrecisionKeyed(build)


def _compile_graph(gm: torch.fx.GraphModule, example_inputs, name: str) -> Callable[..., Any]:
    _fill_placeholder_meta(gm, example_inputs)
    # Before partitioning: an as_strided that runs in eager must read the storage root.
    rebase_storage_views(gm)
    rejected: dict[str, FallbackReason] = {}
    for node in gm.graph.nodes:
        if node.op == "call_function" and not is_supported(node):
            rejected[node.name] = fallback_reasons.unsupported(node)
        elif node.op == "call_function" and is_collective_node(node):
            rejected[node.name] = FallbackReason(
                fallback_reasons.COLLECTIVE,
                "collectives run through torch.distributed in a one-device graph (see torch_tpu.spmd)",
            )
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
                cause = fallback_reasons.from_error(err.node, err)
                reason = FallbackReason(cause.kind, f"its input {err.node.name} cannot be compiled ({cause.detail})")
                for user in users:
                    rejected[user.name] = reason
                continue
            rejected[err.node.name] = fallback_reasons.from_error(err.node, err)
        except (TorchTpuCompileError, CompileError) as err:
            # The pipeline or XLA rejected the module: the op its diagnostic names runs in
            # eager, as ops without a lowering do (_recovery.py); else compile_graph recovers.
            nodes = _recovery.nodes_to_run_eagerly(err, gm, rejected)
            if not nodes:
                raise
            reason = FallbackReason(fallback_reasons.COMPILER_REJECTED, _recovery.explain(err, gm).reason)
            rejected.update((node.name, reason) for node in nodes)
    raise TorchTpuCompileError(f"torch_tpu: too many ops of graph {name} fell back to eager")


def _compile_partitioned(gm: torch.fx.GraphModule, rejected: dict[str, FallbackReason], name: str):
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
            raise type(err)(err.reason, _find(gm, err.node.name if err.node else "")) from err
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
