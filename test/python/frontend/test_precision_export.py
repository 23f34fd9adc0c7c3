"""Precision follows PyTorch's API; export produces loadable StableHLO."""

import logging

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
