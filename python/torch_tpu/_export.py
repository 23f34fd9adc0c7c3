"""`torch_tpu.export(module, args)`: a model as a StableHLO module that any StableHLO
consumer can load — text, bytecode, and a versioned portable artifact (VHLO)."""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.utils._pytree as pytree

from torch_tpu.compiler.diagnostics import DiagnosticEngine
from torch_tpu.compiler.importer import ImportedGraph, import_graph
from torch_tpu.compiler.lowering.decompositions import decomposition_table
from torch_tpu.compiler.pipeline import run_pipeline
from torch_tpu.compiler.pipelines import named_pipeline

from ._errors import TorchTpuCompileError
from ._precision import current_mode


def pipeline_for(mode: str) -> str:
    """`torchtpu-export-pipeline`: the compile pipeline plus CHLO legalization, so an
    exported artifact is pure StableHLO (VHLO has no CHLO ops)."""
    return named_pipeline("torchtpu-export-pipeline", precision=mode)


@dataclass
class ExportedProgram:
    """The exported `@main`. Its arguments are the model's parameters and buffers (in
    `state` order, values in `state`) followed by the user inputs."""

    imported: ImportedGraph
    state: list[torch.Tensor]
    state_names: list[str]
    user_outputs: list[int]  # positions of user outputs among the graph's outputs
    _compiled: Any = field(default=None, repr=False)

    @property
    def text(self) -> str:
        return self.imported.text()

    @property
    def bytecode(self) -> bytes:
        import io

        buffer = io.BytesIO()
        self.imported.module.operation.write_bytecode(buffer)
        return buffer.getvalue()

    def portable_artifact(self, target_version: str | None = None) -> bytes:
        """A StableHLO portable artifact (VHLO bytecode) for `target_version` (default:
        this jaxlib's current StableHLO version)."""
        from torch_tpu.compiler.context import stablehlo

        version = target_version or stablehlo.get_current_version()
        # The text form round-trips through VHLO here; the Module overload rejects
        # modules whose ops carry our name locations in this jaxlib build.
        return stablehlo.serialize_portable_artifact_str(self.imported.text(), version)

    def __call__(self, *args):
        """Runs the exported module on the default device (convenience and testing)."""
        from ._compile import CompiledGraph

        if self._compiled is None:
            from torch_tpu.runtime import get_client

            self._compiled = CompiledGraph(get_client().compile(self.imported.module), self.imported)
        flat_args = [a for a in pytree.tree_leaves(args) if isinstance(a, torch.Tensor)]
        outputs = self._compiled(*self.state, *flat_args)
        flat = pytree.tree_leaves(outputs)
        user = [flat[i] for i in self.user_outputs]
        return user[0] if len(user) == 1 else tuple(user)


def export(module: torch.nn.Module, args: tuple, kwargs: dict | None = None) -> ExportedProgram:
    """Exports `module` called on `args` (via torch.export, decomposed with torch_tpu's
    decomposition table) as a StableHLO module."""
    from torch.export.graph_signature import InputKind, OutputKind

    ep = torch.export.export(module, tuple(args), kwargs or {})
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
    imported = import_graph(gm)
    engine = DiagnosticEngine()
    mode = current_mode()
    if not run_pipeline(imported.module.operation, pipeline_for(mode), engine):
        raise TorchTpuCompileError(f"torch_tpu.export: the compiler pipeline failed:\n{engine.format()}")
    user_outputs = [i for i, spec in enumerate(ep.graph_signature.output_specs) if spec.kind == OutputKind.USER_OUTPUT]
    return ExportedProgram(imported, state, names, user_outputs)
