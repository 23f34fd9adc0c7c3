"""Compiling one ATen FX graph for the device: import -> passes -> runtime compile,
with graceful fallback to PyTorch eager for ops the converter cannot lower."""

from __future__ import annotations

import contextvars
import logging
import sys
import threading
from collections.abc import Iterable, Sequence
from typing import Any, Callable

import torch
import torch.fx

from torch_tpu.compiler.importer import is_supported
from torch_tpu.compiler.importer.dynamic import has_symbolic_shapes
from torch_tpu.compiler.fx_locations import describe_node, op_name
from torch_tpu.compiler.importer.storage_views import rebase_storage_views
from torch_tpu.compiler.lowering import LoweringError
from torch_tpu.compiler.lowering.collectives import is_collective_node
from torch_tpu.compiler.passes.set_precision import precision_dependent

from torch_tpu.runtime.errors import CompileError

from . import _fallback_reasons as fallback_reasons
from . import _recovery
from ..core import config
from ._custom_ops import expand_custom_ops
from ._input_writes import written_values
from ..program.errors import TorchTpuCompileError
from ._fallback_reasons import FallbackReason
from ..program.fingerprint import FxGraphFingerprint
from ._invoker import PrecisionKeyed, compile_fx
from ..program.output_layout import output_layouts
from ..program.dump import ARGUMENT_SOURCES, parameter_name
from ..program.invoker import Invoker, OutputPlan
from ..program.protocols import HostCallable, PrecisionAware
from ..program.pipelines import compile_pipeline

log = logging.getLogger("torch_tpu")

_reported_fallbacks: set[tuple[str, str]] = set()
# gm.meta key: the graph's role in an aot_autograd training step, "forward" (a backward
# follows) or "backward"; the call of the role TORCH_TPU_COMPILED_STEP_START names, on tpu
# tensors, opens a deferred trace in Strict mode (TORCH_TPU_FUSE_COMPILED_STEP).
STARTS_STEP = "torch_tpu_starts_step"


class CompiledGraph:
    """A callable running one imported graph on the device: torch tensors in, the
    graph's output structure (torch tensors and constants) out, through the invoker's
    argument and output plans (`_invoker.py`). `precision_sensitive`: the module has
    matrix ops, so its program depends on the precision mode. `resident`: indices of the
    graph inputs that are module state (held on the device between calls)."""

    def __init__(self, executable, imported, precision_sensitive: bool = True,
                 resident: Iterable[int] = (), written: Iterable[int] = (), host_results: Iterable[int] = (),
                 device_index: int | None = None, input_writes: Sequence[int] = (),
                 fusable: tuple[Any, Any] | None = None) -> None:
        self.executable = executable
        # (module, fingerprint, starts a training step) of the program, which a FUSED trace
        # -- or a Strict-mode trace deferring a compiled training step's graphs -- can stitch
        # into its own (`device/_fused.GraphPlan`); None: its calls always run.
        self.fusable = fusable
        # Input positions whose new values are the graph's last outputs, one per output
        # (`_input_writes.take_input_writes`): the caller writes them back
        # (`with_input_writes`); on tpu tensors the fast path may write them itself.
        self.input_writes = tuple(input_writes)
        self.imported = imported
        self.precision_sensitive = precision_sensitive
        self._input_specs = [s for s in imported.inputs if s.role == "input"]
        self._needs_rng = any(s.role == "rng_state" for s in imported.inputs)
        self._outputs = imported.outputs
        self._tree = imported.output_tree
        self.invoker = Invoker(executable, self._input_specs, needs_rng=self._needs_rng,
                               resident=resident, written=written, host_results=host_results,
                               device_index=device_index)
        self._output_plan = OutputPlan(self._outputs, self._tree)

    def set_output_layouts(self, layouts: list) -> None:
        """Eager's layout per output leaf (`_output_layout`); results come back row-major,
        so only outputs eager lays out otherwise are copied."""
        layouts = [layout if isinstance(layout, tuple) else None for layout in layouts]
        self._output_plan = OutputPlan(self._outputs, self._tree,
                                       layouts if any(layout is not None for layout in layouts) else None)

    def __call__(self, *args):
        return self._output_plan(self.invoker(*args))

    def fast_path(self) -> Callable[..., Any] | None:
        """After the first call: this graph's call as one closure: on host tensors
        (`Invoker.host_caller`: the plan's steps, then the executable's precomputed call)
        when the outputs are the program's results in a flat tuple or list; on tpu tensors
        (`Invoker.device_caller`) with the output plan rebuilding any other structure (a
        backward graph's None gradients); else None. `PrecisionKeyed` calls it instead of the graph (`x + 1`: 4 Python frames
        fewer; a graph with module state: 6 fewer)."""
        if type(self).__call__ is not CompiledGraph.__call__:
            return None
        if not isinstance(self.executable, HostCallable):
            return None  # a tpu_dist graph's DistributedGraphProgram: its own call path
        result_type = self._output_plan.direct_type(len(self.executable.signature.results))
        if self.invoker.plan.device_index is not None:
            # On tpu tensors the output plan may rebuild the structure (a backward graph's
            # None gradients): the fast path is its argument loop and launch.
            return self.invoker.device_caller(result_type or self._output_plan, self._written_results(),
                                              self.fusable)
        if result_type is None:
            return None
        return self.invoker.host_caller(result_type)

    def _written_results(self) -> dict[int, int]:
        """Result index -> input position for the outputs that are new values of inputs
        (`input_writes`), where the result is that output alone: a result that is also one
        of the graph's own outputs must stay a new tensor, not become the input."""
        count = len(self.input_writes)
        if not count or count > len(self._outputs):
            return {}
        uses: dict[int, int] = {}
        for output in self._outputs:
            if output.kind == "tensor":
                uses[output.index] = uses.get(output.index, 0) + 1
        writes = {}
        for output, position in zip(self._outputs[-count:], self.input_writes):
            if output.kind == "tensor" and uses[output.index] == 1:
                writes[output.index] = position
        return writes

    def prepare_inputs(self, args) -> list:
        """The executable's arguments for the graph's inputs `args`."""
        return self.invoker.arguments(args)


