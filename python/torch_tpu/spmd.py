"""SPMD programs: one program per rank, collectives explicit, run as N replicas.

torch_tpu follows PyTorch's one-process-per-device model: each rank runs its own
program, and communication is StableHLO collectives in it. By default collectives are
*thin*: `torchtpu-outline-collectives` puts each one in its own module, so every rank
compiles byte-identical collective modules, and this module runs the sequence of compute
and collective modules. Code marked `spmd_safe` keeps its collectives embedded in one
module, letting XLA overlap communication with compute.

On a machine without TPUs, N virtual XLA:CPU devices stand in for N chips
(`TORCH_TPU_NUM_CPU_DEVICES`, or `Client.create("cpu", num_cpu_devices=N)`).
"""

from __future__ import annotations

import contextvars
import functools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from typing_extensions import Self

from torch_tpu.core import attributes

from torch_tpu.compiler.context import ir, make_context
from torch_tpu.compiler.diagnostics import DiagnosticEngine
from torch_tpu.compiler.outlined import OutlinedProgram, Stage, ValueRef, split_outlined
from torch_tpu.compiler.pipeline import run_pipeline
from torch_tpu.compiler.pipelines import named_pipeline

# Public: a partition for groups PyTorch does not record, and the process-group facts of a
# graph that `import_graph(..., process_groups=...)` lowers its collectives with.
from .program.process_groups import clear_declared_partitions, declare_partition, process_groups_of  # noqa: F401

log = logging.getLogger(__name__)

_SPMD_SAFE: contextvars.ContextVar[bool] = contextvars.ContextVar("torch_tpu_spmd_safe", default=False)


class spmd_safe:
    """Marks code whose collectives may stay embedded in one module.

    As a context manager (`with torch_tpu.spmd_safe(): ...`) or a decorator
    (`@torch_tpu.spmd_safe`), programs compiled inside skip
    `torchtpu-outline-collectives`. Use it where every rank is known to run the same
    program around its collectives; XLA may then overlap communication with compute."""

    def __init__(self, fn: Callable | None = None) -> None:
        self._fn = fn
        self._tokens: list[contextvars.Token] = []
        if fn is not None:
            functools.update_wrapper(self, fn)

    def __enter__(self) -> Self:
        self._tokens.append(_SPMD_SAFE.set(True))
        return self

    def __exit__(self, *exc: object) -> None:
        _SPMD_SAFE.reset(self._tokens.pop())

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self._fn is None:
            raise TypeError("spmd_safe() without a function is a context manager: use `with torch_tpu.spmd_safe():`")
        with spmd_safe():
            return self._fn(*args, **kwargs)


def is_spmd_safe() -> bool:
    """Whether the calling code runs under `spmd_safe`."""
    return _SPMD_SAFE.get()


class SpmdCompileError(RuntimeError):
    """The SPMD pipeline rejected the program; the message holds located diagnostics."""


def spmd_pipeline(*, thin: bool, broadcast: str = "collective_broadcast", bitwise: str = "native",
                  global_device_ids: bool = False) -> str:
    return named_pipeline("torchtpu-spmd-pipeline", thin=thin, broadcast=broadcast, bitwise=bitwise,
                          global_device_ids=global_device_ids)


def prepare(module: Any, *, thin: bool, broadcast: str = "collective_broadcast", bitwise: str = "native",
            name: str = "spmd") -> ir.Module:
    """Parses (if text) and runs the SPMD pipeline on a per-device module."""
    if isinstance(module, str):
        ctx = make_context()
        with ctx:
            module = ir.Module.parse(module)
    op = module.operation if isinstance(module, ir.Module) else module
    engine = DiagnosticEngine()
    if not run_pipeline(op, spmd_pipeline(thin=thin, broadcast=broadcast, bitwise=bitwise), engine):
        raise SpmdCompileError(f"torch_tpu: the SPMD pipeline failed on {name}:\n{engine.format()}")
    return module


@dataclass
class _CompiledStage:
    stage: Stage
    executable: Any


