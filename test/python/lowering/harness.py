"""Numerical checks of lowerings against PyTorch eager on CPU.

`check(fn, *args)` traces `fn` to an ATen graph with make_fx (no decompositions, so
each op reaches its own lowering), imports it, runs the frontend's pass pipeline on it,
compiles and runs it through the runtime (XLA:CPU here), and compares every output with
eager `fn(*args)`.
"""

from __future__ import annotations

import torch
import torch.utils._pytree as pytree
from torch.fx.experimental.proxy_tensor import make_fx

from torch_tpu.compiler.context import ir
from torch_tpu.compiler.diagnostics import DiagnosticEngine
from torch_tpu.compiler.importer import import_graph
from torch_tpu.compiler.pipeline import run_pipeline
from torch_tpu.compiler.pipelines import named_pipeline
from torch_tpu.runtime import get_client


def execute(imported, args: list[torch.Tensor], seed: int = 0) -> list:
    """Runs an ImportedGraph the way torch.compile(backend="tpu") does: the
    `torchtpu-compile-pipeline` at the float32 matmul precision in force (verifier, precision,
    so a module the pipeline rejects fails here), then the runtime's compile (through its
    cache) and execute, torch tensors in and out. The pipeline runs on a copy: `imported`
    keeps the importer's output, which tests inspect."""
    # A copy as an ir.Module (what the frontend hands the runtime; it rejects a bare op).
    module = ir.Module.parse(imported.module.operation.get_asm(enable_debug_info=True), context=imported.context)
    engine = DiagnosticEngine()
    pipeline = named_pipeline("torchtpu-compile-pipeline", precision=torch.get_float32_matmul_precision())
    assert run_pipeline(module.operation, pipeline, engine), f"{pipeline} failed:\n{engine.format()}"
    executable = get_client().compile(module, name="lowering-test")
    flat = [a if isinstance(a, torch.Tensor) else torch.tensor(a) for a in args]
    if any(spec.role == "rng_state" for spec in imported.inputs):
        flat.append(torch.tensor([seed, 0x5EED], dtype=torch.uint64))
    results = executable(*(t.detach().contiguous() for t in flat))
    # Results may share memory with runtime buffers: tests own copies.
    tensors = [r.clone() for r in results]
    leaves = [tensors[o.index] if o.kind == "tensor" else o.value for o in imported.outputs]
    return pytree.tree_unflatten(leaves, imported.output_tree)


def lower_and_run(fn, *args, decompositions=None):
    # Real tensors captured by `fn` become constants of the graph (get_attr nodes).
    gm = make_fx(fn, tracing_mode="fake", decomposition_table=decompositions or {}, _allow_non_fake_inputs=True)(*args)
    imported = import_graph(gm)
    tensor_args = [a for a in pytree.tree_leaves(args) if isinstance(a, torch.Tensor)]
    return execute(imported, tensor_args), gm, imported


def check(fn, *args, rtol=None, atol=None, decompositions=None, ops=None):
    """Asserts that the lowered `fn` matches eager. `ops`, when given, lists ATen
    overloads that must appear in the traced graph (so the test exercises them)."""
    expected = fn(*args)
    actual, gm, imported = lower_and_run(fn, *args, decompositions=decompositions)
    if ops is not None:
        targets = {n.target for n in gm.graph.nodes if n.op == "call_function"}
        missing = [op for op in ops if op not in targets]
        assert not missing, f"graph does not contain {missing}:\n{gm.graph}"
    # torch.return_types (max, sort, topk, ...) trace to plain tuples: compare leaves.
    exp_leaves = pytree.tree_leaves(expected)
    act_leaves = pytree.tree_leaves(actual)
    assert len(exp_leaves) == len(act_leaves), f"output structure differs: {actual} vs {expected}"
    for a, e in zip(act_leaves, exp_leaves):
        if isinstance(e, torch.Tensor):
            torch.testing.assert_close(a, e, rtol=rtol, atol=atol, equal_nan=True)
        else:
            assert a == e, (a, e)
    return imported
