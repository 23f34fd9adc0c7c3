"""`torch_tpu.export(module, args, kwargs, dynamic_shapes=...)`: a model as a StableHLO
module that any StableHLO consumer can load — text, bytecode, and a versioned portable
artifact (VHLO) — callable as the module was (`ep(ids, attention_mask=m)`), and saved with
its weights (`ep.save(path)`, `torch_tpu.load(path)`; `_saved_export.py`)."""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.utils._pytree as pytree

from torch_tpu.compiler.importer import InputSpec, OutputSpec, import_graph
from torch_tpu.compiler.lowering.decompositions import decomposition_table

from ..program.errors import TorchTpuCompileError
from ._export_signature import ArgSpec, ExportSignature, SymbolSpec, argument_names, leaf_spec
from ..program.fingerprint import FxGraphFingerprint
from ..program.precision import current_mode
from ..program.process_groups import process_groups_of
from ..program import Lowered, ProgramKey, compile_module
from ..program.pipelines import export_pipeline

# How an exported module takes dynamic dims: padded static buffers plus one i32 size per
# dynamic dim (`torchtpu-materialize-bounds`), what every runtime needs today
# (`_dynamic.MATERIALIZE_BOUNDS_PLATFORMS`). Fixed, not per machine: an artifact must not
# depend on where it was exported.
EXPORT_BOUNDS_MODE = "materialize"


@dataclass(frozen=True)
class ProgramInterface:
    """How @main is called: its arguments (`inputs`: the model's state in `state` order,
    then the user's tensors, then an RNG seed for graphs with random ops; dynamic ones
    padded to their bounds, their sizes after every argument), its results (`outputs`: one
    per graph output leaf, `num_results` of them before the returned sizes) and which
    graph outputs are the user's (`user_outputs`; the rest are buffer mutations)."""

    inputs: tuple[InputSpec, ...]
    outputs: tuple[OutputSpec, ...]
    num_results: int
    user_outputs: tuple[int, ...]

    @property
    def output_tree(self) -> Any:  # what CompiledGraph reads; unused by ExportedProgram
        return pytree.tree_structure(list(range(len(self.outputs))))


@dataclass
class ExportedProgram:
    """The exported `@main` (see `ProgramInterface`), the state it takes (`state`, named
    by `state_names`: the module's parameter and buffer FQNs) and how it is called
    (`signature`). Call it as the module was called (`ep(ids, attention_mask=m)`;
    `describe()` prints the signature); `text`, `bytecode` and `portable_artifact()` are
    the module for other StableHLO consumers; `save(path)` writes a folder with the
    weights that `torch_tpu.load(path)` and `torchtpu-run path --input ...` read."""

    module: Any  # the ir.Module
    state: list[torch.Tensor]
    state_names: list[str]
    signature: ExportSignature
    interface: ProgramInterface
    _compiled: Any = field(default=None, repr=False)
    # What `export` compiled through `program.compile_module` (XLA runs at the first call);
    # None for a program read back by `torch_tpu.load`.
    _program: Any = field(default=None, repr=False)

    @property
    def user_outputs(self) -> list[int]:
        return list(self.interface.user_outputs)

    @property
    def text(self) -> str:
        return self.module.operation.get_asm(enable_debug_info=False)

    @property
    def bytecode(self) -> bytes:
        import io

        buffer = io.BytesIO()
        self.module.operation.write_bytecode(buffer)
        return buffer.getvalue()

    def portable_artifact(self, target_version: str | None = None) -> bytes:
        """A StableHLO portable artifact (VHLO bytecode) for `target_version` (default:
        this jaxlib's current StableHLO version)."""
        from torch_tpu.compiler.context import stablehlo

        version = target_version or stablehlo.get_current_version()
        # The text form round-trips through VHLO here; the Module overload rejects
        # modules whose ops carry our name locations in this jaxlib build.
        return stablehlo.serialize_portable_artifact_str(self.text, version)

    def _loaded_program(self):
        """The program `export` built, or (read back from a folder) the module as it is."""
        if self._program is not None:
            return self._program
        from ..program import ProgramKey, compile_module
        from ..program.pipelines import NO_PASSES

        return compile_module(self.module, key=ProgramKey("export", self.text), name="torch_tpu.export",
                              pipeline=NO_PASSES, defer=True, reuse=False)

    def describe(self) -> str:
        """The call signature: `(ids: int64[2, 1..64], *, attention_mask: float32[2, 1..64])`."""
        return self.signature.describe()

    def save(self, path: str) -> None:
        """Writes the program, its weights and its signature to the folder `path`
        (`torch_tpu.load(path)` reads it back; `torchtpu-run path --input ...` runs it)."""
        from ._saved_export import save

        save(self, path)

    def __call__(self, *args, **kwargs):
        """Runs the exported module on the default device, called as the original module
        was (positional and keyword arguments of the same structure, shapes within the
        exported ranges). Returns the module's output structure."""
        from ..backend import _dynamic
        from ..backend._compile import CompiledGraph

        inputs = self.signature.flatten_call(args, kwargs)
        if self._compiled is None:
            self._compiled = CompiledGraph(self._loaded_program().load(), self.interface)
        compiled = self._compiled
        padded, sizes = _dynamic.pad_to_bounds(
            [s for s in self.interface.inputs if s.role == "input"], [*self.state, *inputs]
        )
        results = compiled.executable(*compiled.prepare_inputs(padded), *sizes)
        leaves = _dynamic.narrow_to_sizes(results, self.interface.outputs, self.interface.num_results)
        user = [leaves[i] for i in self.interface.user_outputs]
        return pytree.tree_unflatten(user, pytree.treespec_loads(self.signature.out_spec))


