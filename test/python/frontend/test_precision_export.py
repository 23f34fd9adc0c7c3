"""Precision follows PyTorch's API; export produces loadable StableHLO."""

import logging
import re

import pytest
import torch

import torch_tpu
from torch_tpu.program.pipelines import compile_pipeline as pipeline_for
from torch_tpu.program.precision import current_mode


def test_precision_context_is_scoped_and_thread_local():
    base = torch.get_float32_matmul_precision()
    with torch_tpu.precision("medium"):
        assert current_mode() == "medium"
        with torch_tpu.precision("highest"):
            assert current_mode() == "highest"
        assert current_mode() == "medium"
    assert current_mode() == base
    with pytest.raises(ValueError, match="mode must be one of"):
        with torch_tpu.precision("ultra"):
            pass


def test_precision_block_is_not_seen_by_other_threads():
    import threading

    seen = []
    with torch_tpu.precision("medium"):
        worker = threading.Thread(target=lambda: seen.append(current_mode()))
        worker.start()
        worker.join()
    assert seen == [torch.get_float32_matmul_precision()]


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_precision_block_reaches_the_backward_on_autograd_s_thread(compiled):
    """Autograd runs the backward of tpu tensors on its device thread: the caller's block
    must hold there, for the eager backward ops and for a compiled graph's backward."""
    import threading

    import torch_tpu.device  # noqa: F401 - registers the device where autoload is off

    seen = []
    lin = torch.nn.Linear(4, 3).to("tpu")

    def forward(x):
        y = lin(x)
        y.register_hook(lambda g: seen.append((threading.current_thread() is threading.main_thread(), current_mode())))
        return y

    if compiled:
        torch._dynamo.reset()
        forward = torch.compile(forward, backend="tpu")
    base = torch.get_float32_matmul_precision()
    mode = "medium" if base != "medium" else "high"
    with torch_tpu.precision(mode):
        forward(torch.randn(2, 4).to("tpu")).sum().backward()
    assert seen and all(mode_seen == mode for _, mode_seen in seen), seen
    assert not seen[0][0], "the backward ran on the calling thread: the test shows nothing"
    forward(torch.randn(2, 4).to("tpu")).sum().backward()
    assert seen[-1][1] == base


def test_precision_reaches_the_module():
    m = torch.nn.Linear(4, 3)
    x = torch.randn(2, 4)
    with torch_tpu.precision("high"):
        exported = torch_tpu.export(m, (x,))
    assert "precision = [HIGH, HIGH]" in exported.text
    with torch_tpu.precision("medium"):
        assert "precision = [DEFAULT, DEFAULT]" in torch_tpu.export(m, (x,)).text


def test_set_float32_matmul_precision_is_honoured():
    old = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("high")
        assert current_mode() == "high"
        assert "precision=high" in pipeline_for(current_mode())
    finally:
        torch.set_float32_matmul_precision(old)


def test_export_text_bytecode_and_portable_artifact_run():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.GELU(), torch.nn.Linear(8, 2)).eval()
    x = torch.randn(3, 6)
    exported = torch_tpu.export(model, (x,))
    assert "func.func public @main" in exported.text or "func.func @main" in exported.text
    assert exported.bytecode.startswith(b"ML\xefR")
    torch.testing.assert_close(exported(x), model(x), rtol=1e-5, atol=1e-5)

    # The portable artifact loads back (as another StableHLO consumer would) and runs.
    from torch_tpu.compiler.context import make_context, stablehlo
    from torch_tpu.runtime import get_client

    artifact = exported.portable_artifact()
    context = make_context()
    module = stablehlo.deserialize_portable_artifact(context, artifact)
    executable = get_client().compile(module)
    (out,) = executable(*exported.state, x)
    torch.testing.assert_close(out, model(x), rtol=1e-5, atol=1e-5)


def test_linear_algebra_keeps_full_precision_under_medium():
    class MatrixExp(torch.nn.Module):
        def forward(self, a):
            return torch.linalg.matrix_exp(a) @ a

    a = torch.randn(4, 4) + 4 * torch.eye(4)
    with torch_tpu.precision("medium"):
        text = torch_tpu.export(MatrixExp(), (a,)).text
    assert "precision = [HIGHEST, HIGHEST]" in text  # inside matrix_exp's algorithm
    assert "precision = [DEFAULT, DEFAULT]" in text  # the user's own matmul
    assert "torchtpu.fixed_precision" not in text


