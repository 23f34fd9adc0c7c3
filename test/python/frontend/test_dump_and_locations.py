"""TORCH_TPU_DUMP_DIR writes a reproducible record; ops carry the user's source line."""

import subprocess
import sys

import torch

from torch_tpu.compiler.importer import import_graph


def _f(x):
    return torch.tanh(x) @ x.T


def test_dump_dir_has_every_stage(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_TPU_DUMP_DIR", str(tmp_path))
    torch._dynamo.reset()
    torch.compile(_f, backend="tpu")(torch.randn(3, 3))
    [graph_dir] = [p for p in tmp_path.iterdir() if p.is_dir()]
    names = sorted(p.name for p in graph_dir.iterdir())
    assert "fx_graph.py" in names and "final.mlir" in names and "inputs.json" in names
    assert any(n.endswith("imported.mlir") for n in names)
    # The dumped module is a valid input of torchtpu-opt.
    result = subprocess.run(
        [sys.executable, "-m", "torch_tpu.tools.opt", str(graph_dir / "final.mlir"), "--torchtpu-verify"],
        capture_output=True, text=True,
    )
    assert result.returncode == 0, result.stderr
    assert "stablehlo.dot_general" in result.stdout


def test_locations_name_op_and_user_line():
    from torch.fx.experimental.proxy_tensor import make_fx

    gm = make_fx(_f, tracing_mode="fake")(torch.randn(3, 3))
    for node in gm.graph.nodes:  # make_fx keeps no stack traces; give them one
        node.meta["stack_trace"] = f'  File "{__file__}", line 12, in _f\n    return ...'
    text = import_graph(gm).text(debug_info=True)
    assert '"aten.tanh.default"' in text
    assert "test_dump_and_locations.py\":12" in text
