"""Compiled graphs with collectives in a `tpu_dist` job: one program per graph, the
collectives in it.

A `torch.compile(backend="tpu")` graph whose `_c10d_functional` collectives work on tpu
tensors, in a process of a `tpu_dist` job, compiles whole (it is not split at its
collectives): imported with the process-group facts (`program/process_groups.py`), run through
the compile pipeline, then the SPMD pipeline (`torch_tpu.spmd`):

* thin (the default): `torchtpu-outline-collectives` cuts the program into compute stages
  and collective stages. A compute stage is an ordinary program of this process's device;
  a collective stage is a group program over every process of the job (replica r on rank
  r's device, replica groups = the ranks of the PyTorch group's complete partition, as
  the eager `tpu_dist` programs), byte-identical on every rank.
* under `torch_tpu.spmd_safe` (read when the graph compiles): one program with the
  collectives embedded, run as a group program over every process, so XLA may overlap
  communication with compute.
* a graph with symbolic sizes: compiled at bounds (`_dynamic.py`), always embedded (its
  padded values would cross thin stage boundaries as dynamically shaped buffers); the
  handshake compares the run-time sizes its collectives exchange (`exchanged_sizes`).

Every program holding collectives runs as the next collective of the job's default
process group: it takes the group's next sequence number and goes through the handshake
(`TORCH_TPU_SPMD_HANDSHAKE_STAGE`) as the group's own collectives do, so compiled and
eager collectives are checked in one sequence.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from torch_tpu.compiler.lowering.collectives import is_collective_node
from torch_tpu.core import config
from torch_tpu.runtime import DeviceBuffer

if TYPE_CHECKING:
    from torch_tpu.distributed import ProcessGroupTPU

# A collective stage's source location as the importer records it: `"file.py":12:3`.
_LOCATION = re.compile(r'"([^"]+)":(\d+)(?::\d+)?')


def applies(gm: torch.fx.GraphModule) -> bool:
    """Whether `gm` compiles here: it holds `_c10d_functional` collectives, runs on tpu
    tensors and this process is part of a `tpu_dist` job. Graphs with symbolic sizes too:
    they compile at bounds (padded buffers, `_dynamic.py`) like other graphs; a collective
    whose padded operand it cannot exchange correctly (a dynamic gather/scatter dim) is
    rejected by its lowering and runs in eager, with the reason logged."""
    from torch_tpu.runtime import distributed

    if distributed.current() is None:
        return False
    if not any(node.op == "call_function" and is_collective_node(node) for node in gm.graph.nodes):
        return False
    from ._compile import tpu_index

    return tpu_index(gm) is not None


@dataclass
class _Step:
    """One program of the sequence: `kind` "compute" (this device) or "collective"
    (a group program over every process); `args`: where each argument comes from."""

    kind: str
    program: Any
    args: tuple
    name: str


class DistributedGraphProgram:
    """The executable of a compiled graph with collectives: `execute(buffers)` enqueues
    its stages in order and returns the graph's results as DeviceBuffers (what the
    invoker's device path calls). `steps` lists the stages ("compute" / "collective"),
    `module_text` the program after the SPMD pipeline (the collectives visible)."""

    def __init__(self, client: Any, steps: list[_Step], outputs: tuple, module_text: str, thin: bool,
                 exchanged_sizes: tuple[tuple[int, str], ...] = ()) -> None:
        self.client = client
        self.steps = steps
        self.outputs = outputs
        self.module_text = module_text
        self.thin = thin
        # A bounded graph's sizes that its collectives exchange: (position from the end of
        # the arguments -- the program's trailing i32 sizes --, symbol name).
        self.exchanged_sizes = exchanged_sizes

    @property
    def stage_kinds(self) -> list[str]:
        return [s.kind for s in self.steps]

    def execute(self, args: Sequence[Any]) -> list[Any]:
        group = world_group()
        results: list[list[Any]] = []
        sizes = self._sizes(args)

        def fetch(ref) -> Any:
            return args[ref.index] if ref.stage < 0 else results[ref.stage][ref.index]

        for step in self.steps:
            values = [fetch(ref) for ref in step.args]
            if step.kind == "compute":
                results.append(step.program.execute(values))
            else:
                results.append(group.run_program(step.program, [self._on_device(v) for v in values], sizes))
        return [self._on_device(fetch(ref)) for ref in self.outputs]

    def _sizes(self, args: Sequence[Any]) -> str:
        """"s0=3, s1=7": this call's run-time sizes that the collectives exchange. Padded
        buffers of one bound hide them from the program's fingerprint, and the ranks must
        agree on them as eager's shapes must: the handshake compares them. Under the `off`
        stage no handshake runs: the sizes are not read (each read waits for the device)."""
        if not self.exchanged_sizes or config.get("TORCH_TPU_SPMD_HANDSHAKE_STAGE") == "off":
            return ""
        return ", ".join(f"{name}={_host_int(args[len(args) - back])}" for back, name in self.exchanged_sizes)

    def __call__(self, *args: Any) -> list[Any]:
        return [b.to_torch() for b in self.execute(args)]

    def _on_device(self, value: Any) -> Any:
        # A group program takes device buffers; a graph input that is not one (a Python
        # scalar's 0-d tensor, an RNG key) is uploaded to this process's device.
        return value if isinstance(value, DeviceBuffer) else self.client.to_device(value)


def world_group() -> ProcessGroupTPU:
    """The job's default process group's `tpu_dist` backend, which runs the collective stages."""
    import torch.distributed as dist

    from torch_tpu.distributed import ProcessGroupTPU

    group = dist.distributed_c10d._get_default_group()
    # PyTorch hands a Python process group back as is: the default group is the backend.
    if isinstance(group, ProcessGroupTPU):
        return group
    try:
        backend = group._get_backend(torch.device("tpu"))
    except RuntimeError:  # no backend for tpu tensors in this group
        backend = None
    if not isinstance(backend, ProcessGroupTPU):
        found = "none" if backend is None else type(backend).__name__
        raise RuntimeError(
            f"a compiled graph with collectives on tpu tensors runs them through the default process group's "
            f"tpu_dist backend, and its backend for tpu is {found}: initialize the job with "
            f"dist.init_process_group('tpu_dist') (or a device map naming tpu:tpu_dist)")
    return backend


def compile_distributed_graph(gm: torch.fx.GraphModule, name: str, symbol_bounds=None):
    """`gm` (see `applies`) compiled as a `CompiledGraph` (`fx_graph`) whose executable is a
    `DistributedGraphProgram`. Raises LoweringError / TorchTpuCompileError as
    `compile_whole_graph` does, so the caller's fallback handling is the same. With
    `symbol_bounds` (a graph with symbolic sizes) the program is the bounded one
    (padded inputs plus their sizes, `torchtpu-materialize-bounds`), which the caller
    wraps in a `_dynamic.DynamicCompiledGraph` as `compile_whole_graph` does."""
    from torch_tpu.compiler.importer import import_graph
    from torch_tpu.compiler.outlined import functions_by_name, split_outlined
    from torch_tpu.compiler.passes.set_precision import precision_dependent
    from torch_tpu.runtime import distributed

    from ._compile import ROUNDINGS_ELIDED, elides_roundings, fx_graph, host_results, resident_inputs, tpu_index
    from ._dynamic import bounds_mode, settings_key
    from ..program.errors import TorchTpuCompileError
    from ..program.fingerprint import FxGraphFingerprint
    from ..program.output_layout import output_layouts
    from ..program.precision import current_mode
    from ..program.process_groups import process_groups_of
    from ..program import Lowered, ProgramKey, client, compile_module, shared_context
    from ..program.pipelines import compile_pipeline, in_sequence
    from ..spmd import is_spmd_safe, spmd_pipeline

    runtime = distributed.current()
    local = client()
    # A bounded graph compiles embedded (one program): its padded values carry their
    # run-time sizes as XLA dynamic shapes, which would cross thin stages' boundaries as
    # dynamically shaped buffers, and a stage program takes static ones; the one program's
    # boundary is made static by torchtpu-materialize-bounds.
    thin = not is_spmd_safe() and symbol_bounds is None
    on_cpu = local.platform == "cpu"
    # XLA:CPU has no collective-broadcast and no and/or/xor all-reduce (as the eager programs).
    spmd = spmd_pipeline(thin=thin, broadcast="all_gather" if on_cpu else "collective_broadcast",
                         bitwise="bytes" if on_cpu else "native")
    bounds = bounds_mode(local.platform) if symbol_bounds is not None else "none"
    mode = current_mode()
    # The compile pipeline, then the SPMD pipeline: one pipeline, so the dump replays both.
    elide = elides_roundings()
    pipeline = in_sequence(compile_pipeline(mode, bounds, elide_roundings=elide), spmd)
    settings = (f"precision={mode};thin={thin}" + (f";{settings_key(symbol_bounds)}" if symbol_bounds is not None else "")
                + (f";{ROUNDINGS_ELIDED}" if elide else ""))
    fingerprint = FxGraphFingerprint(gm, settings)
    everyone = tuple(range(runtime.world_size))
    found: dict[str, Any] = {}

    def build() -> Lowered:
        graph = import_graph(gm, context=shared_context(), process_groups=process_groups_of(gm),
                             symbol_bounds=symbol_bounds)
        found["imported"] = graph
        return Lowered(graph.module, graph)

    def rejected(engine) -> Exception:
        return TorchTpuCompileError(
            f"torch_tpu: the compiler or the SPMD pipeline failed on graph {name}:\n{engine.format()}",
            engine.diagnostics,
        )

    def stages(final) -> DistributedGraphProgram:
        """The program of the final module: its compute stages on this process's device,
        its collective stages (or the whole module, embedded) over every process."""
        module = final.operation
        imported = found["imported"]
        module_text = module.get_asm(enable_debug_info=False)
        if thin:
            outlined = split_outlined(module)
            functions = functions_by_name(module)
            steps = []
            for stage in outlined.stages:
                label = f"{name}:{stage.name}"
                if stage.kind == "compute":
                    program = local.compile(stage.text, name=label)
                else:
                    program = _group_program(runtime, stage.text, everyone, label,
                                             _describe_collective(functions[stage.name]))
                steps.append(_Step(stage.kind, program, stage.args, stage.name))
            outputs = outlined.outputs
        else:
            from torch_tpu.compiler.context import ir
            from torch_tpu.compiler.outlined import ValueRef

            kinds = ", ".join(_collective_names(module))
            program = _group_program(runtime, module_text, everyone, name,
                                     f"graph {name} with its collectives embedded ({kinds}) [compiled]")
            entry = functions_by_name(module)[imported.func_name]
            signature = ir.FunctionType(ir.TypeAttr(entry.attributes["function_type"]).value)
            steps = [_Step("collective", program, tuple(ValueRef(-1, i) for i in range(len(signature.inputs))), name)]
            outputs = tuple(ValueRef(0, k) for k in range(len(signature.results)))
        exchanged = _exchanged_sizes(gm, imported) if symbol_bounds is not None else ()
        return DistributedGraphProgram(local, steps, outputs, module_text, thin, exchanged)

    # Not reused from the program cache, as any Dynamo graph (`_invoker.compile_fx`).
    compiled = compile_module(
        build, key=ProgramKey("dist_graph", fingerprint), name=name, pipeline=pipeline,
        dump_name=f"{name}-dist-{ProgramKey('dist_graph', fingerprint).short_hash()}",
        dump_files={"fx_graph.py": lambda: gm.print_readable(print_output=False)},
        input_specs=lambda graph: graph.inputs, rejected=rejected, compiler=stages, reuse=False,
        building="importing the graph",
    )
    imported = compiled.lowered
    return fx_graph(compiled.executable, imported, precision_dependent(compiled.module.operation),
                    resident_inputs(gm, imported), host_results(gm, imported), tpu_index(gm),
                    output_layouts(gm, len(imported.outputs)) if symbol_bounds is None else None)


def _host_int(value: Any) -> int:
    if isinstance(value, torch.Tensor):
        return int(value)
    if isinstance(value, DeviceBuffer):
        return int(value.to_numpy())
    return int(value)


def _exchanged_sizes(gm: torch.fx.GraphModule, imported: Any) -> tuple[tuple[int, str], ...]:
    """The size symbols of the collectives' operands with dynamic dims, each located among
    the bounded program's trailing sizes (one per dynamic dim of each input, in argument
    order: `_dynamic.pad_to_bounds`) as (position from the end of the arguments, name)."""
    from torch_tpu.compiler.lowering.padded import is_dynamic_size

    exchanged: set[str] = set()
    for node in gm.graph.nodes:
        if node.op != "call_function" or not is_collective_node(node) or not node.args:
            continue
        operands = node.args[0] if isinstance(node.args[0], (list, tuple)) else [node.args[0]]
        for operand in operands:
            val = operand.meta.get("val") if isinstance(operand, torch.fx.Node) else None
            if isinstance(val, torch.Tensor):
                for size in val.shape:
                    if is_dynamic_size(size):
                        exchanged.update(str(sym) for sym in size.node.expr.free_symbols)
    if not exchanged:
        return ()
    specs = [spec for spec in imported.inputs if spec.role == "input"]
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    located: dict[str, int] = {}
    count = 0
    for spec, node in zip(specs, placeholders):
        val = node.meta.get("val")
        for d in spec.dynamic_dims:
            if isinstance(val, torch.Tensor) and is_dynamic_size(val.shape[d]):
                located.setdefault(str(val.shape[d].node.expr), count)
            count += 1
    return tuple((count - k, name) for name, k in sorted(located.items()) if name in exchanged)


def _group_program(runtime: Any, text: str, ranks: tuple[int, ...], name: str, description: str):
    """A group program over `ranks` with what the handshake compares: the fingerprint of
    its text (identical on every rank that runs the same collective) and a description."""
    from torch_tpu.runtime.distributed import fingerprint_of

    program = runtime.compile_group_program(text, ranks, name)
    return program.label(description, fingerprint_of(text, f"compiled over ranks {list(ranks)}"))


def _collective_ops(op: Any) -> list[Any]:
    from torch_tpu.compiler.passes.base import ops_named
    from torch_tpu.compiler.passes.outline_collectives import COLLECTIVE_OPS

    return ops_named(op, *COLLECTIVE_OPS)


def _collective_names(module: Any) -> list[str]:
    return [op.name.removeprefix("stablehlo.") for op in _collective_ops(module)]


def _describe_collective(function: Any) -> str:
    """`all_reduce(tensor<2x3xf32>) [compiled from model.py:12]`: the collective of an
    outlined function and the user's source line of it (the op's location); the
    handshake adds the line of the compiled graph's call."""
    ops = _collective_ops(function)
    if not ops:
        return "collective [compiled]"
    op = ops[0]
    types = ", ".join(str(v.type) for v in op.operands)
    text = f"{op.name.removeprefix('stablehlo.')}({types})"
    found = _LOCATION.search(str(op.location))
    return f"{text} [compiled from {found.group(1)}:{found.group(2)}]" if found else f"{text} [compiled]"
