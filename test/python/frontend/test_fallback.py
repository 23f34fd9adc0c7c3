"""Ops the converter cannot lower run in PyTorch eager (logged once); strict mode makes
that an error naming the op and the source line."""

import logging

import pytest
import torch

import torch_tpu


@torch.library.custom_op("torchtpu_test::mystery", mutates_args=())
def mystery(x: torch.Tensor) -> torch.Tensor:
    return x * 3 + 1


@mystery.register_fake
def _(x):
    return torch.empty_like(x)


def model(x):
    y = torch.sin(x) * 2
    z = mystery(y)  # no lowering: must run in eager
    return torch.relu(z) + y


def test_unsupported_op_falls_back(caplog, monkeypatch):
    monkeypatch.delenv("TORCH_TPU_STRICT", raising=False)
    torch._dynamo.reset()
    x = torch.randn(4, 5)
    with caplog.at_level(logging.WARNING, logger="torch_tpu"):
        out = torch.compile(model, backend="tpu")(x)
    torch.testing.assert_close(out, model(x))
    messages = [r.getMessage() for r in caplog.records if "torchtpu_test" in r.getMessage()]
    assert len(messages) == 1, messages
    assert "runs in PyTorch eager" in messages[0]


def test_strict_mode_names_op_and_line(monkeypatch):
    monkeypatch.setenv("TORCH_TPU_STRICT", "1")
    torch._dynamo.reset()
    with pytest.raises(Exception) as info:
        torch.compile(model, backend="tpu")(torch.randn(4, 5))
    text = str(info.value)
    assert "torchtpu_test.mystery" in text
    assert "test_fallback.py" in text  # the user's source line
    assert isinstance(info.value, torch_tpu.TorchTpuCompileError) or "TorchTpuCompileError" in text