def export(
    module: torch.nn.Module,
    args: tuple,
    kwargs: dict | None = None,
    *,
    dynamic_shapes: Any = None,
) -> ExportedProgram:
    """Exports `module` called on `args`/`kwargs` (via torch.export, decomposed with
    torch_tpu's decomposition table) as a StableHLO module. `dynamic_shapes` is
    torch.export's (`{"ids": {1: torch.export.Dim("seq", max=512)}}`): each dynamic dim is
    compiled once at its bound (its `max`; without one, TORCH_TPU_DYNAMIC_BOUND) and the
    program serves every size in its range (docs/explanation/bounded-dynamism.md)."""
    from torch.export.graph_signature import InputKind, OutputKind

    from ..backend import _dynamic

    args, kwargs = tuple(args), dict(kwargs or {})
    ep = torch.export.export(module, args, kwargs, dynamic_shapes=dynamic_shapes)
    with warnings.catch_warnings():
        # torch 2.13's run_decompositions deep-copies its own module call graph, whose
        # LeafSpec objects warn on copy (a torch-internal deprecation, nothing callers can
        # change); every other warning still reaches the caller.
        warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated", category=FutureWarning)
        ep = ep.run_decompositions(decomposition_table())
    gm = ep.graph_module
    state: list[torch.Tensor] = []
    names: list[str] = []
    for spec in ep.graph_signature.input_specs:
        if spec.kind == InputKind.USER_INPUT:
            continue
        if spec.kind == InputKind.TOKEN:
            # Effect tokens only order side effects; the module takes an empty tensor.
            state.append(torch.empty(0))
            names.append(spec.arg.name)
            continue
        source = ep.constants if spec.kind in (InputKind.CONSTANT_TENSOR,) else ep.state_dict
        value = source.get(spec.target) if spec.target in source else ep.constants.get(spec.target)
        if not isinstance(value, torch.Tensor):
            raise TorchTpuCompileError(f"torch_tpu.export: input {spec.arg.name} ({spec.kind.name}) is not a tensor")
        state.append(value.detach())
        names.append(spec.target)
    bounds = _dynamic.initial_bounds(gm) if _has_symbols(gm) else None
    mode = current_mode()
    settings = f"precision={mode}" + (f";{_dynamic.settings_key(bounds)}" if bounds else "")

    def build() -> Lowered:
        graph = import_graph(gm, symbol_bounds=bounds, process_groups=process_groups_of(gm))
        return Lowered(graph.module, graph)

    def rejected(engine) -> Exception:
        return TorchTpuCompileError(f"torch_tpu.export: the compiler pipeline failed:\n{engine.format()}")

    # Passed and dumped now; XLA compiles at the first call (`ExportedProgram.__call__`):
    # an export may only be saved.
    fingerprint = FxGraphFingerprint(gm, settings)
    program = compile_module(
        build, key=ProgramKey("export", fingerprint), name="torch_tpu.export",
        pipeline=export_pipeline(mode, EXPORT_BOUNDS_MODE if bounds else "none"),
        dump_files={"fx_graph.py": lambda: gm.print_readable(print_output=False)},
        input_specs=lambda graph: graph.inputs, rejected=rejected, defer=True, reuse=False,
        building="importing the graph",
    )
    imported = program.lowered
    user_outputs = tuple(
        i for i, spec in enumerate(ep.graph_signature.output_specs) if spec.kind == OutputKind.USER_OUTPUT
    )
    signature = _signature(module, ep, args, kwargs, bounds or {})
    interface = ProgramInterface(tuple(imported.inputs), tuple(imported.outputs), imported.num_results, user_outputs)
    return ExportedProgram(imported.module, state, names, signature, interface, _program=program)


