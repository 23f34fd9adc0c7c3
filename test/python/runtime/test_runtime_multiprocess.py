"""Processes racing on the shared tiers: 8 processes compile and store the same and
different keys in L2 and L3 at once; every process gets correct results, only valid
entries remain, and the key they all share is compiled once on the host (L2 lock)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from rt_helpers import REPO
from torch_tpu.runtime import cache_entry

WORKER = textwrap.dedent(
    """
    import sys
    import numpy as np
    sys.path.insert(0, sys.argv[2])
    from rt_helpers import scale_module
    from torch_tpu.runtime import get_client

    rank = int(sys.argv[1])
    client = get_client("cpu")
    x = np.arange(4, dtype=np.float32)
    origins = {}
    for label, factor in (("shared", 2.0), ("own", 10.0 + rank), ("pair", 100.0 + rank % 2)):
        exe = client.compile(scale_module(factor), name=label)
        got = exe.execute([x])[0].to_numpy()
        assert np.array_equal(got, x * np.float32(factor)), (label, got)
        origins[label] = exe.origin
    print("OK", " ".join(f"{k}={v}" for k, v in sorted(origins.items())))
    """
)


def test_eight_processes_race_on_l2_and_l3(tmp_path):
    l2, l3 = tmp_path / "l2", tmp_path / "l3"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCH_TPU_")}
    env.update(
        TORCH_TPU_CACHE_L2="1",
        TORCH_TPU_CACHE_DIR=str(l2),
        TORCH_TPU_CACHE_URL="file://" + str(l3),
        TORCH_TPU_PLATFORM="cpu",
    )
    helpers = os.path.dirname(os.path.abspath(__file__))
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, str(rank), helpers],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO,
        )
        for rank in range(8)
    ]
    outputs = [p.communicate(timeout=240) for p in procs]
    for rank, (p, (out, err)) in enumerate(zip(procs, outputs)):
        assert p.returncode == 0 and out.startswith("OK"), f"rank {rank}: rc={p.returncode}\n{out}\n{err}"
    # 1 shared + 8 own + 2 pair keys, each exactly once per tier, every entry valid
    for tier in (l2, l3):
        names = sorted(n for n in os.listdir(tier) if n.endswith(cache_entry.SUFFIX))
        assert len(names) == 11, (tier, names)
        assert not [n for n in os.listdir(tier) if n.endswith(".tmp")]
        for name in names:
            with open(tier / name, "rb") as f:
                _, meta, _ = cache_entry.decode(f.read(), cache_entry.key_from_name(name), "cpu")
            assert meta["platform"] == "cpu"
    shared_compiles = sum("shared=compile" in out for out, _ in outputs)
    assert shared_compiles == 1, [out for out, _ in outputs]