class SpmdProgram:
    """A per-device program compiled for `num_ranks` replicas.

    thin=True: one executable per outlined stage (compute and collective modules), run in
    sequence; thin=False: one executable with the collectives embedded. Call it with one
    argument list per rank; it returns one list of torch tensors per rank."""

    def __init__(self, module: Any, num_ranks: int, *, client: Any = None, thin: bool | None = None,
                 name: str = "spmd") -> None:
        from torch_tpu.runtime import get_client

        from .program import ProgramKey, compile_module

        self.client = client if client is not None else get_client()
        self.num_ranks = num_ranks
        self.thin = (not is_spmd_safe()) if thin is None else thin
        self.name = name
        # XLA:CPU has no collective-broadcast and no and/or/xor all-reduce; there a
        # broadcast is an all-gather + slice and bitwise reductions go through bytes.
        on_cpu = self.client.platform == "cpu"
        pipeline = spmd_pipeline(thin=self.thin, broadcast="all_gather" if on_cpu else "collective_broadcast",
                                 bitwise="bytes" if on_cpu else "native")
        source = module if isinstance(module, str) else module.operation.get_asm(enable_debug_info=False)

        def rejected(engine: DiagnosticEngine) -> Exception:
            return SpmdCompileError(f"torch_tpu: the SPMD pipeline failed on {name}:\n{engine.format()}")

        # Through the one compile spine (dumped, keyed, timed); each stage compiles through
        # the runtime's cache on this program's client. A user object: not shared.
        compile_module(
            module, key=ProgramKey("spmd", source, f"replicas={num_ranks};{pipeline}"), name=name,
            pipeline=pipeline, rejected=rejected, compiler=self._compile_stages, reuse=False,
        )

    def _compile_stages(self, prepared: ir.Module) -> None:
        """Compiles the prepared module: one executable per outlined stage, or the whole."""
        from torch_tpu.runtime import CompileSpec

        name = self.name
        self.module_text = prepared.operation.get_asm(enable_debug_info=False)
        spec = CompileSpec(num_replicas=self.num_ranks)
        if self.thin:
            self.program: OutlinedProgram | None = split_outlined(prepared.operation)
            self.stages = [
                _CompiledStage(s, self.client.compile(s.text, options=spec, name=f"{name}:{s.name}"))
                for s in self.program.stages
            ]
            self._whole = None
        else:
            self.program = None
            self.stages = []
            self._whole = self.client.compile(self.module_text, options=spec, name=name)

    @property
    def collective_fingerprints(self) -> list[str]:
        """Fingerprints of the collective modules, in execution order (thin only)."""
        return [s.stage.fingerprint for s in self.stages if s.stage.kind == "collective"]

    def __call__(self, per_rank_args: Sequence[Sequence[Any]]) -> list[list[Any]]:
        if len(per_rank_args) != self.num_ranks:
            raise ValueError(f"{self.name}: compiled for {self.num_ranks} ranks, got arguments for {len(per_rank_args)}")
        if self._whole is not None:
            outs = self._whole.execute_replicated(per_rank_args)
        else:
            outs = self._run_stages(per_rank_args)
        return [[b.to_torch() if hasattr(b, "to_torch") else b for b in rank] for rank in outs]

    def _run_stages(self, per_rank_args: Sequence[Sequence[Any]]) -> list[list[Any]]:
        assert self.program is not None
        results: list[list[list[Any]]] = []  # results[stage][rank][k]

        def fetch(ref: ValueRef, rank: int) -> Any:
            return per_rank_args[rank][ref.index] if ref.stage < 0 else results[ref.stage][rank][ref.index]

        for compiled in self.stages:
            args = [[fetch(ref, r) for ref in compiled.stage.args] for r in range(self.num_ranks)]
            results.append(compiled.executable.execute_replicated(args))
        return [[fetch(ref, r) for ref in self.program.outputs] for r in range(self.num_ranks)]


def compile_spmd(module: Any, num_ranks: int, *, client: Any = None, thin: bool | None = None,
                 name: str = "spmd") -> SpmdProgram:
    """Compiles a per-device module (text or ir.Module holding `torchtpu.collective` or
    StableHLO collectives) to run as `num_ranks` replicas; thin unless under `spmd_safe`."""
    return SpmdProgram(module, num_ranks, client=client, thin=thin, name=name)


# -- single-device programs with shardings ---------------------------------------------------

DimSharding = Sequence[str | None]


def annotate_shardings(module: Any, mesh: Sequence[tuple[str, int]], args: Sequence[DimSharding | None],
                       results: Sequence[DimSharding | None] = (), *, mesh_name: str = "mesh",
                       entry: str = "main") -> ir.Module:
    """Adds an `sdy.mesh` and `sdy.sharding` argument/result attributes to a
    single-device module (text or ir.Module): `args[i]` names the mesh axis of each
    dimension of argument i (None: unsharded; a None entry: replicated)."""
    from torch_tpu.compiler.passes.sharding import sdy_sharding_text

    if isinstance(module, str):
        with make_context():
            module = ir.Module.parse(module)
    ctx = module.context
    with ctx, ir.Location.unknown():
        axes = ", ".join(f'"{a}"={n}' for a, n in mesh)
        snippet = ir.Module.parse(f"sdy.mesh @{mesh_name} = <[{axes}]>")
        mesh_op = snippet.body.operations[0].operation
        first = module.body.operations[0].operation
        mesh_op.move_before(first)
        fn = next(op.operation for op in module.body.operations
                  if op.operation.name == "func.func" and ir.StringAttr(op.operation.attributes["sym_name"]).value == entry)

        def dicts(key: str, shardings, count: int) -> ir.ArrayAttr:
            existing = list(ir.ArrayAttr(fn.attributes[key])) if key in fn.attributes else [ir.DictAttr.get({})] * count
            out = []
            for i in range(count):
                d = ir.DictAttr(existing[i])
                entries = {d[k].name: d[k].attr for k in range(len(d))}
                dims = shardings[i] if i < len(shardings) else None
                if dims is not None:
                    entries[attributes.SDY_SHARDING] = ir.Attribute.parse(sdy_sharding_text(mesh_name, dims))
                out.append(ir.DictAttr.get(entries))
            return ir.ArrayAttr.get(out)

        ftype = ir.FunctionType(ir.TypeAttr(fn.attributes["function_type"]).value)
        fn.attributes["arg_attrs"] = dicts("arg_attrs", list(args), len(ftype.inputs))
        fn.attributes["res_attrs"] = dicts("res_attrs", list(results), len(ftype.results))
    return module


