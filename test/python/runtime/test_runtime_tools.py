"""torchtpu-run and torchtpu-cache: outputs, input forms, and one-line errors."""

from __future__ import annotations

import os

import ml_dtypes
import numpy as np
import pytest
from rt_helpers import add_module, run_python, scale_module
from torch_tpu.runtime import CacheConfig, Client, cache_entry
from torch_tpu.tools import cache as cache_tool
from torch_tpu.tools import run as run_tool

MIXED = """
module @mixed {
  func.func public @main(%a: tensor<2x2xbf16>, %b: tensor<3xi1>, %c: tensor<2xcomplex<f32>>, %d: tensor<ui8>)
      -> (tensor<2x2xbf16>, tensor<3xi1>, tensor<2xcomplex<f32>>, tensor<ui8>, tensor<2xf32>) {
    %0 = stablehlo.add %a, %a : tensor<2x2xbf16>
    %1 = stablehlo.not %b : tensor<3xi1>
    %2 = stablehlo.multiply %c, %c : tensor<2xcomplex<f32>>
    %3 = stablehlo.add %d, %d : tensor<ui8>
    %4 = stablehlo.constant dense<[1.0e+20, 1.5e-07]> : tensor<2xf32>
    return %0, %1, %2, %3, %4 : tensor<2x2xbf16>, tensor<3xi1>, tensor<2xcomplex<f32>>, tensor<ui8>, tensor<2xf32>
  }
}
"""


@pytest.fixture()
def files(tmp_path):
    def write(name: str, text: str) -> str:
        path = tmp_path / name
        path.write_text(text)
        return str(path)

    return write


def test_run_prints_results_deterministically(files, capsys, tmp_path):
    module = files("mixed.mlir", MIXED)
    np.save(tmp_path / "a.npy", np.array([[1.5, -2], [0.25, 3]], dtype=ml_dtypes.bfloat16))
    argv = [module, "--input", str(tmp_path / "a.npy"), "--input-literal", "3xi1=true,false,1",
            "--input-literal", "2xcomplex<f32>=1+2j,-1j", "--input-literal", "ui8=200"]
    assert run_tool.main(argv) == 0
    assert capsys.readouterr().out == (
        "result[0]: tensor<2x2xbf16>\n[[3, -4],\n [0.5, 6]]\n"
        "result[1]: tensor<3xi1>\n[false, true, false]\n"
        "result[2]: tensor<2xcomplex<f32>>\n[(-3+4j), (-1-0j)]\n"
        "result[3]: tensor<ui8>\n144\n"
        "result[4]: tensor<2xf32>\n[1e+20, 1.5e-07]\n"
    )


def test_run_writes_npz(files, tmp_path, capsys):
    module = files("add.mlir", add_module("2x2"))
    out = tmp_path / "out.npz"
    assert run_tool.main([module, "--input-literal", "2x2xf32=1,2,3,4", "--input-literal", "2x2xf32=0.5", "-o", str(out)]) == 0
    assert capsys.readouterr().out == ""
    with np.load(out) as z:
        np.testing.assert_array_equal(z["result0"], np.array([[1.5, 2.5], [3.5, 4.5]], np.float32))


@pytest.mark.parametrize(
    "argv, message",
    [
        (["{m}", "--input-literal", "2x2xf32=1"], "torchtpu-run: error: add.mlir: @main takes 2 arguments (tensor<2x2xf32>, tensor<2x2xf32>), got 1 input (expected 2)"),
        (["{m}", "--input-literal", "2x2xf32=1", "--input-literal", "4xf32=1"], "torchtpu-run: error: add.mlir: argument 1 (--input-literal '4xf32=1'): expected tensor<2x2xf32>, got tensor<4xf32>"),
        (["{m}", "--input-literal", "2x2xf32=1,2"], "torchtpu-run: error: --input-literal '2x2xf32=1,2': 4 values needed for shape [2, 2], got 2"),
        (["{m}", "--input-literal", "2x2xf9=1"], "torchtpu-run: error: --input-literal '2x2xf9=1': unknown element type 'f9'"),
        (["{m}", "--input-literal", "3xi8=1,2,300"], "torchtpu-run: error: --input-literal '3xi8=1,2,300': value out of range for i8"),
        (["{m}", "--input", "{d}/missing.npy"], "torchtpu-run: error: cannot read input '{d}/missing.npy': no such file"),
        (["{d}/missing.mlir"], "torchtpu-run: error: cannot read '{d}/missing.mlir': No such file or directory"),
        (["{m}", "--replicas", "0"], "torchtpu-run: error: --replicas 0: must be at least 1"),
        (["{m}", "--bogus"], "torchtpu-run: error: unrecognized arguments: --bogus (see --help)"),
    ],
)
def test_run_errors_are_one_line(files, capsys, tmp_path, argv, message):
    module = files("add.mlir", add_module("2x2"))
    argv = [a.format(m=module, d=tmp_path) for a in argv]
    assert run_tool.main(argv) == 1
    err = capsys.readouterr().err
    assert err.startswith(message.format(d=tmp_path)) and err.count("\n") == 1, err