def resident_inputs(gm: torch.fx.GraphModule, imported) -> list[int]:
    """Indices of the graph inputs that are a module's parameters or buffers (Dynamo's
    sources, recorded by the backend): module state is held resident on the device."""
    sources = gm.meta.get(ARGUMENT_SOURCES) or {}
    specs = [s for s in imported.inputs if s.role == "input"]
    return [i for i, spec in enumerate(specs) if parameter_name(sources.get(spec.name)) is not None]


def host_results(gm: torch.fx.GraphModule, imported) -> frozenset[int]:
    """Results of the program whose graph output is a CPU tensor (traced with a CPU
    fake tensor): in a graph on tpu tensors they come back as CPU tensors, as in eager.
    Outputs that cannot be matched to their FX node (a multi-result node returned whole)
    count as device results."""
    import torch.utils._pytree as pytree

    output = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    sources = pytree.tree_leaves(output.args[0])
    if len(sources) != len(imported.outputs):
        return frozenset()
    host = set()
    for spec, source in zip(imported.outputs, sources):
        val = source.meta.get("val") if isinstance(source, torch.fx.Node) else None
        if spec.kind == "tensor" and isinstance(val, torch.Tensor) and val.device.type == "cpu":
            host.add(spec.index)
    return frozenset(host)


def tpu_index(gm: torch.fx.GraphModule) -> int | None:
    """The tpu device of a graph traced with tpu tensors (an input or a result), else
    None: such a graph runs on device buffers (`device/_graph_io.py`), even one whose
    tpu tensors are all created inside it (`torch.randn(..., device="tpu")`)."""
    import torch.utils._pytree as pytree

    for node in gm.graph.nodes:
        if node.op == "placeholder":
            sources = [node]
        elif node.op == "output":
            sources = [a for a in pytree.tree_leaves(node.args[0]) if isinstance(a, torch.fx.Node)]
        else:
            continue
        for source in sources:
            val = source.meta.get("val")
            if isinstance(val, torch.Tensor) and val.device.type == "tpu":
                return val.device.index or 0
    return None


def _fill_placeholder_meta(gm: torch.fx.GraphModule, example_inputs) -> None:
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if example_inputs is None:
        return
    for node, example in zip(placeholders, example_inputs):
        if "val" not in node.meta and example is not None:
            node.meta["val"] = example


