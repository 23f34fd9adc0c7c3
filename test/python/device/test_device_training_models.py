"""Issue 13 acceptance, beyond the MLP: a CNN with BatchNorm and a tiny GPT trained
with AdamW for 20 steps on the tpu device give CPU eager's losses (rtol 1e-4), in
Strict and in Debug mode. Random weights; a CPU copy and a tpu copy of one model."""

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import torch_tpu.device  # noqa: F401 - registers the device where autoload is off
from torch_tpu.device import EagerMode, set_eager_mode
from torch_tpu.examples.quickstart import TinyGPT

STEPS = 20


def _cnn():
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(8, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        nn.Flatten(), nn.Linear(8, 10),
    )


def _train_cnn(model, device):
    model = model.to(device).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    gen = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(STEPS):
        x = torch.randn(8, 3, 16, 16, generator=gen).to(device)
        y = torch.randint(0, 10, (8,), generator=gen).to(device)
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, model


def _gpt():
    torch.manual_seed(0)
    return TinyGPT(vocab=64, d=32, heads=2, layers=2, seq=16)


def _train_gpt(model, device):
    model = model.to(device).train()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1)
    gen = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(STEPS):
        ids = torch.randint(0, 64, (4, 17), generator=gen).to(device)
        opt.zero_grad()
        logits = model(ids[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
    return losses, model


MODELS = {"cnn_batchnorm_adamw": (_cnn, _train_cnn), "tiny_gpt_adamw": (_gpt, _train_gpt)}


@pytest.mark.parametrize("mode", [EagerMode.STRICT, EagerMode.DEBUG, EagerMode.FUSED])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_losses_equal_cpu(monkeypatch, name, mode):
    build, train = MODELS[name]
    model = build()
    expected, cpu_model = train(copy.deepcopy(model), "cpu")
    monkeypatch.setenv("TORCH_TPU_STRICT", "1")  # every op of the step runs on the device
    with set_eager_mode(mode):
        got, tpu_model = train(copy.deepcopy(model), "tpu")
    torch.testing.assert_close(torch.tensor(got), torch.tensor(expected), rtol=1e-4, atol=1e-5)
    assert all(p.device.type == "tpu" for p in tpu_model.parameters())
    # Buffers (BatchNorm's running stats, written in place by the op) match too. The
    # parameters are covered by the losses: compared one by one, those whose true
    # gradient is zero (an attention key's bias) hold AdamW's normalized rounding noise.
    cpu_buffers, tpu_buffers = dict(cpu_model.named_buffers()), dict(tpu_model.named_buffers())
    assert cpu_buffers.keys() == tpu_buffers.keys()
    for key, value in cpu_buffers.items():
        assert tpu_buffers[key].device.type == "tpu", key
        torch.testing.assert_close(tpu_buffers[key].cpu(), value, rtol=1e-4, atol=1e-5, msg=key)


@pytest.mark.parametrize("momentum", [0.1, None])
def test_batch_norm_training_updates_running_stats_on_device(monkeypatch, momentum):
    """native_batch_norm writes its running stats and returns new tensors: it runs on
    the device through its functional variant (TORCH_TPU_STRICT forbids a CPU fallback),
    and the running stats are written in place, through every view of them."""
    monkeypatch.setenv("TORCH_TPU_STRICT", "1")
    torch.manual_seed(0)
    cpu = nn.BatchNorm2d(4, momentum=momentum).train()
    tpu = copy.deepcopy(cpu).to("tpu")
    alias = tpu.running_mean.view(2, 2)  # a view sees the in-place update
    for step in range(3):
        x = torch.randn(5, 4, 3, 3) * (step + 1) + step
        torch.testing.assert_close(tpu(x.to("tpu")).cpu(), cpu(x), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(tpu.running_mean.cpu(), cpu.running_mean)
    torch.testing.assert_close(tpu.running_var.cpu(), cpu.running_var)
    torch.testing.assert_close(alias.cpu(), cpu.running_mean.view(2, 2))
    assert int(tpu.num_batches_tracked.item()) == 3
    tpu.eval()
    cpu.eval()
    x = torch.randn(2, 4, 3, 3)
    torch.testing.assert_close(tpu(x.to("tpu")).cpu(), cpu(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("training", [True, False])
def test_native_batch_norm_legit_writes_running_stats(monkeypatch, training):
    """The schema-annotated form (`Tensor(a!) running_mean`): the same functional path in
    training mode; eval mode returns CPU's empty save_mean/save_invstd."""
    torch.manual_seed(0)
    x, w, b = torch.randn(4, 3, 5), torch.randn(3), torch.randn(3)
    stats = [torch.randn(3), torch.rand(3) + 0.5]
    tpu_stats = [s.to("tpu") for s in stats]
    op = torch.ops.aten._native_batch_norm_legit.default
    expected = op(x, w, b, *stats, training, 0.1, 1e-5)
    if training:
        monkeypatch.setenv("TORCH_TPU_STRICT", "1")  # runs on the device
    got = op(x.to("tpu"), w.to("tpu"), b.to("tpu"), *tpu_stats, training, 0.1, 1e-5)
    for g, e in zip(got, expected):
        assert g.device.type == "tpu" and g.shape == e.shape
        torch.testing.assert_close(g.cpu(), e, rtol=1e-5, atol=1e-5)
    for g, e in zip(tpu_stats, stats):
        torch.testing.assert_close(g.cpu(), e)
