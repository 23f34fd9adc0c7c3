"""A saved `torch_tpu.export`: one folder, every file in a format other tools read, no
pickle anywhere (loading an untrusted folder never executes code):

    model.tpuexport/
      export.json           format tag and version, the StableHLO version, the call
                            signature (argument names, tree specs as `treespec_dumps`,
                            leaf dtypes/shapes/dynamic ranges), @main's interface, and
                            the names of the weights in @main's argument order
      program.vhlo          the StableHLO portable artifact (VHLO bytecode)
      weights.safetensors   the module's parameters and buffers (`_safetensors.py`)

`ExportedProgram.save(path)` writes it; `torch_tpu.load(path)` and `torchtpu-run path`
read it. `is_saved_export(path)` tells the format by that structure.
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any

import torch
import torch.utils._pytree as pytree

from torch_tpu.compiler.importer import InputSpec, OutputSpec

from . import _safetensors
from ._export_signature import ExportSignature

from ._saved_export_format import FORMAT, FORMAT_VERSION, MANIFEST, is_saved_export  # noqa: F401 - re-exported

if TYPE_CHECKING:
    from ._export import ExportedProgram

PROGRAM = "program.vhlo"
WEIGHTS = "weights.safetensors"


class SavedExportError(ValueError):
    """A saved export that cannot be read: names the folder or file and what is wrong."""


def save(ep, path: str) -> None:
    from torch_tpu.compiler.context import stablehlo

    if os.path.exists(path) and not os.path.isdir(path):
        raise SavedExportError(f"{path}: exists and is not a folder; a saved export is a folder")
    os.makedirs(path, exist_ok=True)
    manifest_path = os.path.join(path, MANIFEST)
    if os.path.exists(manifest_path):
        # Overwriting: until the new manifest is written the folder is not an export, so
        # a save that fails halfway never leaves an old manifest over new files.
        os.remove(manifest_path)
    version = stablehlo.get_current_version()
    weights = dict(zip(ep.state_names, ep.state))
    if len(weights) != len(ep.state):
        raise SavedExportError(f"{path}: two weights share a name in {ep.state_names}")
    manifest = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "stablehlo_version": version,
        "torch_version": torch.__version__,
        "signature": ep.signature.to_json(),
        "interface": _interface_to_json(ep.interface),
        "weights": list(ep.state_names),
    }
    with open(os.path.join(path, PROGRAM), "wb") as f:
        f.write(ep.portable_artifact(version))
    _safetensors.save_file(weights, os.path.join(path, WEIGHTS), {"format": FORMAT})
    # The manifest last: a folder that has one is complete.
    with open(manifest_path, "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=1)


def load(path: str) -> ExportedProgram:
    """Reads a folder written by `ExportedProgram.save` into an `ExportedProgram`, called
    as the original module was (`ep(ids, attention_mask=m)`). Nothing is unpickled: the
    weights are safetensors, the signature JSON, the program a StableHLO portable artifact
    (checked in a forked child before MLIR reads it). A damaged or foreign folder raises
    `SavedExportError` naming the file and what is wrong."""
    from torch_tpu.compiler.context import stablehlo
    from torch_tpu.compiler.diagnostics import DiagnosticEngine
    from torch_tpu.compiler.source import check_untrusted_bytecode

    from ..program import shared_context
    from ._export import ExportedProgram, ProgramInterface

    if not os.path.isdir(path):
        raise SavedExportError(f"{path}: not a saved torch_tpu export (expected a folder written by ExportedProgram.save)")
    manifest_path = os.path.join(path, MANIFEST)
    manifest = _read_json(manifest_path)
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise SavedExportError(f"{manifest_path}: not a torch_tpu export manifest (no \"format\": \"{FORMAT}\")")
    if manifest.get("format_version") != FORMAT_VERSION:
        raise SavedExportError(
            f"{manifest_path}: format version {manifest.get('format_version')!r}; this torch_tpu reads "
            f"version {FORMAT_VERSION}"
        )
    try:
        signature = ExportSignature.from_json(manifest["signature"])
        interface = _interface_from_json(manifest["interface"])
        weight_names = [str(n) for n in manifest["weights"]]
        for tree in (signature.out_spec, *(a.tree for a in signature.args)):
            pytree.treespec_loads(tree)  # a malformed spec fails here, not at the first call
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as err:
        raise SavedExportError(f"{manifest_path}: malformed manifest ({type(err).__name__}: {err})") from None

    weights_path = os.path.join(path, WEIGHTS)
    try:
        tensors, _ = _safetensors.load_file(weights_path)
    except _safetensors.SafetensorsError as err:
        raise SavedExportError(str(err)) from None
    missing = [n for n in weight_names if n not in tensors]
    if missing:
        raise SavedExportError(f"{weights_path}: missing weight(s) {', '.join(missing)} named by {MANIFEST}")
    state = [tensors[n] for n in weight_names]

    program_path = os.path.join(path, PROGRAM)
    try:
        with open(program_path, "rb") as f:
            artifact = f.read()
    except OSError as err:
        raise SavedExportError(f"{program_path}: cannot read the program: {err.strerror or err}") from None
    problem = check_untrusted_bytecode(artifact)
    if problem is not None:
        raise SavedExportError(f"{program_path}: not a valid StableHLO portable artifact: {problem}")
    context = shared_context()
    engine = DiagnosticEngine()
    try:
        # MLIR's own messages (why the artifact is invalid) go into the error, not stderr.
        with engine.capture(context):
            module = stablehlo.deserialize_portable_artifact(context, artifact)
    except Exception as err:  # noqa: BLE001 - the bindings raise several types
        detail = "; ".join(d.message for d in engine.errors) or str(err)
        raise SavedExportError(f"{program_path}: not a valid StableHLO portable artifact: {detail}") from None
    _check_arity(module, interface, state, program_path)
    return ExportedProgram(module, state, weight_names, signature, interface)


def _check_arity(module, interface, state, program_path: str) -> None:
    """The program takes what the manifest says: the weights, the user's leaves, a seed."""
    main = None
    for op in module.body.operations:
        if op.operation.name == "func.func" and op.attributes["sym_name"].value == "main":
            main = op
    if main is None:
        raise SavedExportError(f"{program_path}: the program has no @main function")
    declared = len(interface.inputs) + sum(len(s.dynamic_dims) for s in interface.inputs)
    got = len(main.regions[0].blocks[0].arguments)
    if got != declared:
        raise SavedExportError(
            f"{program_path}: @main takes {got} arguments, the manifest describes {declared}; "
            "the files of this export do not belong together"
        )


