"""TORCH_TPU_DUMP_DIR: everything needed to replay a compiled program with `torchtpu-opt`
and `torchtpu-run` alone.

Every program kind `compile_module` compiles is dumped (compiled FX graphs, eager single
ops, fused traces, jax_ops, exports, tpu_dist graphs and collectives). Per program, under
`<dir>/<name>/` (an FX graph's name, else `<kind>-<what>-<hash>`):

* `fx_graph.py` — for FX graphs, the ATen graph as torch_tpu received it;
* `pipeline.txt` — the exact textual pipeline that ran (named pipelines, options);
* `00-input.mlir` — the module before the first pass; `NN-<step>.mlir` after each
  top-level step of the pipeline, named pipelines expanded (`compiler.pipeline.top_level_steps`):
  one file per pass, except that a nest such as `func.func(...)` is one step and one file;
* `final.mlir` — what was handed to XLA; `torchtpu-opt 00-input.mlir
  --pass-pipeline="$(cat pipeline.txt)" --mlir-print-debuginfo` prints it byte for byte;
* `inputs.json` — one entry per argument of the final module, in order (shape, dtype,
  role; the size arguments of bounded graphs included), with the Python source and the
  parameter name (FQN) of the argument where it is a module's parameter or buffer, and
  `"donated": true` for an argument compiled as donated (`CompileSpec.donate_argnums`: XLA
  may reuse its buffer for a result, as a static KV cache's or an optimizer state's);
* `error.txt` — when the module could not be built, a pass rejected it or XLA did;
* `README.txt` — the commands that replay it (`torchtpu-run --donate` with the donated
  arguments: the program compiled as it ran, its results written over those inputs).
"""

from __future__ import annotations

import json
import logging
import os
import re
from pathlib import Path
from typing import Any, Sequence

from torch_tpu.core import config

log = logging.getLogger("torch_tpu")

# gm.meta key: {placeholder name: the Python source of that graph input} (Dynamo's, e.g.
# "L['self']._modules['fc']._parameters['weight']"), set by the backend where known.
ARGUMENT_SOURCES = "torch_tpu.argument_sources"
_MODULE_PATH = re.compile(r"_(?:modules|parameters|buffers)\['([^']+)'\]")


def parameter_name(source: str | None) -> str | None:
    """`fc.weight` for a Dynamo source naming a module's parameter or buffer, else None."""
    if not source or "_parameters[" not in source and "_buffers[" not in source:
        return None
    parts = _MODULE_PATH.findall(source)
    return ".".join(parts) if parts else None


def module_text(op) -> str:
    """How torchtpu-opt prints a module with --mlir-print-debuginfo (so replays compare
    byte for byte)."""
    return op.get_asm(enable_debug_info=True, assume_verified=True)