# A compiled graph's 16-bit intermediates follow torch.compile's own rule: inductor computes
# a fused kernel's bfloat16/float16 intermediates in float32 and rounds only what it stores,
# unless `torch._inductor.config.emulate_precision_casts` asks for eager's rounding after each
# op. The compile pipeline's `torchtpu-elide-roundings` is that rule (eager ops, each its own
# program, round as PyTorch's kernels do). Part of the program key: the setting picks the program.
ROUNDINGS_ELIDED = "roundings=elided"


def elides_roundings() -> bool:
    """Whether graphs compiled now read 16-bit intermediates unrounded (inductor's setting)."""
    from torch._inductor import config as inductor_config

    return not inductor_config.emulate_precision_casts


def compile_whole_graph(gm: torch.fx.GraphModule, name: str = "graph", symbol_bounds=None, defer: bool = False,
                        input_writes: Sequence[int] = ()):
    """Compiles a graph every node of which has a lowering. Raises LoweringError. A graph
    with symbolic sizes compiles at bounds (`symbol_bounds`, else from its ShapeEnv and
    TORCH_TPU_DYNAMIC_BOUND) and returns a `_dynamic.DynamicCompiledGraph`. `defer`: a
    graph with static sizes returns a `PendingGraph` while XLA compiles it. `input_writes`:
    `CompiledGraph.input_writes` of a graph with static sizes."""
    if symbol_bounds is not None or has_symbolic_shapes(gm):
        from . import _dynamic  # bounded graphs only: ~5 ms of a first compile's imports

        if symbol_bounds is None:
            symbol_bounds = _dynamic.initial_bounds(gm)
    if _in_distributed_graph(gm):
        from . import _dist_graph

        # In a tpu_dist job: one program, its collectives in it (thin stages or embedded);
        # a graph with symbolic sizes at its bounds, as below.
        compiled = _dist_graph.compile_distributed_graph(gm, name, symbol_bounds)
        if symbol_bounds is None:
            return compiled
        return _dynamic.DynamicCompiledGraph(
            compiled, gm, symbol_bounds, lambda bounds: compile_whole_graph(gm, name, bounds), name
        )
    defer = defer and symbol_bounds is None

    elide = elides_roundings()

    def pipeline(mode: str, platform: str) -> str:
        return compile_pipeline(mode, _dynamic.bounds_mode(platform) if symbol_bounds is not None else "none",
                                elide_roundings=elide)

    # The compiler's own code and versions are in the runtime's options key
    # (runtime.fingerprint.toolchain_fingerprint): the settings are this graph's choices.
    device_index = tpu_index(gm)  # the program runs where its tpu tensors are
    donors = donated_writes(gm, input_writes) if device_index is not None and symbol_bounds is None else ()
    program = compile_fx(
        gm, name=name, pipeline=pipeline,
        settings=";".join(filter(None, (_dynamic.settings_key(symbol_bounds) if symbol_bounds is not None else "",
                                        ROUNDINGS_ELIDED if elide else ""))),
        import_options={"symbol_bounds": symbol_bounds},
        dump_name=lambda fingerprint: f"{name}-{_short_hash(fingerprint)}",
        sources=gm.meta.get(ARGUMENT_SOURCES),
        wait=not defer,
        device_index=device_index or 0,
        donate=donors,
    )
    imported = program.lowered
    # Everything but the executable is read now, while XLA compiles (when deferred).
    precision_sensitive = precision_dependent(imported.module.operation)
    resident, host = resident_inputs(gm, imported), host_results(gm, imported)
    layouts = output_layouts(gm, len(imported.outputs)) if symbol_bounds is None else None

    def finish() -> CompiledGraph:
        program.resolve()
        _report_slow_compile(name, imported.node_count, program.seconds, program.timings)
        fusable = ((program.module, program.key.fingerprint(), gm.meta.get(STARTS_STEP))
                   if symbol_bounds is None else None)
        return fx_graph(program.executable, imported, precision_sensitive, resident, host, device_index, layouts,
                        input_writes if symbol_bounds is None else (), donors, fusable)

    if defer:
        return PendingGraph(finish, precision_sensitive)
    compiled = finish()
    if symbol_bounds is None:
        return compiled
    return _dynamic.DynamicCompiledGraph(
        compiled, gm, symbol_bounds, lambda bounds: compile_whole_graph(gm, name, bounds), name
    )