def _read_json(path: str) -> Any:
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as err:
        raise SavedExportError(f"{path}: cannot read: {err.strerror or err}") from None
    try:
        return json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as err:
        raise SavedExportError(f"{path}: not valid UTF-8 JSON ({err})") from None


def _interface_to_json(interface) -> dict:
    def output(o: OutputSpec) -> dict:
        if o.kind == "constant" and not isinstance(o.value, (int, float, bool, type(None))):
            raise SavedExportError(f"cannot save an output constant of type {type(o.value).__name__}")
        return {"kind": o.kind, "index": o.index, "value": o.value, "dynamic_dims": list(o.dynamic_dims)}

    return {
        "inputs": [
            {"name": s.name, "shape": list(s.shape), "dtype": str(s.dtype).removeprefix("torch."),
             "is_scalar": s.is_scalar, "role": s.role, "dynamic_dims": list(s.dynamic_dims)}
            for s in interface.inputs
        ],
        "outputs": [output(o) for o in interface.outputs],
        "num_results": interface.num_results,
        "user_outputs": list(interface.user_outputs),
    }


def _interface_from_json(data: dict):
    from ._export import ProgramInterface

    def dtype(name: str) -> torch.dtype:
        value = getattr(torch, str(name), None)
        if not isinstance(value, torch.dtype):
            raise ValueError(f"unknown dtype {name!r}")
        return value

    inputs = tuple(
        InputSpec(str(s["name"]), tuple(int(d) for d in s["shape"]), dtype(s["dtype"]), bool(s["is_scalar"]),
                  str(s["role"]), tuple(int(d) for d in s["dynamic_dims"]))
        for s in data["inputs"]
    )
    outputs = tuple(
        OutputSpec(str(o["kind"]), int(o["index"]), o["value"], tuple(int(d) for d in o["dynamic_dims"]))
        for o in data["outputs"]
    )
    return ProgramInterface(inputs, outputs, int(data["num_results"]), tuple(int(i) for i in data["user_outputs"]))
