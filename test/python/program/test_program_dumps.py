"""The one compile spine (`torch_tpu.program.compile_module`): every program kind writes
its module to TORCH_TPU_DUMP_DIR in the form torchtpu-opt replays, and repeated compiles
are answered by the one program cache."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from free_ports import free_port_pair
import torch

import torch_tpu
import torch_tpu.device  # noqa: F401 - registers the device where autoload is off
from torch_tpu.program import Lowered, ProgramKey, compile_module
from torch_tpu.program.cache import PROGRAMS
from torch_tpu.program.key import KINDS

REPO = Path(__file__).resolve().parents[3]


def _replay(folder: Path) -> str:
    """torchtpu-opt on the module before the first pass with the recorded pipeline."""
    pipeline = (folder / "pipeline.txt").read_text()
    result = subprocess.run(
        [sys.executable, "-m", "torch_tpu.tools.opt", str(folder / "00-input.mlir"),
         f"--pass-pipeline={pipeline}", "--mlir-print-debuginfo"],
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def _folders(root: Path, kind: str) -> list[Path]:
    """The dump folders of programs of `kind` (FX graphs are named after the graph)."""
    found = []
    for folder in sorted(p for p in root.iterdir() if p.is_dir()):
        if folder.name.startswith(f"{kind}-"):
            found.append(folder)
        elif kind == "fx_graph" and (folder / "fx_graph.py").exists() and "-dist-" not in folder.name:
            found.append(folder)
        elif kind == "dist_graph" and "-dist-" in folder.name:
            found.append(folder)
    return found


def _eager_op():
    (torch.ones(3, device="tpu") * 3).cpu()


_ONCE: dict = {}


def _once(name, make):
    """One object per test session (a jax_op is registered once; a compiled function keeps
    its Dynamo cache, so a second call compiles no graph)."""
    if name not in _ONCE:
        _ONCE[name] = make()
    return _ONCE[name]


def _graph_io():
    fn = _once("graph_io", lambda: torch.compile(lambda v: v.t() @ v, backend="tpu"))
    x = torch.arange(12.0, device="tpu").reshape(3, 4)
    fn(x.t()).cpu()  # a non-dense argument, a 2-d result


def _fused():
    from torch_tpu.device import EagerMode, set_eager_mode

    with set_eager_mode(EagerMode.FUSED):
        x = torch.ones(4, device="tpu")
        for _ in range(2):  # the second flush of the same trace runs the fused program
            y = (x * 2 + 1).sin()
            y.cpu()


def _fx_graph():
    torch._dynamo.reset()
    torch.compile(lambda v: torch.tanh(v) @ v.T, backend="tpu")(torch.randn(3, 2))


def _jax_op():
    jax = pytest.importorskip("jax")
    op = _once("jax_op", lambda: torch_tpu.jax_op("test_program_dump_cos", lambda v: jax.numpy.cos(v) * 2))
    op(torch.randn(5))


def _export():
    model = torch.nn.Linear(3, 2)
    ep = torch_tpu.export(model, (torch.randn(4, 3),))
    ep(torch.randn(4, 3))


def _spmd():
    from torch_tpu.runtime import CacheConfig, Client
    from torch_tpu.spmd import compile_spmd

    client = Client.create("cpu", num_cpu_devices=2, cache_config=CacheConfig())
    text = (
        "func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {\n"
        '  %y = "torchtpu.collective"(%x) {kind = "all_reduce", reduce_op = "sum", '
        "replica_groups = dense<[[0, 1]]> : tensor<1x2xi64>, group_ranks = array<i64: 0, 1>} "
        ": (tensor<4xf32>) -> tensor<4xf32>\n  return %y : tensor<4xf32>\n}\n"
    )
    program = compile_spmd(text, 2, client=client, thin=False, name="spmd_sum")
    out = program([[torch.ones(4)], [torch.full((4,), 2.0)]])
    torch.testing.assert_close(out[0][0], torch.full((4,), 3.0))


def _sharded():
    from torch_tpu.runtime import CacheConfig, Client
    from torch_tpu.spmd import ShardedProgram, annotate_shardings

    client = Client.create("cpu", num_cpu_devices=2, cache_config=CacheConfig())
    text = ("func.func @main(%x: tensor<4x8xf32>) -> tensor<4x8xf32> {\n"
            "  %y = stablehlo.add %x, %x : tensor<4x8xf32>\n  return %y : tensor<4x8xf32>\n}\n")
    module = annotate_shardings(text, [("x", 2)], [("x", None)], [("x", None)])
    program = ShardedProgram(module, client=client, thin=False, name="sharded_double")
    x = torch.arange(32, dtype=torch.float32).reshape(4, 8)
    torch.testing.assert_close(program(x)[0], 2 * x)


IN_PROCESS = {
    "fx_graph": _fx_graph, "eager_op": _eager_op, "graph_io": _graph_io, "fused": _fused,
    "jax_op": _jax_op, "export": _export, "spmd": _spmd, "sharded": _sharded,
}


def test_every_kind_has_a_dump_test():
    assert set(IN_PROCESS) | {"collective", "dist_graph"} == set(KINDS)


@pytest.mark.parametrize("kind", sorted(IN_PROCESS))
def test_a_program_of_each_kind_is_dumped_and_replays(kind, tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_TPU_DUMP_DIR", str(tmp_path))
    PROGRAMS.clear()  # a program compiled earlier in this process would not be dumped again
    from torch_tpu.device import _ops

    monkeypatch.setattr(_ops, "_PLANS", {})  # nor an eager op planned earlier
    IN_PROCESS[kind]()
    _check_dumps(tmp_path, kind)


def _check_dumps(root: Path, kind: str) -> None:
    """At least one program of `kind` was dumped; each compiled one replays byte for byte,
    each that failed (an eager op the lowering table rejects: it runs on the CPU) says why."""
    folders = _folders(root, kind)
    compiled = [f for f in folders if (f / "final.mlir").exists()]
    assert compiled, f"no compiled {kind} dump in {sorted(p.name for p in root.iterdir())}"
    for folder in folders:
        names = {p.name for p in folder.iterdir()}
        if folder not in compiled:
            assert "failed" in (folder / "error.txt").read_text(), (folder, names)
            continue
        assert {"pipeline.txt", "00-input.mlir", "final.mlir", "README.txt"} <= names, (folder, names)
        assert _replay(folder) == (folder / "final.mlir").read_text(), folder


def test_tpu_dist_collectives_and_graphs_are_dumped_and_replay(tmp_path):
    pytest.importorskip("torch.distributed")
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")}
    env.update(TORCH_TPU_DUMP_DIR=str(tmp_path), PYTHONUNBUFFERED="1",
               PYTHONPATH=os.pathsep.join([str(REPO / "python"), env.get("PYTHONPATH", "")]))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=1", "--master_addr=127.0.0.1",
           f"--master_port={free_port_pair()}", str(Path(__file__).parent / "workers_dist_dump.py")]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=480)
    assert proc.returncode == 0 and "dist dump job OK" in proc.stdout, (proc.stdout + proc.stderr)[-6000:]
    for kind in ("collective", "dist_graph"):
        _check_dumps(tmp_path, kind)
    [collective] = _folders(tmp_path, "collective")
    assert "torchtpu.collective" in (collective / "00-input.mlir").read_text()
    assert "torchtpu-collective-pipeline" in (collective / "pipeline.txt").read_text()


# -- the one cache ---------------------------------------------------------------------------------


def test_repeated_compiles_hit_the_one_cache():
    from torch_tpu.program.pipelines import compile_pipeline

    builds = []

    def build():
        from torch_tpu.compiler.context import ir
        from torch_tpu.program import shared_context

        builds.append(1)
        with shared_context():
            return Lowered(ir.Module.parse("func.func @main(%x: tensor<2xf32>) -> tensor<2xf32> {\n"
                                          "  %y = stablehlo.add %x, %x : tensor<2xf32>\n"
                                          "  return %y : tensor<2xf32>\n}\n"), "extra")

    key = ProgramKey("eager_op", ("test_repeated_compiles", 2), "highest")
    hits = PROGRAMS.hits
    first = compile_module(build, key=key, name="double", pipeline=compile_pipeline("highest"))
    second = compile_module(build, key=ProgramKey("eager_op", ("test_repeated_compiles", 2), "highest"),
                            name="double", pipeline=compile_pipeline("highest"))
    assert second is first and builds == [1] and PROGRAMS.hits == hits + 1
    assert first.lowered == "extra"
    torch.testing.assert_close(first.executable(torch.ones(2))[0], torch.full((2,), 2.0))
    # Another precision mode is another program.
    other = compile_module(build, key=ProgramKey("eager_op", ("test_repeated_compiles", 2), "high"),
                           name="double", pipeline=compile_pipeline("high"))
    assert other is not first and builds == [1, 1]


def test_a_program_is_named_after_its_kind_and_name_in_xla():
    """An unnamed module gets `<kind>.<name>` as its symbol: the name XLA gives the HLO
    module, which the chip's profiler shows per program (every unnamed one was `main`).
    A module that names itself keeps its name."""
    from torch_tpu.compiler.context import ir
    from torch_tpu.program import shared_context
    from torch_tpu.program.pipelines import compile_pipeline

    body = ("func.func @main(%x: tensor<3xf32>) -> tensor<3xf32> {\n"
            "  %y = stablehlo.multiply %x, %x : tensor<3xf32>\n  return %y : tensor<3xf32>\n}\n")

    def build(header=""):
        with shared_context():
            return ir.Module.parse(f"module {header}{{\n{body}}}" if header else body)

    named = compile_module(build, key=ProgramKey("eager_op", ("test_program_name", 3), "highest"),
                           name="aten.square / test", pipeline=compile_pipeline("highest"))
    assert ir.StringAttr(named.module.operation.attributes["sym_name"]).value == "eager_op.aten.square_test"
    assert [m.name for m in named.executable._raw.hlo_modules()] == ["eager_op.aten.square_test"]
    own = compile_module(lambda: build("@mine "), key=ProgramKey("eager_op", ("test_program_name", 4), "highest"),
                         name="square", pipeline=compile_pipeline("highest"))
    assert ir.StringAttr(own.module.operation.attributes["sym_name"]).value == "mine"


@pytest.mark.parametrize("kind", ["eager_op", "graph_io", "jax_op"])
def test_each_kind_compiles_once_and_then_hits_the_cache(kind, monkeypatch):
    """The second use of a program kind compiles nothing (no runtime compile, no pipeline):
    the eager op with its plan forgotten, the graph argument programs, a jax_op on CPU."""
    from torch_tpu.device import _ops
    from torch_tpu.program import context

    # Compiled (or found) once; twice, since the device registers its per-op kernels on
    # the first tpu tensor (`ensure_op_kernels`): later calls take other ops' plans.
    # The device's plans forgotten first too: in a long session (a pytest-xdist worker that
    # ran the OpInfo sweep) the plans may outlive their programs, which the one cache
    # evicts oldest first past MAX_PROGRAMS; the calls below put them in afresh.
    monkeypatch.setattr(_ops, "_PLANS", {})
    IN_PROCESS[kind]()
    IN_PROCESS[kind]()
    monkeypatch.setattr(_ops, "_PLANS", {})
    compiles = []
    real = context.client()

    class Counting:
        def __getattr__(self, name):
            return getattr(real, name)

        def compile(self, *args, **kwargs):
            compiles.append(kwargs.get("name"))
            return real.compile(*args, **kwargs)

    monkeypatch.setattr("torch_tpu.program.compile.client", lambda: Counting())
    hits = PROGRAMS.hits
    IN_PROCESS[kind]()
    assert compiles == [] and PROGRAMS.hits > hits


def test_a_donated_argument_is_marked_and_replayed_donated(tmp_path, monkeypatch):
    """A graph writing its tpu input in place (a static cache's `index_copy_`) compiles with
    that input donated: inputs.json marks it, and the README's torchtpu-run command donates
    it too, so the replay compiles the program that ran (not one that copies the cache)."""
    import json

    import numpy as np

    monkeypatch.setenv("TORCH_TPU_DUMP_DIR", str(tmp_path))
    PROGRAMS.clear()
    torch._dynamo.reset()

    def write(cache, pos, row):
        cache.index_copy_(0, pos, row)
        return cache.sum(dim=1)

    fn = torch.compile(write, backend="tpu")
    cache = torch.zeros(4, 3, device="tpu")
    fn(cache, torch.tensor([2], device="tpu"), torch.ones(1, 3, device="tpu")).cpu()
    folders = [f for f in _folders(tmp_path, "fx_graph") if (f / "inputs.json").exists()]
    assert len(folders) == 1, sorted(p.name for p in tmp_path.iterdir())
    folder = folders[0]
    inputs = json.loads((folder / "inputs.json").read_text())
    donated = [entry["index"] for entry in inputs if entry.get("donated")]
    assert [(inputs[i]["shape"], inputs[i]["dtype"]) for i in donated] == [([4, 3], "f32")], inputs
    assert f"--donate {donated[0]}" in (folder / "README.txt").read_text()

    arrays = {"f32": np.float32, "i64": np.int64}
    values = {((4, 3), "f32"): np.zeros((4, 3)), ((1,), "i64"): np.array([2]), ((1, 3), "f32"): np.ones((1, 3))}
    files = []
    for entry in inputs:
        path = tmp_path / f"arg{entry['index']}.npy"
        np.save(path, values[(tuple(entry["shape"]), entry["dtype"])].astype(arrays[entry["dtype"]]))
        files += ["--input", str(path)]
    out = tmp_path / "out.npz"
    result = subprocess.run(
        [sys.executable, "-m", "torch_tpu.tools.run", str(folder / "final.mlir"), "--donate",
         ",".join(map(str, donated)), *files, "-o", str(out)],
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr
    results = [np.load(out)[k] for k in sorted(np.load(out).files)]
    assert any(r.shape == (4,) and r.tolist() == [0.0, 0.0, 3.0, 0.0] for r in results), results