def _read_layouts(module: ir.Module, entry: str = "main"):
    from torch_tpu.compiler.passes.sharding import (
        MESH_ATTR_PREFIX,
        SHARDING_ATTR,
        Layout,
        parse_mesh,
        parse_sharding,
    )

    meshes = {}
    for i in range(len(module.operation.attributes)):
        named = module.operation.attributes[i]
        if named.name.startswith(MESH_ATTR_PREFIX):
            name = named.name[len(MESH_ATTR_PREFIX):]
            meshes[name] = parse_mesh(name, ir.StringAttr(named.attr).value)
    fn = next(op.operation for op in module.body.operations
              if op.operation.name == "func.func" and ir.StringAttr(op.operation.attributes["sym_name"]).value == entry)
    ftype = ir.FunctionType(ir.TypeAttr(fn.attributes["function_type"]).value)

    def read(key: str, types) -> list:
        out = []
        attrs = list(ir.ArrayAttr(fn.attributes[key])) if key in fn.attributes else [None] * len(types)
        for attr, t in zip(attrs, types):
            rank = ir.RankedTensorType(t).rank
            d = ir.DictAttr(attr) if attr is not None else None
            if d is not None and SHARDING_ATTR in d:
                out.append(parse_sharding(ir.StringAttr(d[SHARDING_ATTR]).value, meshes, rank))
            else:
                out.append((None, Layout.replicated(rank)))
        return out

    return read("arg_attrs", ftype.inputs), read("res_attrs", ftype.results), meshes


def _rank_view(full: Any, mesh, layout, rank: int) -> Any:
    """The view of the global tensor `full` that `rank` holds under `layout`."""
    out = full
    for d, shard in enumerate(layout.dims):
        if shard is None:
            continue
        size = out.shape[d] // mesh.axis_size(shard.axis)
        out = out.narrow(d, mesh.axis_index_table(shard.axis)[rank] * size, size)
    return out


class ShardedProgram:
    """A single-device program with sdy shardings, partitioned by
    `torchtpu-insert-collectives` and run on the mesh's devices as replicas. Called with
    the global arguments, it hands each rank its block and returns the global results
    assembled from the ranks' blocks."""

    def __init__(self, module: Any, *, client: Any = None, thin: bool | None = None, name: str = "sharded") -> None:
        from .program import ProgramKey, compile_module

        pipeline = named_pipeline("torchtpu-partition-pipeline")
        source = module if isinstance(module, str) else module.operation.get_asm(enable_debug_info=False)

        def rejected(engine: DiagnosticEngine) -> Exception:
            return SpmdCompileError(f"torch_tpu: partitioning {name} failed:\n{engine.format()}")

        def per_device(partitioned: Any) -> SpmdProgram:
            """The partitioned module's layouts, and its per-device program (which compiles
            through the spine again, with the SPMD pipeline)."""
            self.partitioned_text = partitioned.operation.get_asm(enable_debug_info=False)
            self.arg_layouts, self.result_layouts, module_meshes = _read_layouts(partitioned)
            meshes = {m for m, _ in self.arg_layouts + self.result_layouts if m is not None}
            if not meshes and len(module_meshes) == 1:
                meshes = set(module_meshes.values())  # nothing sharded: every rank holds everything
            if len(meshes) != 1:
                raise SpmdCompileError(f"{name}: expected one sdy.mesh for the arguments/results, found {len(meshes)}")
            self.mesh = meshes.pop()
            return SpmdProgram(partitioned, self.mesh.size, client=client, thin=thin, name=name)

        # Through the one compile spine (dumped: the partitioning replays with torchtpu-opt);
        # a user object, so not shared.
        self.program = compile_module(
            source, key=ProgramKey("sharded", source, pipeline), name=name, pipeline=pipeline, rejected=rejected,
            compiler=per_device, reuse=False,
        ).executable

    def shard(self, args: Sequence[Any]) -> list[list[Any]]:
        return [[_rank_view(a, self.mesh, layout, r).contiguous() for a, (_, layout) in zip(args, self.arg_layouts)]
                for r in range(self.mesh.size)]

    def __call__(self, *args: Any) -> list[Any]:
        import torch

        per_rank = self.program(self.shard(args))
        results = []
        for k, (_, layout) in enumerate(self.result_layouts):
            local = per_rank[0][k]
            full = torch.empty(layout.global_shape(local.shape, self.mesh), dtype=local.dtype)
            for r in range(self.mesh.size):
                _rank_view(full, self.mesh, layout, r).copy_(per_rank[r][k])
            results.append(full)
        return results