def test_run_rejected_module_and_pickled_input(files, capsys, tmp_path):
    bad = files("bad.mlir", "module {\n  func.func @main(%a: tensor<2xf32>) -> tensor<2xf32> {\n    return %b : tensor<2xf32>\n  }\n}\n")
    assert run_tool.main([bad]) == 1
    err = capsys.readouterr().err
    assert err.startswith("bad.mlir:3:12: error: use of undeclared SSA value name") and err.count("\n") == 1
    np.save(tmp_path / "obj.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    module = files("add.mlir", add_module("2x2"))
    assert run_tool.main([module, "--input", str(tmp_path / "obj.npy")]) == 1
    assert "holds pickled Python objects" in capsys.readouterr().err


def test_run_explains_unregistered_dialect_ops(files, capsys):
    """XLA's parser advises `-allow-unregistered-dialect`, a flag torchtpu-run does not have
    (and that could not help: XLA compiles StableHLO only)."""
    module = files("views.mlir", "func.func @main(%a: tensor<2xf32>) -> tensor<2xf32> {\n"
                   '  %0 = "torchtpu.mystery"(%a) : (tensor<2xf32>) -> tensor<2xf32>\n'
                   "  return %0 : tensor<2xf32>\n}\n")
    assert run_tool.main([module, "--input-literal", "2xf32=1"]) == 1
    err = capsys.readouterr().err
    assert "allow-unregistered-dialect" not in err and err.count("\n") == 1, err
    assert "views.mlir:2:26: error: operation of an unregistered dialect: XLA compiles StableHLO only" in err
    assert "torchtpu-opt views.mlir --torchtpu-decompose-views --torchtpu-inverse-views" in err


def test_run_never_prints_a_traceback(files):
    bad = files("bad.mlir", "this is not mlir")
    code = f"import sys\nfrom torch_tpu.tools.run import main\nsys.exit(main([{bad!r}, '--input-literal', 'f32=1']))"
    result = run_python(code)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr.startswith("bad.mlir:1:1: error:") and result.stderr.count("\n") == 1, result.stderr


def test_format_array_numbers():
    fmt = run_tool.format_array
    assert fmt(np.array([0.1, 1.0, -0.0, np.nan, -np.inf], np.float32)) == "[0.1, 1, -0, nan, -inf]"
    assert fmt(np.array(7, np.int64)) == "7"
    assert fmt(np.zeros((2, 0), np.float32)) == "[[],\n []]"
    assert fmt(np.arange(8, dtype=np.int32).reshape(2, 2, 2)) == "[[[0, 1],\n  [2, 3]],\n\n [[4, 5],\n  [6, 7]]]"


def _populate(l2: str, l3: str) -> list[str]:
    c = Client.create("cpu", cache_config=CacheConfig(l2_dir=l2, l3_url=l3))
    keys = [c.compile(scale_module(f), name=f"scale{f}").key for f in (2.0, 3.0)]
    return [cache_entry.entry_name(k) for k in keys]


def test_cache_tool_stats_list_verify_clear(cache_dirs, capsys):
    l2, l3 = cache_dirs
    names = _populate(l2, l3)
    common = ["--dir", l2, "--url", l3]
    assert cache_tool.main(["stats", *common]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(f"L2  {l2}: 2 entries,") and out[1].startswith(f"L3  {l3}: 2 entries,")
    assert cache_tool.main(["list", *common]) == 0
    listing = capsys.readouterr().out
    assert listing.count("  cpu  scale") == 4 and all(n[: -len(".ttpu")] in listing for n in names)
    assert cache_tool.main(["verify", *common]) == 0
    assert capsys.readouterr().out.endswith("verified 4 entries: 4 ok, 0 bad\n")
    with open(os.path.join(l3, names[0]), "r+b") as f:
        f.seek(80)
        f.write(b"\xff\xff")
    assert cache_tool.main(["verify", *common]) == 1
    out = capsys.readouterr().out
    assert f"L3  {names[0]}: BAD: metadata checksum mismatch (corrupt entry)" in out or "payload checksum" in out
    assert cache_tool.main(["verify", "--delete-bad", *common]) == 0
    assert len(os.listdir(l3)) == 1
    assert cache_tool.main(["clear", "--tier", "l2", *common]) == 0
    assert capsys.readouterr().out.endswith(f"L2  {l2}: removed 2 entries\n")
    assert [n for n in os.listdir(l2) if n.endswith(".ttpu")] == []


def test_cache_tool_refuses_unsafe_directory_and_needs_a_url(cache_dirs, capsys):
    l2, _ = cache_dirs
    os.makedirs(l2)
    os.chmod(l2, 0o777)
    assert cache_tool.main(["list", "--dir", l2, "--tier", "l2"]) == 1
    assert "other users can write it (mode 0777)" in capsys.readouterr().err
    assert cache_tool.main(["stats", "--tier", "l3"]) == 1
    assert capsys.readouterr().err == "torchtpu-cache: error: no L3 cache: pass --url or set TORCH_TPU_CACHE_URL\n"
    assert cache_tool.main([]) == 1
    assert capsys.readouterr().err.startswith("torchtpu-cache: error: the following arguments are required")
