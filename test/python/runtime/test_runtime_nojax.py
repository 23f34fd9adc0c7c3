"""The runtime never imports jax, and never breaks jax for a process that imports it later.

jaxlib's C++ imports `jax.core` the first time it builds an array's abstract value by
itself (MakeShapedArrayCached, reached from DLPack import, disassembly ...). The
runtime's single-device paths give jaxlib explicit avals instead; these tests run them
in fresh interpreters (jax is installed here) and check sys.modules."""

from __future__ import annotations

from rt_helpers import run_python

WORKFLOW = """
    import sys, os, tempfile
    import numpy as np
    import torch
    import torch_tpu.runtime as rt
    from rt_helpers import add_module, scale_module

    tmp = tempfile.mkdtemp()
    cfg = rt.CacheConfig(l2_dir=os.path.join(tmp, "l2"), l3_url=os.path.join(tmp, "l3"))
    client = rt.Client.create("cpu", cache_config=cfg)
    assert rt.get_client("cpu").platform == "cpu"

    # buffers, every path: torch (aligned, unaligned, bf16), numpy, to_torch, to_numpy
    b = client.to_device(torch.ones(2, 3, dtype=torch.bfloat16))
    assert b.to_numpy().dtype.name == "bfloat16" and b.to_torch().dtype is torch.bfloat16
    u = client.to_device(torch.arange(17, dtype=torch.float32)[1:])
    assert u.to_torch()[0].item() == 1.0
    client.to_device(np.zeros((0, 3), np.float32)).synchronize()

    # compile (cold), run torch->torch and device->device, donation, synchronize
    exe = client.compile(add_module("2x3", "bf16"), name="add")
    (out,) = exe(torch.ones(2, 3, dtype=torch.bfloat16), b)
    assert out.float().sum().item() == 12.0
    outs = exe.execute([b, b])
    client.synchronize()
    assert outs[0].is_ready()
    don = client.compile(add_module("4"), options=rt.CompileSpec(donate_argnums=(0,)), name="don")
    acc = client.to_device(torch.zeros(4), copy=True)
    (acc2,) = don.execute([acc, torch.ones(4)])
    assert acc.is_deleted and acc2.to_numpy().tolist() == [1, 1, 1, 1]
    shared = acc2.to_torch()  # exported, then donated: a copy is donated
    (acc3,) = don.execute([acc2, torch.ones(4)])
    assert acc3.to_numpy().tolist() == [2, 2, 2, 2] and shared.tolist() == [1, 1, 1, 1]

    # errors
    try:
        client.compile("module { func.func @main( }", name="bad.mlir")
    except rt.CompileError:
        pass
    try:
        exe(torch.ones(3))
    except rt.ArgumentError:
        pass

    # L2 hit and L3 hit in fresh clients
    again = rt.Client.create("cpu", cache_config=cfg).compile(add_module("2x3", "bf16"), name="add")
    assert again.origin == "l2", again.origin
    cfg3 = rt.CacheConfig(l3_url=os.path.join(tmp, "l3"))
    client3 = rt.Client.create("cpu", cache_config=cfg3)
    third = client3.compile(add_module("2x3", "bf16"), name="add")
    assert third.origin == "l3", third.origin
    b3 = client3.to_device(torch.ones(2, 3, dtype=torch.bfloat16))
    assert third(b3, b3)[0].float().sum().item() == 12.0
    try:
        third(b, b3)
    except rt.ArgumentError as err:
        assert "another Client" in str(err), err
    print("jax" in sys.modules, "jax.core" in sys.modules)
"""


def test_single_device_runtime_never_imports_jax():
    result = run_python(WORKFLOW.replace("from rt_helpers", f"sys.path.insert(0, {_here()!r})\n    from rt_helpers"))
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["False", "False"], result.stdout + result.stderr


def test_jax_imported_afterwards_still_works():
    """We never poison jaxlib's one-time `jax.core` lookup: jax arrays made by jaxlib
    itself (DLPack import, per-shard arrays) still get real avals."""
    code = """
        import numpy as np, torch
        import torch_tpu.runtime as rt
        client = rt.Client.create("cpu", num_cpu_devices=2)
        b = client.to_device(torch.ones(3))
        exe = client.compile('''module @m { func.func public @main(%a: tensor<3xf32>) -> tensor<3xf32> {
            %0 = stablehlo.add %a, %a : tensor<3xf32>
            return %0 : tensor<3xf32> } }''')
        assert exe.execute([b])[0].to_torch().tolist() == [2, 2, 2]
        import jax, jax.numpy as jnp
        x = jax.dlpack.from_dlpack(torch.arange(4.0))
        assert (x + 1).tolist() == [1, 2, 3, 4]
        y = jax.device_put(np.arange(4.0, dtype=np.float32))
        assert float(y.addressable_shards[0].data.sum() + 1) == 7.0
        print("ok")
    """
    result = run_python(code)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stdout + result.stderr


def _here() -> str:
    import os

    return os.path.dirname(os.path.abspath(__file__))
