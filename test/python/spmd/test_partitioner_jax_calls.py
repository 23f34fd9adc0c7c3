"""Modules JAX makes hold private functions and `func.call` (nested `jax.jit`,
`custom_jvp` such as `jax.nn.relu`, `jax.named_call`). `ShardedProgram` runs
`torchtpu-inline` before the partitioner, so such programs partition; each is run on N
replicas and compared with the single-device result JAX computes. The modules are made
in a subprocess (JAX needs its virtual device count set before it starts)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
from torch_tpu.spmd import ShardedProgram

pytest.importorskip("jax")

_MAKE_MODULES = textwrap.dedent(
    """
    import json, os
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    @jax.jit
    def layer(x, w):
        return jax.nn.relu(x @ w)          # nested jit + custom_jvp: two private calls

    @jax.named_call
    def project(h, w):
        return jnp.tanh(h @ w)

    def mlp(x, w1, w2):
        return project(layer(x, w1), w2)

    rng = np.random.default_rng(0)
    args = [rng.standard_normal(s).astype(np.float32) for s in [(8, 16), (16, 32), (32, 16)]]
    out = {}
    for name, axes, specs in [
        ("tp_1d", {"x": 4}, [P(), P(None, "x"), P("x", None)]),
        ("dp_tp_2d", {"data": 2, "model": 2}, [P("data", None), P(None, "model"), P("model", None)]),
    ]:
        mesh = Mesh(np.array(jax.devices()[: int(np.prod(list(axes.values())))]).reshape(tuple(axes.values())),
                    tuple(axes))
        shardings = tuple(NamedSharding(mesh, s) for s in specs)
        result = NamedSharding(mesh, specs[0])
        f = jax.jit(mlp, in_shardings=shardings, out_shardings=result)
        out[name] = {"text": f.lower(*args).as_text(), "want": np.asarray(mlp(*args)).tolist()}
    out["args"] = [a.tolist() for a in args]
    print(json.dumps(out))
    """
)


@pytest.fixture(scope="module")
def jax_modules():
    done = subprocess.run([sys.executable, "-c", _MAKE_MODULES], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.parametrize("name", ["tp_1d", "dp_tp_2d"])
def test_jax_module_with_calls_partitions_and_matches(cpu8, jax_modules, name):
    case = jax_modules[name]
    assert "call @" in case["text"]  # the input really holds calls
    program = ShardedProgram(case["text"], client=cpu8, thin=False, name=name)
    assert "call @" not in program.partitioned_text
    assert "all_reduce" in program.partitioned_text  # the row-parallel matmul's partial sums
    args = [torch.tensor(np.array(a, dtype=np.float32)) for a in jax_modules["args"]]
    (got,) = program(*args)
    torch.testing.assert_close(got, torch.tensor(np.array(case["want"], dtype=np.float32)), rtol=1e-4, atol=1e-4)
