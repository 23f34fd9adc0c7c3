"""Modules from `jax.numpy.linalg` call jaxlib's CPU LAPACK handlers (`lapack_*_ffi`).
The runtime registers them itself, without importing jax, when a module needs them —
also when the executable comes from the L2 cache in a fresh process. An unknown
custom-call target is a one-line error naming it."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from rt_helpers import run_python

pytest.importorskip("jax")

_MAKE = textwrap.dedent(
    """
    import json, jax, jax.numpy as jnp
    a = jnp.ones((4, 4)) + 3 * jnp.eye(4)
    b = jnp.arange(8.0).reshape(4, 2)
    out = {
        "solve": jax.jit(jnp.linalg.solve).lower(a, b).as_text(),
        "eigh": jax.jit(lambda m: jnp.linalg.eigh(m)[0]).lower(a).as_text(),
        "cholesky": jax.jit(jnp.linalg.cholesky).lower(a).as_text(),
        "qr": jax.jit(lambda m: jnp.abs(jnp.linalg.qr(m)[1])).lower(a).as_text(),
        "det": jax.jit(jnp.linalg.det).lower(a).as_text(),
        "svd": jax.jit(lambda m: jnp.linalg.svd(m, compute_uv=False)).lower(a).as_text(),
    }
    print(json.dumps(out))
    """
)

_RUN = """
    import json, sys
    import numpy as np
    from torch_tpu.runtime import CacheConfig, Client
    modules = json.loads(open(sys.argv[1]).read())
    client = Client.create("cpu", num_cpu_devices=1, cache_config=CacheConfig(l2_dir=sys.argv[2]))
    a = np.ones((4, 4), np.float32) + 3 * np.eye(4, dtype=np.float32)
    b = np.arange(8, dtype=np.float32).reshape(4, 2)
    results = {}
    for name, text in modules.items():
        exe = client.compile(text, name=name)
        args = [a, b] if name == "solve" else [a]
        results[name] = np.asarray(exe(*[client.to_device(x) for x in args])[0].numpy()).tolist()
    stats = client.cache.stats
    print(json.dumps({"results": results, "compiles": stats.compiles, "jax": "jax" in sys.modules}))
"""


@pytest.fixture(scope="module")
def modules_file(tmp_path_factory):
    done = subprocess.run([sys.executable, "-c", _MAKE], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    path = tmp_path_factory.mktemp("lapack") / "modules.json"
    path.write_text(done.stdout)
    assert "lapack_" in done.stdout
    return path


def _run(modules_file, l2) -> dict:
    code = "import sys; sys.argv = ['x', %r, %r]\n" % (str(modules_file), str(l2)) + textwrap.dedent(_RUN)
    done = run_python(code)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_lapack_modules_run_and_load_from_l2_without_jax(modules_file, tmp_path):
    a = np.ones((4, 4)) + 3 * np.eye(4)
    b = np.arange(8.0).reshape(4, 2)
    want = {
        "solve": np.linalg.solve(a, b),
        "eigh": np.linalg.eigvalsh(a),
        "cholesky": np.linalg.cholesky(a),
        "qr": np.abs(np.linalg.qr(a)[1]),
        "det": np.linalg.det(a),
        "svd": np.linalg.svd(a, compute_uv=False),
    }
    first = _run(modules_file, tmp_path)
    second = _run(modules_file, tmp_path)  # a fresh process: every executable from L2
    assert first["compiles"] == len(want) and second["compiles"] == 0
    assert not first["jax"] and not second["jax"]
    for run in (first, second):
        for name, value in want.items():
            np.testing.assert_allclose(np.array(run["results"][name]), value, rtol=1e-4, atol=1e-4, err_msg=name)


def test_unknown_custom_call_target_is_named(tmp_path, capsys):
    from torch_tpu.tools import run as run_tool

    path = tmp_path / "kernel.mlir"
    path.write_text(
        "func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {\n"
        "  %0 = stablehlo.custom_call @my_missing_kernel(%x) {api_version = 4 : i32} : (tensor<4xf32>) -> tensor<4xf32>\n"
        "  return %0 : tensor<4xf32>\n}\n"
    )
    assert run_tool.main([str(path), "--input-literal", "4xf32=1,2,3,4"]) != 0
    err = capsys.readouterr().err
    assert "custom-call target 'my_missing_kernel'" in err and "no handler registered" in err
