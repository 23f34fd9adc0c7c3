"""TORCH_TPU_DUMP_DIR writes a reproducible record; ops carry the user's source line."""

import json
import re
import subprocess
import sys

import numpy as np

import torch

from torch_tpu.compiler.importer import import_graph


def _f(x):
    return torch.tanh(x) @ x.T


def _graph_dirs(root):
    return sorted(p for p in root.iterdir() if p.is_dir())


def _replay(graph_dir) -> str:
    """torchtpu-opt on the module before the first pass with the recorded pipeline."""
    pipeline = (graph_dir / "pipeline.txt").read_text()
    result = subprocess.run(
        [sys.executable, "-m", "torch_tpu.tools.opt", str(graph_dir / "00-input.mlir"),
         f"--pass-pipeline={pipeline}", "--mlir-print-debuginfo"],
        capture_output=True, text=True,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_dump_replays_byte_for_byte_and_runs(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_TPU_DUMP_DIR", str(tmp_path))
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2)).eval()
    x = torch.randn(5, 3)
    with torch.no_grad():
        torch.compile(model, backend="tpu")(x)
    [graph_dir] = _graph_dirs(tmp_path)
    names = sorted(p.name for p in graph_dir.iterdir())
    assert names == ["00-input.mlir", "01-torchtpu-verify.mlir", "02-torchtpu-narrow-iotas.mlir",
                     "03-torchtpu-unflatten-dots.mlir", "04-torchtpu-set-precision.mlir", "05-torchtpu-narrow-opmath.mlir",
                     "06-torchtpu-elide-roundings.mlir", "README.txt", "final.mlir", "fx_graph.py", "inputs.json",
                     "pipeline.txt"], names
    assert (graph_dir / "pipeline.txt").read_text().startswith("builtin.module(torchtpu-compile-pipeline")
    assert _replay(graph_dir) == (graph_dir / "final.mlir").read_text()
    readme = (graph_dir / "README.txt").read_text()
    assert "torchtpu-opt" in readme and "pipeline.txt" in readme and "torchtpu-run" in readme

    # inputs.json: the module's arguments in order, parameters named by their FQN.
    inputs = json.loads((graph_dir / "inputs.json").read_text())
    state = dict(model.named_parameters())
    assert sorted(e["parameter"] for e in inputs if e.get("parameter")) == sorted(state)
    [user] = [e for e in inputs if not e.get("parameter")]
    assert user["shape"] == [5, 3] and user["dtype"] == "f32"

    # torchtpu-run on final.mlir with those arguments gives eager's result.
    files = []
    for entry in inputs:
        value = state[entry["parameter"]] if entry.get("parameter") else x
        files += ["--input", str(tmp_path / f"arg{entry['index']}.npy")]
        np.save(tmp_path / f"arg{entry['index']}.npy", value.detach().numpy())
    out = tmp_path / "out.npz"
    result = subprocess.run(
        [sys.executable, "-m", "torch_tpu.tools.run", str(graph_dir / "final.mlir"), *files, "-o", str(out)],
        capture_output=True, text=True,
    )
    assert result.returncode == 0, result.stderr
    got = np.load(out)
    torch.testing.assert_close(torch.from_numpy(got[got.files[0]]), model(x).detach(), rtol=1e-5, atol=1e-5)


