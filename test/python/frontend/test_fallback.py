"""Ops the converter cannot lower run in PyTorch eager (logged once) while the rest of the
graph runs compiled; strict mode makes that an error naming the op and the source line."""

import inspect
import logging

import pytest
import torch

import torch_tpu
from torch_tpu.runtime import Executable


@torch.library.custom_op("torchtpu_test::mystery", mutates_args=())
def mystery(x: torch.Tensor) -> torch.Tensor:
    # Reads values (numpy), so its implementation cannot be traced into the graph.
    return torch.from_numpy(x.numpy() * 3 + 1)


@mystery.register_fake
def _(x):
    return torch.empty_like(x)


def model(x):
    y = torch.sin(x) * 2
    z = mystery(y)  # no lowering: must run in eager
    return torch.relu(z) + y


MYSTERY_LINE = inspect.getsourcelines(model)[1] + inspect.getsource(model).splitlines().index(
    "    z = mystery(y)  # no lowering: must run in eager"
)


@pytest.fixture
def executions(monkeypatch):
    """Counts the calls of compiled programs (runtime Executables)."""
    calls = []
    original = Executable.__call__

    def counting(self, *args):
        calls.append(self)
        return original(self, *args)

    monkeypatch.setattr(Executable, "__call__", counting)
    return calls


def test_unsupported_op_falls_back(caplog, monkeypatch, tmp_path, executions):
    monkeypatch.delenv("TORCH_TPU_STRICT", raising=False)
    monkeypatch.setenv("TORCH_TPU_DUMP_DIR", str(tmp_path))
    torch._dynamo.reset()
    x = torch.randn(4, 5)
    compiled = torch.compile(model, backend="tpu")
    with caplog.at_level(logging.WARNING, logger="torch_tpu"):
        out = compiled(x)
        again = compiled(x + 1)
    torch.testing.assert_close(out, model(x))
    torch.testing.assert_close(again, model(x + 1))
    messages = [r.getMessage() for r in caplog.records if r.name.startswith("torch_tpu")]
    assert len(messages) == 1, messages
    assert ("custom op torchtpu_test.mystery.default has no lowering and its implementation cannot be "
            "traced: RuntimeError: .numpy() is not supported for tensor subclasses; it runs in PyTorch "
            "eager") in messages[0]

    # The ops around the eager one ran compiled: one program before it (sin, mul) and one
    # after it (relu, add), each called once per call of the model.
    finals = sorted((d / "final.mlir").read_text() for d in tmp_path.iterdir() if (d / "final.mlir").exists())
    assert len(finals) == 2, [d.name for d in tmp_path.iterdir()]
    [before] = [text for text in finals if "stablehlo.sine" in text] or [f"no program computes sin:\n{finals}"]
    [after] = [text for text in finals if "stablehlo.maximum" in text] or [f"no program computes relu:\n{finals}"]
    assert "stablehlo.multiply" in before and "stablehlo.maximum" not in before
    assert "stablehlo.add" in after and "stablehlo.sine" not in after
    # The eager op's result is an argument of the second program, not an op of either.
    assert not any("torchtpu_test" in text or "custom_call" in text for text in finals)
    assert 'loc("mystery")' in after.split("func.func @main", 1)[1].split("{", 1)[0]
    assert len(executions) == 4 and len(set(map(id, executions))) == 2


def test_strict_mode_names_op_and_line(monkeypatch, executions):
    monkeypatch.setenv("TORCH_TPU_STRICT", "1")
    torch._dynamo.reset()
    with pytest.raises(torch._dynamo.exc.BackendCompilerFailed) as info:
        torch.compile(model, backend="tpu")(torch.randn(4, 5))
    error = info.value.inner_exception
    assert isinstance(error, torch_tpu.TorchTpuCompileError)
    text = str(error)
    assert text.startswith(f"torch_tpu: torchtpu_test.mystery.default (node mystery) at {__file__}:{MYSTERY_LINE}: "), text
    assert ("untraceable custom op: its implementation cannot be traced: RuntimeError: .numpy() is not "
            "supported for tensor subclasses (TORCH_TPU_STRICT=1 forbids falling back to PyTorch eager; "
            "unset it") in text
    assert not executions  # nothing ran: strict mode fails at compile time
