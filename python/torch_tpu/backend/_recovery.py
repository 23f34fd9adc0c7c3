"""What runs when a graph cannot be compiled: the pass pipeline or XLA rejected its module
(docs/explanation/bounded-dynamism.md, "When a graph cannot be compiled").

A failure is explained first (`explain`): the reason in one line and, when the located
diagnostic or XLA's op metadata names an op and a source line, the FX nodes that made
that op. Then, unless TORCH_TPU_STRICT=1 makes it an error:

* a static graph whose failure names nodes runs those nodes in PyTorch eager and the
  rest compiled (the partitioning that ops without a lowering use, `_compile.py`);
* a static graph whose failure names no node runs in PyTorch eager as a whole
  (`EagerGraph`, one WARNING line);
* a graph with dynamic sizes that cannot be compiled at its bounds is compiled again for
  each concrete input signature it is called with (`SpecializingGraph`, one WARNING
  line). If a specialised compile fails too, the graph runs in eager from then on (one
  WARNING line). A size above the bounds recompiles during a call; a failure of that
  recompile is recovered the same way (`BoundedGraph`), never raised from the call.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import Any, Callable, NoReturn

import torch
import torch.fx

from torch_tpu.compiler.importer.dynamic import has_symbolic_shapes
from torch_tpu.compiler.fx_locations import describe_node, node_frame, op_name
from torch_tpu.compiler.lowering import LoweringError
from torch_tpu.runtime.errors import CompileError

from ..core import config
from ..program.errors import TorchTpuCompileError

log = logging.getLogger("torch_tpu")

# Everything compiling a graph raises for a graph it cannot compile. Errors of running a
# compiled program (runtime ExecutionError) are not among them.
COMPILE_FAILURES = (LoweringError, TorchTpuCompileError, CompileError)

# XLA's error: "<name>: error: XLA cannot compile the module: <what>: %hlo_instruction ...",
# with `metadata={op_name="aten.x" ...}` on the instruction and, after "Suspected Python
# Code Location:", lines "  file:line:col [aten.x] ..." made from the op's MLIR location.
_XLA_PREFIX = re.compile(r"^\S+: error: ")
_XLA_SUSPECT = re.compile(r"^\s*(.+?):(\d+):\d+ \[([^\]]+)\]", re.MULTILINE)
_XLA_OP_NAME = re.compile(r'op_name="([^"]+)"')
# An HLO instruction quoted in XLA's message ("%name = f32[...] op(...), metadata=...").
_HLO_INSTRUCTION = re.compile(r"(?::\s*)?(%[\w.\-]+) = .*$")
_MAX_REASON = 240


@dataclass(frozen=True)
class CompileFailure:
    """Why a graph did not compile, in words a user can act on."""

    reason: str  # one line
    nodes: tuple[torch.fx.Node, ...] = ()  # the FX nodes that made the failing op
    where: str | None = None  # the op and source line when no node is known

    def describe(self) -> str:
        if self.nodes:
            more = f" and {len(self.nodes) - 1} more node(s) of that op and line" if len(self.nodes) > 1 else ""
            return f"{describe_node(self.nodes[0])}{more}: {self.reason}"
        return f"{self.where}: {self.reason}" if self.where else self.reason


def explain(err: BaseException, gm: torch.fx.GraphModule) -> CompileFailure:
    """The reason of a compile failure and the nodes of `gm` it is attributed to."""
    if isinstance(err, LoweringError):
        return CompileFailure(_one_line(err.reason), (err.node,) if err.node is not None else ())
    if isinstance(err, TorchTpuCompileError) and err.diagnostics:
        errors = [d for d in err.diagnostics if d.severity == "error"] or err.diagnostics
        first = errors[0]
        file, line = (first.loc.file, first.loc.line) if first.loc else (None, None)
        return _located(gm, _one_line(first.message), first.op, file, line)
    text = str(err)
    if isinstance(err, CompileError):
        reason = _one_line(_xla_reason(text))
        suspect = _XLA_SUSPECT.search(text)
        if suspect:
            return _located(gm, reason, suspect.group(3), suspect.group(1), int(suspect.group(2)))
        named = _XLA_OP_NAME.search(text)
        return _located(gm, reason, named.group(1) if named else None, None, None)
    return CompileFailure(_one_line(text))


def nodes_to_run_eagerly(err: BaseException, gm: torch.fx.GraphModule, rejected) -> list[torch.fx.Node]:
    """For a static graph whose module the pipeline or XLA rejected: the nodes the failure
    names that are not already running in eager (`rejected`), so they can be partitioned
    out; [] when the failure names none (then the whole graph recovers). A graph with
    dynamic sizes gets none: it is compiled for its concrete sizes first."""
    if has_symbolic_shapes(gm):
        return []
    return [n for n in explain(err, gm).nodes if n.name not in rejected]


def recover(gm: torch.fx.GraphModule, name: str, err: BaseException) -> Callable[..., Any]:
    """What runs `gm` after compiling it failed with `err` (one of COMPILE_FAILURES)."""
    failure = explain(err, gm)
    dynamic = has_symbolic_shapes(gm)
    if config.get("TORCH_TPU_STRICT"):
        _raise_strict(name, err, failure, dynamic)
    if dynamic:
        log.warning(
            "torch_tpu: graph %s cannot be compiled at its bounds (%s); it is compiled for each "
            "concrete input size instead (one compile per size)", name, failure.describe(),
        )
        return SpecializingGraph(gm, name)
    log.warning(
        "torch_tpu: graph %s cannot be compiled (%s); it runs in PyTorch eager. Please report it "
        "to torch_tpu (TORCH_TPU_DUMP_DIR writes the module to reproduce it)", name, failure.describe(),
    )
    return EagerGraph(gm, failure)


class EagerGraph:
    """A graph run by PyTorch eager as a whole (its GraphModule)."""

    def __init__(self, gm: torch.fx.GraphModule, failure: CompileFailure) -> None:
        self.gm = gm
        self.failure = failure

    def __call__(self, *args):
        return self.gm(*args)


class BoundedGraph:
    """A graph compiled at bounds (`_dynamic.DynamicCompiledGraph`, or a partitioned graph
    of them). A size above a bound recompiles during the call; if that compile fails, the
    graph recovers (`recover`) instead of raising from the call."""

    def __init__(self, compiled: Callable[..., Any], gm: torch.fx.GraphModule, name: str) -> None:
        self.compiled = compiled
        self.gm = gm
        self.name = name
        self.recovered: Callable[..., Any] | None = None

    def __call__(self, *args):
        if self.recovered is not None:
            return self.recovered(*args)
        try:
            return self.compiled(*args)
        except COMPILE_FAILURES as err:
            # A bound recompile fails before anything of the graph ran for this call
            # (partitioned graphs: earlier pieces are functional), so running it again is safe.
            self.recovered = recover(self.gm, self.name, err)
            return self.recovered(*args)


class SpecializingGraph:
    """A graph with dynamic sizes that does not compile at its bounds: each concrete input
    signature (tensor shapes and dtypes, scalar values) gets its own static graph, traced
    from `gm` with the call's arguments and compiled (ops that fail there run in eager
    through partitioning). When a specialised graph cannot be compiled at all, the graph
    runs in PyTorch eager from then on: another size would most likely fail the same way,
    and each try costs a compile."""

    def __init__(self, gm: torch.fx.GraphModule, name: str) -> None:
        self.gm = gm
        self.name = name
        self.by_signature: dict[tuple, Callable[..., Any]] = {}
        self.eager: EagerGraph | None = None

    def __call__(self, *args):
        if self.eager is not None:
            return self.eager(*args)
        key = signature(args)
        fn = self.by_signature.get(key)
        if fn is None:
            fn = self._specialize(args, key)
        return fn(*args)

    def _specialize(self, args, key: tuple) -> Callable[..., Any]:
        from ._compile import _compile_graph

        sizes = symbol_values(self.gm, args)
        log.info("torch_tpu: compiling graph %s for sizes %s", self.name, sizes)
        try:
            static = specialize(self.gm, args)
        except Exception as err:  # noqa: BLE001 - retracing is PyTorch's; any failure means eager
            reason = f"tracing it for these sizes failed: {type(err).__name__}: {_one_line(str(err))}"
        else:
            try:
                fn = _compile_graph(static, None, f"{self.name}-static{len(self.by_signature)}")
            except COMPILE_FAILURES as err:
                failure = explain(err, static)
                if config.get("TORCH_TPU_STRICT"):
                    _raise_strict(self.name, err, failure, dynamic=False)
                reason = failure.describe()
            else:
                self.by_signature[key] = fn
                return fn
        log.warning(
            "torch_tpu: graph %s cannot be compiled for its concrete sizes %s either (%s); "
            "it runs in PyTorch eager", self.name, sizes, reason,
        )
        self.eager = EagerGraph(self.gm, CompileFailure(reason))
        return self.eager


def signature(args) -> tuple:
    """What a specialised graph is specialised to: tensor shapes and dtypes, and the
    values of scalar arguments (sizes aot_autograd passes as ints)."""
    return tuple(
        ("tensor", tuple(a.shape), a.dtype) if isinstance(a, torch.Tensor)
        else ("scalar", type(a), a) if isinstance(a, (int, float, bool)) or a is None
        else ("other", type(a))
        for a in args
    )


def symbol_values(gm: torch.fx.GraphModule, args) -> dict[str, int]:
    """The value of each size symbol of `gm`'s inputs in a call with `args`, for messages."""
    values: dict[str, int] = {}
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for node, arg in zip(placeholders, args):
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor) and isinstance(arg, torch.Tensor):
            pairs = zip(val.shape, arg.shape)
        elif isinstance(val, torch.SymInt) and isinstance(arg, int):
            pairs = [(val, arg)]
        else:
            continue
        for sym, size in pairs:
            if isinstance(sym, torch.SymInt) and not sym.node.is_constant():
                values.setdefault(str(sym.node.expr), int(size))
    return values