class GraphDump:
    """Writes the stages of one graph's compilation under `<dir>/<name>/`. `donated`: the
    arguments the program is compiled to donate (inputs.json and the README's run command
    say so: without them a replay compiles another program, one that copies those inputs)."""

    def __init__(self, name: str, donated: Sequence[int] = ()) -> None:
        root = config.get("TORCH_TPU_DUMP_DIR")
        self.donated = tuple(sorted(donated))
        self.dir: Path | None = None
        if root:
            self.dir = Path(root) / name
            try:
                self.dir.mkdir(parents=True, exist_ok=True)
            except OSError as err:
                log.warning("torch_tpu: cannot write dumps to %s: %s", self.dir, err)
                self.dir = None

    @property
    def enabled(self) -> bool:
        return self.dir is not None

    def write(self, filename: str, text: str) -> None:
        if self.dir is None:
            return
        try:
            (self.dir / filename).write_text(text)
        except OSError as err:
            log.warning("torch_tpu: cannot write dump %s: %s", self.dir / filename, err)

    def write_error(self, stage: str, message: str) -> None:
        self.write("error.txt", f"{stage} failed:\n{message}\n")

    def run_pipeline(self, module_op, pipeline: str, engine) -> bool:
        """Runs `pipeline` on `module_op`; when dumping, records the pipeline, the module
        before the first pass and after every step, and the error if one fails."""
        from torch_tpu.compiler.pipeline import run_pipeline  # the compiler, when a program is built

        if self.dir is None:
            return run_pipeline(module_op, pipeline, engine)
        self.write("pipeline.txt", pipeline)
        self.write("00-input.mlir", module_text(module_op))

        def after_each(index: int, step, op) -> None:
            flag = re.sub(r"[^A-Za-z0-9_.-]+", "_", step.name)
            self.write(f"{index:02d}-{flag}.mlir", module_text(op))

        ok = run_pipeline(module_op, pipeline, engine, after_each=after_each)
        if ok:
            self.write("final.mlir", module_text(module_op))
        else:
            self.write_error("the pass pipeline", engine.format())
        self.write_readme(ok)
        return ok

    def write_inputs(self, module_op, specs, sources: dict[str, str] | None = None) -> None:
        """inputs.json: the final module's arguments in order. The first arguments are the
        graph's inputs (`specs`, in order); arguments passes added after them (the i32 sizes
        of bounded graphs) are described from their attributes."""
        if self.dir is None:
            return
        entries = []
        for index, (shape, dtype, attrs) in enumerate(_main_arguments(module_op)):
            entry: dict[str, Any] = {"index": index, "shape": shape, "dtype": dtype}
            if index < len(specs):
                spec = specs[index]
                entry.update(name=spec.name, role=spec.role)
                source = (sources or {}).get(spec.name) if spec.role == "input" else None
                if source is not None:
                    entry["source"] = source
                    entry["parameter"] = parameter_name(source)
            elif "torchtpu.size_of" in attrs:
                entry.update(name=f"size of {attrs['torchtpu.size_of']}", role="size")
            if index in self.donated:
                entry["donated"] = True
            entries.append(entry)
        self.write("inputs.json", json.dumps(entries, indent=1))

    def write_readme(self, ok: bool) -> None:
        assert self.dir is not None
        here = str(self.dir)
        lines = [
            "Replay the passes (prints final.mlir byte for byte):",
            f"  torchtpu-opt {os.path.join(here, '00-input.mlir')} "
            f"--pass-pipeline=\"$(cat {os.path.join(here, 'pipeline.txt')})\" --mlir-print-debuginfo",
        ]
        if ok:
            donate = f" --donate {','.join(map(str, self.donated))}" if self.donated else ""
            lines += [
                "Run the module (one --input FILE.npy per entry of inputs.json, in order):",
                f"  torchtpu-run {os.path.join(here, 'final.mlir')}{donate} --input arg0.npy --input arg1.npy ...",
            ]
            if donate:
                lines.append("  (--donate: the arguments the program was compiled to donate, as it ran; "
                             "inputs.json marks them)")
        else:
            lines.append("The pipeline failed: error.txt has the located diagnostics.")
        self.write("README.txt", "\n".join(lines) + "\n")


def _main_arguments(module_op) -> list[tuple[list[int], str, dict[str, str]]]:
    """(shape, element type, argument attributes as text) of each argument of the
    module's public function."""
    from torch_tpu.compiler.context import ir

    for op in module_op.regions[0].blocks[0].operations:
        op = op.operation
        if op.name != "func.func" or "sym_visibility" in op.attributes:
            continue
        fn_type = ir.FunctionType(ir.TypeAttr(op.attributes["function_type"]).value)
        arg_attrs = list(ir.ArrayAttr(op.attributes["arg_attrs"])) if "arg_attrs" in op.attributes else []
        out = []
        for index, t in enumerate(fn_type.inputs):
            try:
                shaped = ir.RankedTensorType(t)
            except ValueError:
                shaped = None
            attrs: dict[str, str] = {}
            if index < len(arg_attrs):
                d = ir.DictAttr(arg_attrs[index])
                attrs = {d[i].name: str(d[i].attr) for i in range(len(d))}
            out.append((list(shaped.shape) if shaped else [], str(shaped.element_type if shaped else t), attrs))
        return out
    return []