def donated_writes(gm: torch.fx.GraphModule, input_writes: Sequence[int]) -> tuple[int, ...]:
    """The written inputs (`input_writes`, whose new values are `gm`'s last outputs) a
    program on tpu tensors donates: those whose new value has the input's shape and dtype,
    so XLA may write it into the input's buffer. In place, as eager writes a KV cache or an
    optimizer's state: no second buffer per written input on the device, and no buffer to
    free per write on the host (~5 us each on the TPU host: 32 per decode step, 3 per
    parameter per AdamW step). The caller's buffer is consumed only where nothing else
    holds it (`device/_graph_io.graph_caller`); otherwise the program gets a copy
    (`ArgumentPlan`'s written positions), so no tensor ever sees a donated buffer."""
    donors = []
    for position, (placeholder, value) in zip(input_writes, written_values(gm, input_writes)):
        old = placeholder.meta.get("val")
        new = value.meta.get("val") if isinstance(value, torch.fx.Node) else None
        if (isinstance(old, torch.Tensor) and isinstance(new, torch.Tensor) and old.dtype == new.dtype
                and tuple(old.shape) == tuple(new.shape) and old.device.type == "tpu"):
            donors.append(position)
    return tuple(sorted(set(donors)))


def _in_distributed_graph(gm: torch.fx.GraphModule) -> bool:
    """`_dist_graph.applies(gm)`, without importing it and the distributed runtime (~20 ms
    of a first compile) in a process that is not in a `tpu_dist` job: only
    `runtime.distributed.initialize` makes one, so without that module there is none."""
    if "torch_tpu.runtime.distributed" not in sys.modules:
        return False
    from . import _dist_graph

    return _dist_graph.applies(gm)


def fx_graph(executable, imported, precision_sensitive: bool, resident: Iterable[int], host, device_index,
             layouts: list | None, input_writes: Sequence[int] = (), donated: Sequence[int] = (),
             fusable: tuple[Any, Any] | None = None) -> CompiledGraph:
    """The `CompiledGraph` of a Dynamo/aot_autograd graph: `resident` inputs held on the
    device, `host` results returned as CPU tensors, tpu tensors in and out when
    `device_index` is set, eager's output `layouts` applied (None: a bounded graph's),
    `input_writes` as `CompiledGraph.input_writes`, `donated` the inputs the program
    was compiled to donate (`donated_writes`), `fusable` the program's (module, fingerprint)
    that FUSED mode stitches into its traces (`CompiledGraph.fusable`)."""
    compiled = CompiledGraph(executable, imported, precision_sensitive, resident=resident, written=donated,
                             host_results=host, device_index=device_index, input_writes=input_writes,
                             fusable=fusable)
    if layouts is not None:
        compiled.set_output_layouts(layouts)
    return compiled


class PendingGraph:
    """A `CompiledGraph` whose XLA compile runs in the background (`compile_fx(wait=False)`),
    so Dynamo finishes the frame (guards, bytecode) and aot_autograd its wrappers meanwhile.
    `resolve()` (the first call, through `PrecisionKeyed`) waits for it. If the background
    compile failed, `rebuild` compiles the graph again synchronously: the failure then
    happens, is located and recovered (partition, eager fallback, `_recovery.py`) exactly
    where a synchronous compile meets it."""

    def __init__(self, finish: Callable[[], CompiledGraph], precision_sensitive: bool,
                 rebuild: Callable[[], Callable[..., Any]] | None = None) -> None:
        self._finish = finish
        self.precision_sensitive = precision_sensitive
        self.rebuild = rebuild
        self._lock = threading.Lock()
        self._program: Callable[..., Any] | None = None

    def resolve(self) -> Callable[..., Any]:
        with self._lock:
            if self._program is None:
                try:
                    self._program = self._finish()
                except Exception as err:  # noqa: BLE001 - the synchronous build meets it again
                    if self.rebuild is None:
                        raise
                    log.debug("torch_tpu: the background compile failed (%s); compiling again", err)
                    self._program = self.rebuild()
            return self._program


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