def _silu_times_up(g, u):
    return torch.nn.functional.silu(g) * u


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_compiled_graph_rounds_sixteen_bit_intermediates_as_inductor(dtype):
    """torch.compile's rule for 16-bit intermediates is inductor's: a fused kernel computes
    them in float32 and rounds what it stores, unless emulate_precision_casts asks for eager's
    rounding after each op. Compiled `silu(g) * u` reads SiLU's result unrounded (the
    exact value rounded once); with the setting on it equals eager bit for bit. Before, the
    compiled graph rounded SiLU's result as eager does, whatever the setting."""
    from torch._inductor import config as inductor_config

    gen = torch.Generator().manual_seed(0)
    g = torch.randn(4096, generator=gen).to(dtype)
    u = torch.randn(4096, generator=gen).to(dtype)
    eager = _silu_times_up(g, u)
    once = (torch.nn.functional.silu(g.float()) * u.float()).to(dtype)
    assert (eager != once).any()  # the case tells the two rules apart
    torch._dynamo.reset()
    compiled = torch.compile(_silu_times_up, backend="tpu")
    assert torch.equal(compiled(g, u), once)
    torch._dynamo.reset()
    with inductor_config.patch(emulate_precision_casts=True):
        compiled = torch.compile(_silu_times_up, backend="tpu")
        assert torch.equal(compiled(g, u), eager)
    torch._dynamo.reset()


def _residual_adds(x, a, m):
    return (x + a) + m


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_compiled_graph_writes_sixteen_bit_arithmetic_as_sixteen_bit_ops(dtype, tmp_path, monkeypatch):
    """`(x + a) + m` on 16-bit tensors compiles to two 16-bit adds (`torchtpu-narrow-opmath`),
    not float32 adds whose unrounded intermediate sum XLA would store in float32 where a
    kernel writes it (a residual stream read by several kernels): XLA decides which 16-bit
    results it keeps in float32 inside a kernel, and writes 16 bits. Each element is eager's
    value or the sum rounded once; XLA:CPU rounds each add, as eager does."""
    monkeypatch.setenv("TORCH_TPU_DUMP_DIR", str(tmp_path))
    gen = torch.Generator().manual_seed(0)
    x, a, m = (torch.randn(1 << 16, generator=gen).to(dtype) for _ in range(3))
    eager = _residual_adds(x, a, m)
    once = (x.float() + a.float() + m.float()).to(dtype)
    assert (eager != once).any()  # the case tells the two rules apart
    torch._dynamo.reset()
    compiled = torch.compile(_residual_adds, backend="tpu")(x, a, m)
    torch._dynamo.reset()
    assert ((compiled == eager) | (compiled == once)).all()
    [final] = tmp_path.glob("*/final.mlir")
    element = {torch.bfloat16: "bf16", torch.float16: "f16"}[dtype]
    module = final.read_text()
    adds = re.findall(r"stablehlo\.add .* : (tensor<\w+>)", module)
    assert adds == [f"tensor<65536x{element}>"] * 2 and "f32" not in module, module


def _explicit_round_trip(x):
    return x.to(torch.bfloat16).float() * 3


def _silu_compared(g, u):
    return (torch.nn.functional.silu(g) * u) > 0.25


@pytest.mark.parametrize("fn, make", [
    (_explicit_round_trip, lambda gen: (torch.randn(4096, generator=gen),)),
    # 2^18 products: some round to 0.25 exactly in bfloat16 from just above it.
    (_silu_compared, lambda gen: tuple(torch.randn(1 << 18, generator=gen).to(torch.bfloat16) for _ in range(2))),
], ids=["explicit cast", "compared"])
def test_compiled_graph_keeps_the_roundings_inductor_keeps(fn, make):
    """What inductor rounds by default is kept: a cast the user wrote and a rounding whose
    value a comparison reads (an unrounded product falls on the other side of 0.25 where
    eager's rounded one does not). Both equal eager bit for bit."""
    args = make(torch.Generator().manual_seed(1))
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend="tpu")
    assert torch.equal(compiled(*args), fn(*args))
    torch._dynamo.reset()
