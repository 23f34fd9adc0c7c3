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
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from torch_tpu.compiler.context import ir, make_context
from torch_tpu.compiler.diagnostics import DiagnosticEngine
from torch_tpu.compiler.lowering._process_groups import clear_declared_partitions, declare_partition  # noqa: F401
from torch_tpu.compiler.outlined import OutlinedProgram, Stage, ValueRef, split_outlined
from torch_tpu.compiler.pipeline import run_pipeline

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

    def __enter__(self) -> "spmd_safe":
        self._tokens.append(_SPMD_SAFE.set(True))
        return self

    def __exit__(self, *exc: Any) -> None:
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
    lower = (
        f"torchtpu-lower-collectives{{broadcast={broadcast} bitwise={bitwise} "
        f"global-device-ids={str(global_device_ids).lower()}}}"
    )
    passes = ["torchtpu-verify", lower]
    if thin:
        passes.append("torchtpu-outline-collectives")
    return "builtin.module(" + ",".join(passes) + ")"


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
        from torch_tpu.runtime import CompileSpec, get_client

        self.client = client if client is not None else get_client()
        self.num_ranks = num_ranks
        self.thin = (not is_spmd_safe()) if thin is None else thin
        self.name = name
        # XLA:CPU has no collective-broadcast and no and/or/xor all-reduce; there a
        # broadcast is an all-gather + slice and bitwise reductions go through bytes.
        on_cpu = self.client.platform == "cpu"
        prepared = prepare(
            module, thin=self.thin, broadcast="all_gather" if on_cpu else "collective_broadcast",
            bitwise="bytes" if on_cpu else "native", name=name,
        )
        self.module_text = prepared.operation.get_asm(enable_debug_info=False)
        spec = CompileSpec(num_replicas=num_ranks)
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