def _precision_sensitive(compiled) -> bool:
    if isinstance(compiled, PrecisionAware):  # CompiledGraph, PendingGraph, DynamicCompiledGraph
        return compiled.precision_sensitive
    if isinstance(compiled, torch.fx.GraphModule):  # partitioned: compiled submodules
        return any(
            _precision_sensitive(m.compiled) for m in compiled.modules() if isinstance(m, _CompiledSubmodule)
        )
    return True


def compile_graph(gm: torch.fx.GraphModule, example_inputs=None, name: str = "graph",
                  input_writes: Sequence[int] = ()) -> Callable[..., Any]:
    """Compiles `gm` (an ATen graph with meta['val'] on its nodes). Nodes without a
    lowering, or whose lowering rejects their arguments, run in PyTorch eager; the rest
    runs compiled, at the precision mode in force when called (`PrecisionKeyed`).
    `input_writes`: the input positions whose new values are `gm`'s last outputs
    (`_input_writes.take_input_writes`); the caller still writes them back
    (`with_input_writes`), a whole-graph program may have done it already."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    _fill_placeholder_meta(gm, example_inputs)

    def build(defer: bool = False):
        # aot_autograd may call compilers with its FakeTensorMode active; constants baked
        # into the module are real tensors and must be read as such.
        with unset_fake_temporarily():
            try:
                compiled = _compile_graph_deferring(gm, name, defer, input_writes)
            except _recovery.COMPILE_FAILURES as err:
                # The pipeline or XLA rejected the graph: compile it for concrete sizes or
                # run it in eager, never raise (unless TORCH_TPU_STRICT=1).
                return _recovery.recover(gm, name, err)
            if isinstance(compiled, PendingGraph):
                compiled.rebuild = build
                return compiled
            if has_symbolic_shapes(gm):
                return _recovery.BoundedGraph(compiled, gm, name)
            return compiled

    return PrecisionKeyed(build, _precision_sensitive, first=lambda: build(_defer_first_compile()))


def _defer_first_compile() -> bool:
    """The first program's XLA compile overlaps the rest of tracing, unless TORCH_TPU_STRICT=1
    (a rejected graph must fail the compile, as Dynamo's BackendCompilerFailed, not the
    call) or torch.profiler is recording (it records this thread only: the compile phases
    stay in the trace)."""
    return not config.get("TORCH_TPU_STRICT") and not torch._C._autograd._profiler_enabled()


# Set while compile_graph builds a graph's first program: its XLA compile may run in the
# background (read by _compile_graph, for the whole graph only, never a partition's parts).
_DEFER_XLA: contextvars.ContextVar[bool] = contextvars.ContextVar("torch_tpu_defer_xla", default=False)


def _compile_graph_deferring(gm: torch.fx.GraphModule, name: str, defer: bool, input_writes: Sequence[int] = ()):
    token = _DEFER_XLA.set(defer)
    try:
        return _compile_graph(gm, None, name, input_writes)
    finally:
        _DEFER_XLA.reset(token)


def _compile_graph(gm: torch.fx.GraphModule, example_inputs, name: str,
                   input_writes: Sequence[int] = ()) -> Callable[..., Any]:
    _fill_placeholder_meta(gm, example_inputs)
    # Before partitioning: an as_strided that runs in eager must read the storage root.
    rebase_storage_views(gm)
    # Custom ops without a lowering become the ATen ops of their implementation, where it traces.
    rejected: dict[str, FallbackReason] = expand_custom_ops(gm)
    # In a tpu_dist job the collectives compile into the graph's program (_dist_graph.py).
    in_program = _in_distributed_graph(gm)
    for node in gm.graph.nodes:
        if node.op == "call_function" and not is_supported(node) and node.name not in rejected:
            rejected[node.name] = fallback_reasons.unsupported(node)
        elif node.op == "call_function" and is_collective_node(node) and not in_program:
            rejected[node.name] = FallbackReason(
                fallback_reasons.COLLECTIVE,
                "collectives run through torch.distributed in a one-device graph (see torch_tpu.spmd)",
            )
    # A lowering may still reject specific arguments; retry with that node in eager.
    for _ in range(64):
        try:
            if not rejected:
                return compile_whole_graph(gm, name, defer=_DEFER_XLA.get(), input_writes=input_writes)
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
