"""PyTorch modules that reach kernels of CPU and CUDA only, on the chip: their decompositions
(compiler/lowering/rnn_cells.py, transformer_fast_path.py, grad_scaling.py,
margin_losses.py, parameter_norms.py) run there under TORCH_TPU_STRICT=1 (a CPU fallback
fails the test), outputs and gradients against the same module on CPU. Matrix products at
'highest' (float32 accuracy); the tolerance covers XLA:TPU's float32 transcendental
functions (~1e-6..1e-5 relative, test_device_opinfo.py's TPU_TOLERANCE)."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import torch_tpu

TOL = {"atol": 1e-4, "rtol": 2e-4}


def _assert_grads_close(cpu: nn.Module, tpu: nn.Module, atol: float = TOL["atol"]) -> None:
    """Every parameter's gradient, at `atol` scaled by the gradient's largest element: a
    gradient sums many products (time steps, batch), each off by the chip's rounding."""
    for (name, p), q in zip(cpu.named_parameters(), tpu.parameters()):
        got, scale = q.grad.cpu(), max(1.0, p.grad.abs().max().item())
        err = (got - p.grad).abs().max().item()
        print(f"{name}: max |tpu - cpu| {err:.2e}, largest |grad| {scale:.2e}")
        torch.testing.assert_close(got, p.grad, atol=atol * scale, rtol=TOL["rtol"])


@pytest.fixture(autouse=True)
def strict_highest(chip, monkeypatch):
    monkeypatch.setenv("TORCH_TPU_STRICT", "1")
    with torch_tpu.precision("highest"):
        yield


@pytest.mark.parametrize("make", [
    lambda: nn.LSTM(8, 8, num_layers=2, batch_first=True),
    lambda: nn.GRU(8, 8, bidirectional=True, batch_first=True),
], ids=["lstm-2-layers", "gru-bidirectional"])
def test_recurrent_layers(make):
    torch.manual_seed(0)
    cpu = make()
    tpu = copy.deepcopy(cpu).to("tpu")
    x = torch.randn(2, 5, 8)
    want, got = cpu(x)[0], tpu(x.to("tpu"))[0]
    want.square().sum().backward()
    got.square().sum().backward()
    torch.testing.assert_close(got.detach().cpu(), want.detach(), **TOL)
    # XLA:TPU's float32 tanh is good to 8.1e-5 relative (measured on a v5e over [-8, 8]; JAX's
    # tanh is the same op). A GRU's input-weight gradient sums its error over the steps and
    # both directions: 3.0e-4 of a largest element of 3.2 there (CPU's float32: 4.6e-7 of a
    # float64 reference), against the LSTM's 3.5e-6.
    _assert_grads_close(cpu, tpu, atol=3 * TOL["atol"])


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_transformer_encoder_in_eval_mode_with_a_padding_mask(compiled):
    torch.manual_seed(0)
    encoder = nn.TransformerEncoder(nn.TransformerEncoderLayer(16, 2, 32, batch_first=True), 2).eval()
    on_chip = copy.deepcopy(encoder).to("tpu")
    x = torch.randn(2, 5, 16)
    pad = torch.tensor([[False] * 5, [False, False, False, True, True]])
    if compiled:
        torch._dynamo.reset()
        on_chip = torch.compile(on_chip, backend="tpu")
    with torch.no_grad():
        want = encoder(x, src_key_padding_mask=pad)
        got = on_chip(x.to("tpu"), src_key_padding_mask=pad.to("tpu")).cpu()
    torch.testing.assert_close(got[~pad], want[~pad], **TOL)


def test_grad_scaler_training():
    torch.manual_seed(0)
    cpu = nn.Linear(4, 3)
    tpu = copy.deepcopy(cpu).to("tpu")
    for module, device in ((cpu, "cpu"), (tpu, "tpu")):
        opt = torch.optim.SGD(module.parameters(), lr=0.1)
        scaler = torch.amp.GradScaler(device, init_scale=1024.0)
        gen = torch.Generator().manual_seed(1)
        for _ in range(3):
            opt.zero_grad()
            scaler.scale(module(torch.randn(5, 4, generator=gen).to(device)).square().sum()).backward()
            scaler.step(opt)
            scaler.update()
    torch.testing.assert_close(tpu.weight.detach().cpu(), cpu.weight.detach(), **TOL)


def test_weight_normalized_convolution_and_max_norm_embedding():
    torch.manual_seed(0)

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(20, 8, max_norm=1.0)
            self.conv = nn.utils.parametrizations.weight_norm(nn.Conv1d(8, 8, 3, padding=1))

        def forward(self, tokens):
            return self.conv(self.embed(tokens).transpose(1, 2))

    cpu = Model()
    tpu = copy.deepcopy(cpu).to("tpu")
    tokens = torch.randint(0, 20, (3, 7), generator=torch.Generator().manual_seed(2))
    want, got = cpu(tokens), tpu(tokens.to("tpu"))
    want.square().sum().backward()
    got.square().sum().backward()
    torch.testing.assert_close(got.detach().cpu(), want.detach(), **TOL)
    torch.testing.assert_close(tpu.embed.weight.detach().cpu(), cpu.embed.weight.detach(), **TOL)
    _assert_grads_close(cpu, tpu)


def test_margin_losses():
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(4, 5, generator=gen)
    labels = torch.tensor([[3, 0, -1, 1, 2], [4, -1, 0, 0, 0], [1, 2, 3, 4, 0], [2, 2, -1, 3, 3]])
    classes = torch.tensor([0, 4, 2, 1])
    grads = []
    for device in ("cpu", "tpu"):
        a = x.detach().to(device).requires_grad_()
        loss = F.multilabel_margin_loss(a, labels.to(device)) + F.multi_margin_loss(a, classes.to(device), p=2)
        loss.backward()
        grads.append((loss.detach().cpu(), a.grad.cpu()))
    torch.testing.assert_close(grads[1], grads[0], **TOL)


def test_fused_adamw_training():
    torch.manual_seed(0)
    cpu = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 4))
    tpu = copy.deepcopy(cpu).to("tpu")
    for model, device in ((cpu, "cpu"), (tpu, "tpu")):
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1, fused=True)
        gen = torch.Generator().manual_seed(1)
        for _ in range(4):
            opt.zero_grad()
            model(torch.randn(8, 16, generator=gen).to(device)).square().mean().backward()
            opt.step()
    for (name, want), got in zip(cpu.named_parameters(), tpu.parameters()):
        torch.testing.assert_close(got.detach().cpu(), want.detach(), **TOL, msg=name)


def test_integer_shifts():
    a = torch.tensor([7, -12, 5, 3, -1, 100, 0, 1], dtype=torch.int32)
    b = torch.tensor([0, 1, 3, 7, 31, 32, -1, 64], dtype=torch.int32)
    for op in (lambda x, y: x << y, lambda x, y: x >> y, lambda x, y: x.to(torch.uint8) >> y.abs()):
        assert torch.equal(op(a.to("tpu"), b.to("tpu")).cpu(), op(a, b))
