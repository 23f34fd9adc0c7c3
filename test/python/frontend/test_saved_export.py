"""Saved exports (#12 item 6): save -> load in a fresh process -> call equals eager;
calls by keyword with errors that name the argument; corrupt files are clear errors;
torchtpu-run runs a saved export; dynamic_shapes serve every size within the bound, and the
constraints torch.export recorded between dims are checked at every call (#30 items 3, 10)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
import torch.nn as nn
from torch.export import Dim

import torch_tpu
from torch_tpu.exported import _safetensors
from torch_tpu.exported._saved_export import MANIFEST, PROGRAM, WEIGHTS, SavedExportError

from models import mlp

TOL = dict(rtol=1e-4, atol=1e-4)


class TinyEncoder(nn.Module):
    """Transformer-ish: embedding, attention with a key-padding mask, layer norm, a head;
    the mask is a keyword argument with a default, as in Hugging Face models."""

    def __init__(self, vocab: int = 40, dim: int = 16) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.attn = nn.MultiheadAttention(dim, 2, batch_first=True)
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab)
        self.register_buffer("scale", torch.tensor(0.5))

    def forward(self, ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> dict:
        h = self.emb(ids)
        a, _ = self.attn(h, h, h, need_weights=False)
        h = self.norm(h + a)
        if attention_mask is not None:
            h = h * attention_mask.unsqueeze(-1)
        return {"logits": self.head(h) * self.scale, "pooled": h.sum(1)}


def _encoder_inputs(seq: int = 6, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 40, (2, seq), generator=g)
    mask = (torch.rand(2, seq, generator=g) > 0.3).float()
    return ids, mask


@pytest.fixture(scope="module")
def encoder():
    torch.manual_seed(0)
    model = TinyEncoder().eval()
    ids, mask = _encoder_inputs()
    return model, torch_tpu.export(model, (ids,), {"attention_mask": mask})


# -- safetensors ------------------------------------------------------------------------


def test_safetensors_round_trips_every_supported_dtype(tmp_path):
    g = torch.Generator().manual_seed(0)
    tensors = {}
    for dtype in _safetensors.DTYPE_NAMES:
        base = torch.randn(3, 5, generator=g) * 7
        tensors[str(dtype)] = base.to(dtype) if dtype is not torch.complex64 else torch.complex(base, -base)
    tensors["scalar"] = torch.tensor(2.5, dtype=torch.float64)
    tensors["empty"] = torch.empty(0, 3, dtype=torch.int32)
    tensors["strided"] = torch.arange(12.0).reshape(3, 4).t()  # non-contiguous: saved row-major
    path = tmp_path / "w.safetensors"
    _safetensors.save_file(tensors, path, {"note": "x"})
    back, metadata = _safetensors.load_file(path)
    assert metadata == {"note": "x"}
    assert list(back) == list(tensors)
    for name, t in tensors.items():
        assert back[name].dtype == t.dtype and back[name].shape == t.shape, name
        # Bitwise: compare raw bytes (NaN-safe, covers float8 and bool).
        assert back[name].contiguous().reshape(-1).view(torch.uint8).tolist() == t.contiguous().reshape(-1).view(torch.uint8).tolist(), name
    # The layout is the published one: u64 LE header length, JSON header, data 8-aligned.
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8 : 8 + n])
    assert n % 8 == 0
    assert header["torch.bfloat16"]["dtype"] == "BF16"
    assert header["torch.float8_e4m3fn"]["dtype"] == "F8_E4M3"
    assert header["scalar"] == {"dtype": "F64", "shape": [], "data_offsets": header["scalar"]["data_offsets"]}


def test_safetensors_rejects_unsupported_dtype(tmp_path):
    with pytest.raises(_safetensors.SafetensorsError, match=r"'z' has dtype torch.complex128"):
        _safetensors.save_file({"z": torch.zeros(2, dtype=torch.complex128)}, tmp_path / "w.safetensors")


def _with_header(header: dict, data: bytes) -> bytes:
    encoded = json.dumps(header).encode()
    return len(encoded).to_bytes(8, "little") + encoded + data


@pytest.mark.parametrize(
    "blob, message",
    [
        (b"\x01\x02", "shorter than the 8-byte header length"),
        ((10**12).to_bytes(8, "little") + b"{}", "exceeds the format's limit"),
        ((64).to_bytes(8, "little") + b"{}", "runs past the end of the file"),
        ((4).to_bytes(8, "little") + b"[1] ", "does not start with '{'"),
        ((4).to_bytes(8, "little") + b"{\xff\xfe}", "not UTF-8 JSON"),
        (_with_header({"a": {"dtype": "F99", "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 4), "unknown dtype 'F99'"),
        (_with_header({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}, b"\0" * 4), "needs 8 bytes"),
        (_with_header({"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}, b"\0" * 8), "a hole or an overlap"),
        (_with_header({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, b"\0" * 4), "truncated"),
        (_with_header({"a": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 0]}}, b""), "invalid shape"),
        (_with_header({"a": [1]}, b""), "exactly dtype, shape and data_offsets"),
        (len(b'{"a": 1, "a": 2}').to_bytes(8, "little") + b'{"a": 1, "a": 2}', "duplicate key"),
    ],
)
def test_safetensors_corrupt_file_is_a_clear_error(tmp_path, blob, message):
    path = tmp_path / "bad.safetensors"
    path.write_bytes(blob)
    with pytest.raises(_safetensors.SafetensorsError, match="bad.safetensors: not a valid safetensors file") as err:
        _safetensors.load_file(path)
    assert message in str(err.value)


# -- calls ------------------------------------------------------------------------------


def test_keyword_call_returns_the_module_structure(encoder):
    model, ep = encoder
    ids, mask = _encoder_inputs(seed=1)
    out = ep(ids, attention_mask=mask)
    assert isinstance(out, dict) and set(out) == {"logits", "pooled"}
    torch.testing.assert_close(out, model(ids, attention_mask=mask), **TOL)
    # Positionally too, as Python binds the module's forward.
    torch.testing.assert_close(ep(ids, mask), model(ids, mask), **TOL)


@pytest.mark.parametrize(
    "call, error, message",
    [
        (lambda ep, i, m: ep(i), TypeError, "missing argument 'attention_mask'; expected (ids: int64[2, 6], *, attention_mask: float32[2, 6])"),
        (lambda ep, i, m: ep(i, attention_mask=m, mask=m), TypeError, "unexpected keyword argument 'mask'; expected (ids:"),
        (lambda ep, i, m: ep(i, m, attention_mask=m), TypeError, "multiple values for argument 'attention_mask'"),
        (lambda ep, i, m: ep(i, m, m), TypeError, "takes at most 2 positional arguments (ids: int64[2, 6], *, attention_mask: float32[2, 6]), got 3"),
        (lambda ep, i, m: ep(i, attention_mask=m.double()), TypeError, "argument 'attention_mask' must have dtype float32, got float64"),
        (lambda ep, i, m: ep(i[:, :4], attention_mask=m), ValueError, "argument 'ids' must have shape int64[2, 6], got [2, 4]"),
        (lambda ep, i, m: ep((i,), attention_mask=m), TypeError, "argument 'ids' has structure"),
        (lambda ep, i, m: ep(i, attention_mask=None), TypeError, "argument 'attention_mask' must be a tensor float32[2, 6], got NoneType"),
    ],
)
def test_wrong_calls_name_the_argument(encoder, call, error, message):
    _, ep = encoder
    ids, mask = _encoder_inputs()
    with pytest.raises(error) as err:
        call(ep, ids, mask)
    assert message in str(err.value)


def test_specialized_scalar_argument_must_match():
    class Scaled(nn.Module):
        def forward(self, x, scale=2):
            return x * scale

    ep = torch_tpu.export(Scaled(), (torch.ones(3),), {"scale": 3})
    torch.testing.assert_close(ep(torch.ones(3), scale=3), torch.full((3,), 3.0))
    with pytest.raises(ValueError, match="argument 'scale' was exported as the constant 3"):
        ep(torch.ones(3), scale=4)


# -- save / load --------------------------------------------------------------------------

_FRESH_PROCESS = textwrap.dedent(
    """
    import sys, numpy as np, torch, torch_tpu
    folder = sys.argv[1]
    mlp = torch_tpu.load(folder + "/mlp.tpuexport")
    np.save(folder + "/mlp_out.npy", mlp(torch.from_numpy(np.load(folder + "/x.npy"))).numpy())
    enc = torch_tpu.load(folder + "/enc.tpuexport")
    ids, mask = (torch.from_numpy(np.load(folder + f"/{n}.npy")) for n in ("ids", "mask"))
    out = enc(ids, attention_mask=mask)
    np.save(folder + "/logits.npy", out["logits"].numpy())
    np.save(folder + "/pooled.npy", out["pooled"].numpy())
    """
)


def test_save_and_load_in_a_fresh_process_equals_eager(tmp_path, encoder):
    torch.manual_seed(0)
    model = mlp().eval()
    x = torch.randn(4, 16)
    torch_tpu.export(model, (x,)).save(str(tmp_path / "mlp.tpuexport"))
    enc_model, enc = encoder
    enc.save(str(tmp_path / "enc.tpuexport"))
    assert sorted(os.listdir(tmp_path / "enc.tpuexport")) == sorted([MANIFEST, PROGRAM, WEIGHTS])
    weights, _ = _safetensors.load_file(tmp_path / "enc.tpuexport" / WEIGHTS)
    assert {"emb.weight", "head.bias", "scale"} <= set(weights)  # FQNs, buffers included
    ids, mask = _encoder_inputs(seed=2)
    for name, value in {"x": x, "ids": ids, "mask": mask}.items():
        np.save(tmp_path / f"{name}.npy", value.numpy())
    result = subprocess.run(
        [sys.executable, "-c", _FRESH_PROCESS, str(tmp_path)], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    torch.testing.assert_close(torch.from_numpy(np.load(tmp_path / "mlp_out.npy")), model(x), **TOL)
    expected = enc_model(ids, attention_mask=mask)
    torch.testing.assert_close(torch.from_numpy(np.load(tmp_path / "logits.npy")), expected["logits"], **TOL)
    torch.testing.assert_close(torch.from_numpy(np.load(tmp_path / "pooled.npy")), expected["pooled"], **TOL)


def test_manifest_and_artifact_hold_no_pickle(tmp_path, encoder):
    _, ep = encoder
    ep.save(str(tmp_path / "e"))
    manifest = json.loads((tmp_path / "e" / MANIFEST).read_text())
    assert [a["name"] for a in manifest["signature"]["args"]] == ["ids", "attention_mask"]
    assert [a["keyword"] for a in manifest["signature"]["args"]] == [False, True]
    assert (tmp_path / "e" / PROGRAM).read_bytes().startswith(b"ML\xefR")
    loaded = torch_tpu.load(str(tmp_path / "e"))
    assert loaded.describe() == ep.describe()
    with pytest.raises(TypeError, match="missing argument 'attention_mask'"):
        loaded(_encoder_inputs()[0])


def test_save_overwrites_an_export_and_refuses_a_file(tmp_path):
    path = _saved_mlp(tmp_path)
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(4, 3)).eval()
    x = torch.randn(2, 4)
    torch_tpu.export(model, (x,)).save(path)
    torch.testing.assert_close(torch_tpu.load(path)(x), model(x), **TOL)
    (tmp_path / "file").write_text("")
    with pytest.raises(SavedExportError, match="exists and is not a folder"):
        torch_tpu.export(model, (x,)).save(str(tmp_path / "file"))
    with pytest.raises(SavedExportError, match="not a saved torch_tpu export"):
        torch_tpu.load(str(tmp_path / "file"))


def _saved_mlp(tmp_path) -> str:
    torch.manual_seed(0)
    path = str(tmp_path / "m.tpuexport")
    torch_tpu.export(nn.Sequential(nn.Linear(4, 3)).eval(), (torch.randn(2, 4),)).save(path)
    return path


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda p: open(os.path.join(p, PROGRAM), "r+b").truncate(40), f"{PROGRAM}: not a valid StableHLO portable artifact"),
        (lambda p: open(os.path.join(p, PROGRAM), "wb").write(b"garbage"), "not MLIR bytecode"),
        (lambda p: open(os.path.join(p, WEIGHTS), "r+b").truncate(30), f"{WEIGHTS}: not a valid safetensors file"),
        (lambda p: os.remove(os.path.join(p, WEIGHTS)), f"{WEIGHTS}: cannot read the weights"),
        (lambda p: open(os.path.join(p, MANIFEST), "w").write("{"), f"{MANIFEST}: not valid UTF-8 JSON"),
        (lambda p: open(os.path.join(p, MANIFEST), "w").write('{"format": "other"}'), "not a torch_tpu export manifest"),
        (lambda p: _edit_manifest(p, lambda m: m["weights"].append("ghost")), "missing weight(s) ghost"),
        (lambda p: _edit_manifest(p, lambda m: m.pop("signature")), "malformed manifest (KeyError"),
        (lambda p: _edit_manifest(p, lambda m: m["interface"]["inputs"].pop()), "@main takes 3 arguments, the manifest describes 2"),
    ],
)
def test_corrupt_saved_export_is_a_clear_error(tmp_path, damage, message):
    path = _saved_mlp(tmp_path)
    damage(path)
    with pytest.raises(SavedExportError) as err:
        torch_tpu.load(path)
    assert message in str(err.value)
    assert str(tmp_path) in str(err.value)


def test_damaged_program_bytes_never_crash_and_print_nothing(tmp_path, capfd):
    import random
    import shutil

    source = _saved_mlp(tmp_path)
    data = open(os.path.join(source, PROGRAM), "rb").read()
    rng = random.Random(0)
    rejected = 0
    for trial in range(40):
        path = str(tmp_path / f"t{trial}")
        shutil.copytree(source, path)
        damaged = bytearray(data)
        for _ in range(rng.choice([1, 3])):
            damaged[rng.randrange(len(damaged))] = rng.randrange(256)
        with open(os.path.join(path, PROGRAM), "wb") as f:
            f.write(bytes(damaged))
        try:
            torch_tpu.load(path)  # a flip that leaves a valid artifact may load
        except SavedExportError as err:
            assert f"{PROGRAM}: not a valid StableHLO portable artifact" in str(err)
            rejected += 1
    assert rejected >= 30
    # MLIR's messages are in the errors, not on stderr.
    assert "error" not in capfd.readouterr().err


def _edit_manifest(path: str, edit) -> None:
    manifest_path = os.path.join(path, MANIFEST)
    with open(manifest_path) as f:
        manifest = json.load(f)
    edit(manifest)
    with open(manifest_path, "w") as f:
        json.dump(manifest, f)


# -- torchtpu-run -------------------------------------------------------------------------


def test_torchtpu_run_runs_a_saved_export_with_user_inputs_only(tmp_path, encoder):
    model, ep = encoder
    ep.save(str(tmp_path / "enc.tpuexport"))
    ids, mask = _encoder_inputs(seed=3)
    np.save(tmp_path / "ids.npy", ids.numpy())
    np.save(tmp_path / "mask.npy", mask.numpy())
    run = [sys.executable, "-m", "torch_tpu.tools.run", str(tmp_path / "enc.tpuexport")]
    result = subprocess.run(
        [*run, "--input", str(tmp_path / "ids.npy"), "--input", str(tmp_path / "mask.npy"), "-o", str(tmp_path / "out.npz")],
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr
    expected = model(ids, attention_mask=mask)
    with np.load(tmp_path / "out.npz") as out:
        # Leaves in the output's tree order (dict keys as the module returned them).
        torch.testing.assert_close(torch.from_numpy(out["result0"]), expected["logits"], **TOL)
        torch.testing.assert_close(torch.from_numpy(out["result1"]), expected["pooled"], **TOL)
    missing = subprocess.run([*run, "--input", str(tmp_path / "ids.npy")], capture_output=True, text=True, timeout=300)
    assert missing.returncode == 1
    assert "takes 2 input tensor(s) (ids: int64[2, 6], *, attention_mask: float32[2, 6]), got 1" in missing.stderr


# -- dynamic_shapes -----------------------------------------------------------------------


def test_dynamic_shapes_serve_every_size_within_the_bound(tmp_path):
    torch.manual_seed(0)
    model = TinyEncoder().eval()
    ids, mask = _encoder_inputs(seq=8)
    seq = Dim("seq", min=2, max=32)
    ep = torch_tpu.export(
        model, (ids,), {"attention_mask": mask},
        dynamic_shapes={"ids": {1: seq}, "attention_mask": {1: seq}},
    )
    assert ep.describe() == "(ids: int64[2, 2..32], *, attention_mask: float32[2, 2..32])"
    # One program at the bound: padded buffers plus a size per dynamic dim.
    assert "tensor<2x32xi64>" in ep.text
    ep.save(str(tmp_path / "dyn"))
    loaded = torch_tpu.load(str(tmp_path / "dyn"))
    for length in (3, 11, 32):
        ids, mask = _encoder_inputs(seq=length, seed=length)
        expected = model(ids, attention_mask=mask)
        torch.testing.assert_close(ep(ids, attention_mask=mask), expected, **TOL)
        torch.testing.assert_close(loaded(ids, attention_mask=mask), expected, **TOL)
    ids, mask = _encoder_inputs(seq=40)
    with pytest.raises(ValueError, match=r"argument 'ids' must have shape int64\[2, 2..32\], got \[2, 40\] "
                       r"\(dim 1 is dynamic, exported for sizes 2..32: pass a size of at most 32, or export "
                       r"again with a larger max"):
        loaded(ids, attention_mask=mask)
    # Below the min the advice is a larger size or a smaller min, never a larger max (#30 item 10).
    ids, mask = _encoder_inputs(seq=1)
    with pytest.raises(ValueError) as err:
        loaded(ids, attention_mask=mask)
    assert "got [2, 1] (dim 1 is dynamic, exported for sizes 2..32: pass a size of at least 2, or export " \
           "again with a smaller min in dynamic_shapes)" in str(err.value)
    assert "larger max" not in str(err.value)


# -- constraints between dynamic dims (#30 item 3) ------------------------------------------


class _Pair(nn.Module):
    def forward(self, x, y):
        return x.sum(-1, keepdim=True) * 2 + y.sum(-1, keepdim=True)


class _Doubled(nn.Module):
    def forward(self, x, y):
        return torch.cat([x, x], 0) * y


class _Square(nn.Module):
    def forward(self, x):
        return x @ x + 1


_SEQ = Dim("seq", min=2, max=32)

# (module, example inputs, dynamic_shapes, a call that breaks a constraint, the error it
# must raise, good calls that must equal eager).
_CONSTRAINTS = {
    "shared Dim, two inputs": (
        TinyEncoder, _encoder_inputs(seq=8), {"ids": {1: _SEQ}, "attention_mask": {1: _SEQ}},
        (_encoder_inputs(seq=10)[0], _encoder_inputs(seq=11)[1]),
        "argument 'attention_mask' dim 1 has size 11, but it was exported as seq (seq = 10 from argument 'ids' "
        "dim 1): a shared or derived Dim in dynamic_shapes, which torch.export compiled the program for; pass "
        "sizes that agree",
        [_encoder_inputs(seq=n, seed=n) for n in (2, 13, 32)],
    ),
    "derived 2*Dim": (
        _Doubled, (torch.randn(5, 3), torch.randn(10, 3)), {"x": {0: _SEQ}, "y": {0: 2 * _SEQ}},
        (torch.randn(5, 3), torch.randn(12, 3)),
        "argument 'y' dim 0 has size 12, but it was exported as 2*seq = 10 (seq = 5 from argument 'x' dim 0)",
        [(torch.randn(n, 3), torch.randn(2 * n, 3)) for n in (2, 7, 32)],
    ),
    "derived Dim + 1": (
        _Pair, (torch.randn(4, 6), torch.randn(4, 7)), {"x": {1: _SEQ}, "y": {1: _SEQ + 1}},
        (torch.randn(4, 6), torch.randn(4, 6)),
        "argument 'y' dim 1 has size 6, but it was exported as seq + 1 = 7 (seq = 6 from argument 'x' dim 1)",
        [(torch.randn(4, n), torch.randn(4, n + 1)) for n in (2, 9, 32)],
    ),
    "one Dim for two dims of one input": (
        _Square, (torch.randn(5, 5),), {"x": {0: _SEQ, 1: _SEQ}},
        (torch.randn(5, 6),),
        "argument 'x' dim 1 has size 6, but it was exported as seq (seq = 5 from argument 'x' dim 0)",
        [(torch.randn(n, n),) for n in (2, 17, 32)],
    ),
    "derived Dim alone: an odd size": (
        _Pair, (torch.randn(4, 10), torch.randn(4, 3)), {"x": {1: 2 * _SEQ}, "y": None},
        (torch.randn(4, 11), torch.randn(4, 3)),
        "argument 'x' dim 1 has size 11, but it was exported as 2*seq, which no integer seq gives; pass a "
        "size of the form 2*seq",
        [(torch.randn(4, n), torch.randn(4, 3)) for n in (4, 14, 64)],
    ),
}


def _call(ep, module, inputs):
    if isinstance(module, TinyEncoder):
        return ep(inputs[0], attention_mask=inputs[1])
    return ep(*inputs)


@pytest.mark.parametrize("case", list(_CONSTRAINTS))
def test_dynamic_dim_constraints_are_checked_at_every_call(tmp_path, case):
    make, example, dynamic_shapes, bad, message, good = _CONSTRAINTS[case]
    torch.manual_seed(0)
    module = make().eval()
    args, kwargs = (example[:1], {"attention_mask": example[1]}) if make is TinyEncoder else (example, {})
    ep = torch_tpu.export(module, args, kwargs, dynamic_shapes=dynamic_shapes)
    ep.save(str(tmp_path / "saved"))
    loaded = torch_tpu.load(str(tmp_path / "saved"))
    for program in (ep, loaded):
        with pytest.raises(ValueError) as err:
            _call(program, module, bad)
        assert message in str(err.value)
        for inputs in good:
            torch.testing.assert_close(_call(program, module, inputs), _call(module, module, inputs), **TOL)
    if case == "derived Dim alone: an odd size":
        # torch.export's own module lets an odd size through (it binds no root symbol from
        # a derived dim); the padded program was compiled for 2*seq, so ours refuses it.
        return
    # torch.export's own program refuses the same call (its unflattened module checks some
    # constraints as input checks, some as guards).
    reference = torch.export.export(module, args, kwargs, dynamic_shapes=dynamic_shapes).module()
    with pytest.raises((RuntimeError, AssertionError), match="Expected input at|Guard failed"):
        _call(reference, module, bad)


def test_torchtpu_run_checks_shared_dims_of_a_saved_export(tmp_path):
    torch.manual_seed(0)
    model = TinyEncoder().eval()
    ids, mask = _encoder_inputs(seq=8)
    torch_tpu.export(
        model, (ids,), {"attention_mask": mask}, dynamic_shapes={"ids": {1: _SEQ}, "attention_mask": {1: _SEQ}}
    ).save(str(tmp_path / "enc"))
    np.save(tmp_path / "ids.npy", _encoder_inputs(seq=10)[0].numpy())
    np.save(tmp_path / "mask.npy", _encoder_inputs(seq=11)[1].numpy())
    result = subprocess.run(
        [sys.executable, "-m", "torch_tpu.tools.run", str(tmp_path / "enc"),
         "--input", str(tmp_path / "ids.npy"), "--input", str(tmp_path / "mask.npy")],
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 1
    assert "argument 'attention_mask' dim 1 has size 11, but it was exported as seq (seq = 10 from argument " \
           "'ids' dim 1)" in result.stderr


def test_constraints_survive_the_manifest_and_old_manifests_still_load(tmp_path):
    ep = torch_tpu.export(_Doubled(), (torch.randn(5, 3), torch.randn(10, 3)),
                          dynamic_shapes={"x": {0: _SEQ}, "y": {0: 2 * _SEQ}})
    ep.save(str(tmp_path / "new"))
    with open(tmp_path / "new" / MANIFEST) as f:
        signature = json.load(f)["signature"]
    (sym,) = signature["symbols"]
    assert signature["symbols"][sym] == {"label": "seq", "min": 2, "max": 32}
    assert signature["args"][1]["leaves"][0]["sizes"] == {"0": {"terms": {sym: 2}, "const": 0}}
    # A manifest written before constraints were recorded: ranges are still checked.
    ep.save(str(tmp_path / "old"))

    def strip(m):
        m["signature"].pop("symbols")
        for arg in m["signature"]["args"]:
            for leaf in arg["leaves"]:
                leaf.pop("sizes", None)

    _edit_manifest(str(tmp_path / "old"), strip)
    old = torch_tpu.load(str(tmp_path / "old"))
    x, y = torch.randn(6, 3), torch.randn(12, 3)
    torch.testing.assert_close(old(x, y), _Doubled()(x, y))
    with pytest.raises(ValueError, match="must have shape float32"):
        old(torch.randn(40, 3), y)
    # A size expression naming no recorded symbol is a malformed manifest, not a crash.
    ep.save(str(tmp_path / "bad"))
    _edit_manifest(str(tmp_path / "bad"), lambda m: m["signature"].pop("symbols"))
    with pytest.raises(SavedExportError, match="malformed manifest .*unknown symbols"):
        torch_tpu.load(str(tmp_path / "bad"))