def specialize(gm: torch.fx.GraphModule, args) -> torch.fx.GraphModule:
    """`gm` traced again with the concrete `args`: every size is static, and size
    arithmetic on them is folded into constants."""
    from ._inplace import capture_aten

    return capture_aten(gm, list(args))


def _located(gm, reason: str, op: str | None, file: str | None, line: int | None) -> CompileFailure:
    nodes = tuple(_nodes_at(gm, op, file, line))
    where = None
    if not nodes and (op or file):
        where = " at ".join(p for p in (op, f"{file}:{line}" if file else None) if p)
    return CompileFailure(reason, nodes, where)


def _nodes_at(gm: torch.fx.GraphModule, op: str | None, file: str | None, line: int | None):
    """The op's nodes at that source line: one, or several when a loop in the model
    (layers) makes the same op at the same line; XLA names only one of them, and they
    fail alike."""
    if op is None and file is None:
        return []
    found = []
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        if op is not None and op_name(node) != op:
            continue
        if file is not None and node_frame(node)[0] != (file, line):  # the line its location names
            continue
        found.append(node)
    return found


def _xla_reason(text: str) -> str:
    """XLA's first line without the module name and the HLO instruction it quotes: an
    instruction that ends the sentence is dropped, one in the middle keeps its name."""
    first = _XLA_PREFIX.sub("", text.strip().splitlines()[0] if text.strip() else "", count=1)
    return _HLO_INSTRUCTION.sub(lambda m: "" if m.group(0).startswith(":") else m.group(1), first)


def _one_line(text: str) -> str:
    line = next((l.strip() for l in str(text).splitlines() if l.strip()), "")
    return line if len(line) <= _MAX_REASON else line[: _MAX_REASON - 3] + "..."


def _raise_strict(name: str, err: BaseException, failure: CompileFailure, dynamic: bool) -> NoReturn:
    """TORCH_TPU_STRICT=1: the failure as an error naming the op, its source line and what
    to do."""
    if isinstance(err, TorchTpuCompileError) and not err.diagnostics:
        raise err  # already worded for the user (strict refusal of an eager fallback)
    instead = "compiles it for each concrete input size" if dynamic else "runs it in PyTorch eager"
    raise TorchTpuCompileError(
        f"torch_tpu: graph {name} cannot be compiled: {failure.describe()}\n"
        f"TORCH_TPU_STRICT=1 forbids falling back; unset it and torch_tpu {instead}. Set "
        "TORCH_TPU_DUMP_DIR to get the module and reproduce it with torchtpu-opt / torchtpu-run, "
        f"and report it to torch_tpu.\nThe compiler said:\n{err}"
    ) from err