def _has_symbols(gm: torch.fx.GraphModule) -> bool:
    from torch_tpu.compiler.importer.dynamic import has_symbolic_shapes

    return has_symbolic_shapes(gm)


def _signature(module, ep, args: tuple, kwargs: dict, bounds: dict) -> ExportSignature:
    """Argument names (from `module.forward`), each argument's tree and leaves, with the
    ranges of dynamic dims: [torch.export's min, the bound compiled for]."""
    args_spec, kwargs_spec = ep.call_spec.in_spec.children()
    kwarg_names = list(kwargs_spec.context)
    placeholders = {n.name: n.meta.get("val") for n in ep.graph_module.graph.nodes if n.op == "placeholder"}
    user_vals = iter([placeholders.get(spec.arg.name) for spec in ep.graph_signature.input_specs
                      if spec.kind.name == "USER_INPUT"])
    ranges = {}
    symbols: dict[str, SymbolSpec] = {}
    for sym, bound in bounds.items():
        vr = ep.range_constraints.get(sym)
        low = int(vr.lower) if vr is not None and _is_finite(vr.lower) else 0
        ranges[sym] = (low, int(bound))
        symbols[str(sym)] = SymbolSpec(_symbol_label(sym, placeholders.values()), low, int(bound))
    specs: list[ArgSpec] = []
    named = [(n, False, v, s) for n, v, s in zip(argument_names(module, len(args)), args, args_spec.children())]
    named += [(k, True, kwargs[k], s) for k, s in zip(kwarg_names, kwargs_spec.children())]
    for name, keyword, value, tree in named:
        leaves = []
        for leaf in pytree.tree_leaves(value):
            # torch.export makes a placeholder for each leaf (scalars specialized).
            leaves.append(leaf_spec(leaf, next(user_vals), ranges))
        specs.append(ArgSpec(name, keyword, pytree.treespec_dumps(tree), tuple(leaves)))
    return ExportSignature(tuple(specs), pytree.treespec_dumps(ep.call_spec.out_spec), symbols)


def _symbol_label(sym, vals) -> str:
    """The name users gave a size symbol: the torch.export `Dim`'s (`seq`), read from the
    ShapeEnv's sources (a dim's source maps to its Dim's name; a root Dim that no input
    takes as is, as in `2*seq` alone, is a source named after it); else the symbol."""
    shape_env = next(
        (s.node.shape_env for v in vals if isinstance(v, torch.Tensor) for s in v.shape if isinstance(s, torch.SymInt)),
        None,
    )
    if shape_env is None:
        return str(sym)
    debug_names = getattr(shape_env, "source_name_to_debug_name", {}) or {}
    for source in shape_env.var_to_sources.get(sym, []):
        name = source.name() if callable(source.name) else source.name
        if name in debug_names:
            return str(debug_names[name])
        if str(name).isidentifier():
            return str(name)
    return str(sym)


def _is_finite(x) -> bool:
    try:
        return abs(int(x)) < 2**62
    except (TypeError, ValueError, OverflowError):
        return False
