"""What needs processes of its own: the compile cache across processes, and torchtpu-run
on a saved export. Named to run first: the chip admits one process at a time, and once the
test process has opened it (the other modules do) no child could.

Each child is a fresh interpreter on the installed torch_tpu, as a user's would be."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np

# torchtpu-run is told the platform, as a user on a TPU VM would (the suite's development
# mode on XLA:CPU lets it discover the platform instead).
_ON_CPU = os.environ.get("TORCH_TPU_TEST_TPU_ON_CPU") == "1"
_PLATFORM = [] if _ON_CPU else ["--platform", "tpu"]
_EXPECTED_PLATFORM = "cpu" if _ON_CPU else "tpu"  # a child that found the chip busy would run on XLA:CPU
_CHILD_ENV = {k: v for k, v in os.environ.items() if not k.startswith("TORCH_TPU_CACHE")}

_COMPILE_AND_REPORT = textwrap.dedent("""
    import json, sys, torch, torch_tpu
    from torch_tpu.runtime import get_client
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 8))
    x = torch.randn(16, 64)
    out = torch.compile(model, backend="tpu")(x)
    t = torch.ones(32, device="tpu") * 3          # an eager op's program goes through the cache too
    stats = get_client().cache.stats
    print(json.dumps({"platform": get_client().platform, "compiles": stats.compiles, "l2_hits": stats.l2_hits,
                      "max_err": (out - model(x)).abs().max().item(), "eager": t.cpu().sum().item()}))
""")


def _child(code: str, env: dict, cwd) -> dict:
    proc = subprocess.run([sys.executable, "-c", code], env=env, cwd=cwd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"child failed:\n{proc.stderr[-3000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_compile_cache_across_processes(tmp_path):
    # One process fills L2 (a directory) and L3 (an fsspec URL; a local file:// one here);
    # a second process with the same L2 compiles nothing, nor does a third that has only
    # the L3 URL (a fresh machine). Three processes: each opens the chip (~10 s), so the
    # tiers share them.
    url = f"file://{tmp_path / 'l3'}"
    code = _COMPILE_AND_REPORT.replace('"l2_hits": stats.l2_hits', '"l2_hits": stats.l2_hits, "l3_hits": stats.l3_hits')
    l2 = dict(_CHILD_ENV, TORCH_TPU_CACHE_L2="1", TORCH_TPU_CACHE_DIR=str(tmp_path / "l2"), TORCH_TPU_CACHE_URL=url)
    first = _child(code, l2, tmp_path)
    second = _child(code, l2, tmp_path)
    fresh = _child(code, dict(l2, TORCH_TPU_CACHE_DIR=str(tmp_path / "other-l2")), tmp_path)
    assert first["platform"] == second["platform"] == fresh["platform"] == _EXPECTED_PLATFORM, (first, fresh)
    assert first["compiles"] >= 2, first  # the graph and the eager op
    assert second["compiles"] == 0, f"the second process compiled {second['compiles']} program(s): {second}"
    assert second["l2_hits"] >= first["compiles"], second
    assert fresh["compiles"] == 0 and fresh["l3_hits"] >= first["compiles"], fresh
    for report in (first, second, fresh):
        assert report["max_err"] < 1e-4 and report["eager"] == 96.0, report
    assert os.listdir(tmp_path / "l2"), "the L2 directory holds no entry"


_EXPORT = textwrap.dedent("""
    import sys, torch, numpy as np, torch_tpu
    torch.manual_seed(0)
    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(100, 32)
            self.lin = torch.nn.Linear(32, 4)
        def forward(self, ids, scale):
            return self.lin(torch.tanh(self.emb(ids))) * scale
    net = Net().eval()
    ids = torch.randint(0, 100, (2, 7)); scale = torch.tensor([0.5, 2.0, 1.0, 3.0])
    ep = torch_tpu.export(net, (ids, scale))
    ep.save(sys.argv[1] + "/net.tpuexport")
    loaded = torch_tpu.load(sys.argv[1] + "/net.tpuexport")
    got = loaded(ids, scale)
    got = got[0] if isinstance(got, (list, tuple)) else got
    want = net(ids, scale)
    assert (got - want).abs().max().item() < 1e-4, (got - want).abs().max()
    np.save(sys.argv[1] + "/ids.npy", ids.numpy()); np.save(sys.argv[1] + "/scale.npy", scale.numpy())
    np.save(sys.argv[1] + "/want.npy", want.detach().numpy())
    print("saved")
""")


def test_export_save_load_and_torchtpu_run_on_the_chip(tmp_path):
    made = subprocess.run([sys.executable, "-c", _EXPORT, str(tmp_path)], env=_CHILD_ENV, cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert made.returncode == 0, made.stderr[-3000:]
    run = subprocess.run(
        [sys.executable, "-m", "torch_tpu.tools.run", str(tmp_path / "net.tpuexport"), *_PLATFORM,
         "--input", str(tmp_path / "ids.npy"), "--input", str(tmp_path / "scale.npy"),
         "-o", str(tmp_path / "out.npz"), "-v"],
        env=_CHILD_ENV, cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    with np.load(tmp_path / "out.npz") as out:
        np.testing.assert_allclose(out["result0"], np.load(tmp_path / "want.npy"), atol=1e-4, rtol=1e-4)