def test_dump_of_a_bounded_graph_lists_its_size_arguments(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_TPU_DUMP_DIR", str(tmp_path))
    torch._dynamo.reset()
    x = torch.randn(5, 3)
    torch._dynamo.mark_dynamic(x, 0, min=2, max=16)
    torch.compile(lambda t: t.sum(0) * 2, backend="tpu")(x)
    [graph_dir] = _graph_dirs(tmp_path)
    assert "torchtpu-materialize-bounds" in "".join(p.name for p in graph_dir.iterdir())
    assert "bounds=materialize" in (graph_dir / "pipeline.txt").read_text()
    assert _replay(graph_dir) == (graph_dir / "final.mlir").read_text()
    inputs = json.loads((graph_dir / "inputs.json").read_text())
    # Dynamo's size symbol (a scalar input), x padded to its bound, then x's run-time size.
    assert [e["shape"] for e in inputs] == [[], [16, 3], []]
    assert inputs[-1]["role"] == "size" and inputs[-1]["dtype"] == "i32"
    assert [e["role"] for e in inputs[:2]] == ["input", "input"]


def test_dump_of_the_views_path(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_TPU_DUMP_DIR", str(tmp_path))
    torch._dynamo.reset()

    def step(cache, x):
        cache[1] = x
        return cache.sum()

    with torch.no_grad():
        torch.compile(step, backend="tpu", options={"functionalize": "torchtpu"})(torch.zeros(3, 4), torch.ones(4))
    [graph_dir] = _graph_dirs(tmp_path)
    names = {p.name for p in graph_dir.iterdir()}
    assert {"pipeline.txt", "00-input.mlir", "final.mlir", "inputs.json"} <= names
    assert "02-torchtpu-inline.mlir" in names  # jax_op calls are inlined before the view passes
    assert "03-torchtpu-decompose-views.mlir" in names and "04-torchtpu-inverse-views.mlir" in names
    assert "torchtpu.store" in (graph_dir / "00-input.mlir").read_text()
    assert _replay(graph_dir) == (graph_dir / "final.mlir").read_text()


def test_a_graph_the_pipeline_rejects_is_dumped_with_the_error(tmp_path, monkeypatch):
    from torch_tpu.compiler.context import ir
    from torch_tpu.compiler.lowering.registry import LOWERINGS, Lowering

    def rule(ctx, x):  # an op torchtpu-verify rejects: a located pipeline failure
        return ir.Operation.create("torchtpu.test_unknown", results=[x.type], operands=[x]).result

    monkeypatch.setitem(LOWERINGS, torch.ops.aten.sin.default, Lowering(torch.ops.aten.sin.default, rule, "test", padding=LOWERINGS[torch.ops.aten.sin.default].padding))
    monkeypatch.setenv("TORCH_TPU_DUMP_DIR", str(tmp_path))
    torch._dynamo.reset()
    torch.compile(lambda t: torch.sin(t) + 1, backend="tpu")(torch.randn(4))  # runs (partitioned)
    rejected = [d for d in _graph_dirs(tmp_path) if (d / "error.txt").exists()]
    assert rejected, [p.name for p in tmp_path.iterdir()]
    error = (rejected[0] / "error.txt").read_text()
    assert "the pass pipeline failed" in error and "torchtpu.test_unknown" in error
    assert (rejected[0] / "00-input.mlir").exists() and not (rejected[0] / "final.mlir").exists()


def test_locations_name_op_and_user_line():
    from torch.fx.experimental.proxy_tensor import make_fx

    gm = make_fx(_f, tracing_mode="fake")(torch.randn(3, 3))
    for node in gm.graph.nodes:  # make_fx keeps no stack traces; give them one
        node.meta["stack_trace"] = f'  File "{__file__}", line 12, in _f\n    return ...'
    text = import_graph(gm).text(debug_info=True)
    assert '"aten.tanh.default"' in text
    assert "test_dump_and_locations.py\":12" in text


def test_compiled_programs_hold_no_64_bit_iota(tmp_path, monkeypatch):
    # PyTorch's positions and indices are int64 (`torch.arange`, argmax, a causal mask's
    # comparisons); XLA:TPU computed a fused 64-bit iota wrongly on a v5e (a tiny Llama's
    # attention mask from arange positions: 1.4e-2 off CPU), and its module with 32-bit iotas
    # converted to 64 bits was exact there (torchtpu-narrow-iotas). The compiled program
    # holds no 64-bit iota and gives eager's values.
    monkeypatch.setenv("TORCH_TPU_DUMP_DIR", str(tmp_path))
    torch._dynamo.reset()

    def f(x):
        pos = torch.arange(x.shape[1], device=x.device).unsqueeze(0) + 0
        packed = (torch.cat([pos[:, :1] - 1, pos], 1).diff(dim=-1) != 1).cumsum(-1)
        i = torch.arange(x.shape[1], device=x.device)
        mask = (i[None, :] <= i[:, None]) & (packed[0][:, None] == packed[0][None, :])
        return (x @ x.transpose(-1, -2)).masked_fill(~mask, -1e9).softmax(-1), x.argmax(-1)

    x = torch.randn(2, 6, 4)
    got = torch.compile(f, backend="tpu")(x)
    for a, b in zip(got, f(x)):
        torch.testing.assert_close(a, b)
    [graph_dir] = _graph_dirs(tmp_path)
    final = (graph_dir / "final.mlir").read_text()
    assert "stablehlo.iota" in final
    assert not re.search(r"stablehlo\.iota .*xi64>", final), final
