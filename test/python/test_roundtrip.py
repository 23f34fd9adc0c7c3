"""StableHLO modules written by jax round-trip through torchtpu-opt unchanged in
meaning: as text, as bytecode, in generic form and after `--torchtpu-verify
--canonicalize`, the round-tripped module compiles with jaxlib's XLA:CPU client and
computes the same outputs as the original on the same inputs.
"""

from __future__ import annotations

import io
from collections.abc import Callable

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")
from jax import lax
from jaxlib import _jax, xla_client
from torch_tpu.tools.opt import run as opt_run

RNG = np.random.default_rng(0)


def _f32(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def _conv(x, w):
    return lax.conv_general_dilated(
        x, w, window_strides=(1, 1), padding="SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")
    )


def _while(x):
    def body(state):
        i, acc = state
        return i + 1, acc * 0.5 + jnp.tanh(acc)

    return lax.while_loop(lambda s: s[0] < 5, body, (0, x))[1]


def _cond(x, y):
    return lax.cond(jnp.sum(x) > 0, lambda a, b: a @ b, lambda a, b: a - b.T, x, y.T)


def _switch(x, k):
    return lax.switch(k, [jnp.sin, jnp.cos, lambda v: v * 2.0], x)


def _scatter_gather(x, idx, upd):
    gathered = jnp.take(x, idx, axis=0)
    return x.at[idx].add(upd), gathered * 2.0


# name -> (function, inputs)
PROGRAMS: dict[str, tuple[Callable, tuple[np.ndarray, ...]]] = {
    "elementwise": (lambda x, y: jnp.where(x > 0, jnp.sin(x) * y, -x) ** 2 + 1, (_f32(4, 5), _f32(4, 5))),
    "integer_ops": (lambda a, b: (a * b - (a >> 1)) % 7, (np.arange(12, dtype=np.int32), np.arange(12, 24, dtype=np.int32))),
    "dot": (lambda x, w: x @ w, (_f32(3, 8), _f32(8, 4))),
    "batched_dot": (lambda a, b: jnp.einsum("bij,bjk->bik", a, b), (_f32(2, 3, 4), _f32(2, 4, 5))),
    "reduce": (lambda x: (jnp.sum(x, axis=1), jnp.max(x), jnp.argmax(x, axis=0)), (_f32(6, 7),)),
    "conv": (_conv, (_f32(1, 8, 8, 3), _f32(3, 3, 3, 4))),
    "while": (_while, (_f32(4),)),
    "cond": (_cond, (_f32(3, 3), _f32(3, 3))),
    "switch": (_switch, (_f32(5), np.int32(2))),
    "scatter_gather": (_scatter_gather, (_f32(6, 3), np.array([4, 0, 4], np.int32), _f32(3, 3))),
    "sort_cumsum": (lambda x: (jnp.sort(x), jnp.cumsum(x)), (_f32(9),)),
}

# name -> torchtpu-opt arguments; the output is compiled as it comes.
VARIANTS: dict[str, list[str]] = {
    "text": [],
    "generic": ["--mlir-print-op-generic", "--mlir-print-debuginfo"],
    "verify_canonicalize": ["--torchtpu-verify", "--canonicalize"],
    "bytecode": ["--emit-bytecode"],
}


def _opt(argv: list[str], data: bytes) -> bytes:
    stdout, stderr = io.BytesIO(), io.StringIO()
    rc = opt_run(argv + ["-"], stdin=io.BytesIO(data), stdout=stdout, stderr=stderr)
    assert rc == 0, f"torchtpu-opt {' '.join(argv)} failed:\n{stderr.getvalue()}"
    assert stderr.getvalue() == ""
    return stdout.getvalue()


@pytest.fixture(scope="module")
def cpu():
    client = xla_client.make_cpu_client()
    return client, client.devices()[0]


def _execute(cpu, module: str | bytes, inputs: tuple[np.ndarray, ...]) -> list[np.ndarray]:
    client, dev = cpu
    exe = client.compile_and_load(module, xla_client.DeviceList((dev,)), xla_client.CompileOptions())
    buffers = [
        _jax.dlpack_managed_tensor_to_buffer(np.ascontiguousarray(a).__dlpack__(), dev, None, True)
        for a in inputs
    ]
    results = exe.execute_sharded(buffers).disassemble_into_single_device_arrays()
    return [np.asarray(per_device[0]) for per_device in results]


@pytest.fixture(scope="module", params=sorted(PROGRAMS))
def program(request):
    """(name, jax's StableHLO text with locations, inputs, reference outputs)."""
    fn, inputs = PROGRAMS[request.param]
    text = jax.jit(fn).lower(*inputs).as_text(debug_info=True)
    return request.param, text, inputs


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_roundtrip_preserves_results(cpu, program, variant: str) -> None:
    name, text, inputs = program
    expected = _execute(cpu, text, inputs)
    out = _opt(VARIANTS[variant], text.encode())
    if variant == "bytecode":
        assert out.startswith(b"ML\xefR")
        # Compiled straight from bytecode, and read back to text by torchtpu-opt.
        candidates = [out, _opt([], out).decode()]
    else:
        candidates = [out.decode()]
    for module in candidates:
        got = _execute(cpu, module, inputs)
        assert len(got) == len(expected)
        for g, e in zip(got, expected):
            assert g.dtype == e.dtype and g.shape == e.shape, name
            np.testing.assert_allclose(g, e, rtol=1e-6, atol=1e-6, err_msg=f"{name} via {variant}")


def test_text_roundtrip_is_a_fixed_point(program) -> None:
    """Printing what torchtpu-opt printed changes nothing (text and through bytecode)."""
    name, text, _ = program
    once = _opt([], text.encode())
    assert _opt([], once) == once, name
    assert _opt([], _opt(["--emit-bytecode"], once)) == once, name


def test_roundtrip_keeps_the_computation(program) -> None:
    """The printed module still holds the ops that carry the meaning (not an empty
    or rewritten module that happens to compile)."""
    name, text, _ = program
    out = _opt(["--torchtpu-verify", "--canonicalize"], text.encode()).decode()
    key_ops = {
        "dot": "stablehlo.dot_general",
        "batched_dot": "stablehlo.dot_general",
        "reduce": "stablehlo.reduce",
        "conv": "stablehlo.convolution",
        "while": "stablehlo.while",
        "cond": "stablehlo.case",
        "switch": "stablehlo.case",
        "scatter_gather": "stablehlo.scatter",
        "sort_cumsum": "stablehlo.sort",
    }
    if name in key_ops:
        assert key_ops[name] in out, out
    assert "func.func public @main" in out
