"""Compiled graphs in FUSED mode (issue 28): a `torch.compile` graph called on tpu tensors
while FUSED mode records is one op of the trace (`_fused.GraphPlan`), so a compiled
training step -- forward, backward and optimizer step, three graphs -- runs as one program
per step, as a jitted JAX step does. Values are Strict mode's; reading a result mid-step,
a written KV cache and CPU results keep their meaning."""

from __future__ import annotations

import pytest
import torch

from torch_tpu.device import EagerMode, _fused, set_eager_mode
from torch_tpu.runtime import transfer_stats

from compiled_step_model import fresh_whole_step


def _train(mode: EagerMode, steps: int = 5):
    model, step = fresh_whole_step()
    x, y = torch.randn(6, 8).to("tpu"), torch.arange(6).remainder(4).to("tpu")
    losses, programs, fused_ops = [], [], []
    for _ in range(steps):
        before, recorded = transfer_stats().programs_executed, _fused.STATS["ops"]
        with set_eager_mode(mode):
            loss = step(x, y)
        losses.append(loss.item())
        programs.append(transfer_stats().programs_executed - before)
        fused_ops.append(_fused.STATS["ops"] - recorded)
    return losses, [p.detach().cpu() for p in model.parameters()], programs, fused_ops


def test_a_compiled_training_step_runs_as_one_program_with_strict_values(monkeypatch):
    with monkeypatch.context() as m:
        m.setenv("TORCH_TPU_FUSE_COMPILED_STEP", "0")
        strict = _train(EagerMode.STRICT)
    fused = _train(EagerMode.FUSED)
    # Strict, each graph when it is called: forward, backward, the gradient seed, AdamW
    # (and the loss's detach graph).
    assert strict[2][-1] >= 4, strict[2]
    # FUSED, once its trace repeats: the graphs and the seed recorded, one program.
    assert fused[2][-2:] == [1, 1], fused[2]
    assert fused[3][-1] >= 4, fused[3]
    assert fused[0][-1] < fused[0][0]
    torch.testing.assert_close(torch.tensor(fused[0]), torch.tensor(strict[0]), rtol=1e-5, atol=1e-6)
    for a, b in zip(fused[1], strict[1]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_reading_a_compiled_result_mid_trace_flushes_and_the_trace_goes_on():
    f = torch.compile(lambda a, b: (a @ b).relu(), backend="tpu")
    a, b = torch.randn(4, 4), torch.randn(4, 4)
    ta, tb = a.to("tpu"), b.to("tpu")
    f(ta, tb)  # the first call compiles and runs; later ones take the recording path
    with set_eager_mode(EagerMode.FUSED):
        h = f(ta, tb) * 2
        recorded = len(_fused._current[0].plans)
        first = h.sum().item()  # a flush
        out = f(h, tb) + 1  # recorded on a new trace, reading the flushed value
    want = (a @ b).relu() * 2
    assert recorded == 2
    assert first == pytest.approx(want.sum().item(), rel=1e-5)
    torch.testing.assert_close(out.cpu(), (want @ b).relu() + 1)


def test_a_compiled_cache_write_in_fused_mode_writes_the_cache():
    def write(cache, pos, x):
        cache.index_copy_(1, pos, x)
        return cache.sum(1)

    step = torch.compile(write, backend="tpu")
    cache, ref = torch.zeros(2, 6, 3, device="tpu"), torch.zeros(2, 6, 3)
    with torch.no_grad():
        for i in range(6):
            x = torch.randn(2, 1, 3)
            pos = torch.tensor([i])
            with set_eager_mode(EagerMode.FUSED):
                out = step(cache, pos.to("tpu"), x.to("tpu"))
                version = cache._version
                if i:  # from the second call the graph is recorded, its cache write pending
                    assert isinstance(_fused._current[0].plans[-1], _fused.GraphPlan)
            torch.testing.assert_close(out.cpu(), write(ref, pos, x))
            assert cache._version == version
    torch.testing.assert_close(cache.cpu(), ref)


def test_a_loop_over_one_compiled_graph_runs_a_program_per_call():
    """A trace holds each compiled graph once: calling the same graph again (a decode
    loop that reads nothing) flushes the previous call, so no trace stitches the model
    over and over."""
    step = torch.compile(lambda h, w: torch.tanh(h @ w), backend="tpu")
    h, w = torch.randn(2, 4), torch.randn(4, 4)
    th, tw = h.to("tpu"), w.to("tpu")
    step(th, tw)
    flushes = _fused.STATS["flushes"]
    with set_eager_mode(EagerMode.FUSED):
        for _ in range(5):
            th = step(th, tw)
            h = torch.tanh(h @ w)
            assert sum(isinstance(p, _fused.GraphPlan) for p in _fused._current[0].plans) == 1
    assert _fused.STATS["flushes"] - flushes == 5  # four at the next call, one on leaving the mode
    torch.testing.assert_close(th.cpu(), h)


def test_a_graph_with_a_cpu_result_still_runs_in_fused_mode():
    def f(x, n):
        return x * 2, n + 1  # `n` is a CPU tensor: its result comes back on the CPU

    g = torch.compile(f, backend="tpu")
    x, n = torch.randn(3), torch.tensor(4)
    g(x.to("tpu"), n)
    with set_eager_mode(EagerMode.FUSED):
        y, m = g(x.to("tpu"), n)
    assert m.device.type == "cpu" and m.item() == 5
    torch.testing.assert_close(y.cpu(), x * 2)
