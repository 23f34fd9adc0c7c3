"""Donation in FUSED mode (issue 14, item 4): the fused program donates every external
buffer a recorded op writes, so XLA writes the storage's new value over its old memory --
unless something else still reads the old buffer, which then gets a copy (the rule of
op-by-op runs, `_ops._donation_safe`) while the program and its cache key stay the same."""

import pytest
import torch

import torch_tpu.device  # noqa: F401 - registers the device where autoload is off
from torch_tpu.device import EagerMode, _fused, set_eager_mode
from torch_tpu.device._buffers import entry_of
from torch_tpu.runtime import get_client


@pytest.fixture
def fused(monkeypatch):
    """FUSED mode, waiting for each new program's compile: every flush runs the fused
    program (no op-by-op first run, which copies what it writes)."""
    monkeypatch.setenv("TORCH_TPU_FUSED_FIRST_RUN", "1")
    with set_eager_mode(EagerMode.FUSED):
        yield


def _pointer(t: torch.Tensor) -> int:
    return entry_of(t).buffer.unsafe_data_pointer()


def _in_place_loop(x: torch.Tensor, steps: int) -> list[int]:
    pointers = []
    for _ in range(steps):
        x.add_(1.0)
        x.mul_(2.0)
        torch.tpu.synchronize()
        pointers.append(_pointer(x))
    return pointers


def test_in_place_loop_keeps_its_buffer(fused, copies):
    x = torch.zeros(4096, device="tpu")
    torch.tpu.synchronize()  # x's value is a buffer: each trace below writes an external
    first = _pointer(x)
    fused_runs = _fused.STATS["fused_runs"]
    pointers = _in_place_loop(x, 5)
    assert _fused.STATS["fused_runs"] == fused_runs + 5
    assert copies == []
    # Without donation the new value is allocated while the old buffer is alive: another address.
    assert pointers == [first] * 5
    torch.testing.assert_close(x.cpu(), torch.full((4096,), 62.0))


def test_sole_reference_count_is_exact(fused, copies, monkeypatch):
    # One reference fewer than `_SOLE_REFERENCES` counts the trace's own references as
    # another reader: every run copies, and the storage moves between two buffers.
    monkeypatch.setattr(_fused, "_SOLE_REFERENCES", _fused._SOLE_REFERENCES - 1)
    x = torch.zeros(4096, device="tpu")
    torch.tpu.synchronize()  # x's value is a buffer: each trace below writes an external
    pointers = _in_place_loop(x, 4)
    assert copies == [(4096,)] * 4
    assert len(set(pointers)) > 1
    torch.testing.assert_close(x.cpu(), torch.full((4096,), 30.0))


def test_buffer_held_elsewhere_keeps_its_value(fused, copies):
    t = torch.arange(8, dtype=torch.float32, device="tpu")
    held = entry_of(t).buffer  # e.g. a compiled graph's argument list, or a caller
    t.add_(1.0)
    torch.testing.assert_close(t.cpu(), torch.arange(8, dtype=torch.float32) + 1)
    assert copies == [(8,)]
    assert not held.is_deleted
    torch.testing.assert_close(held.to_torch(), torch.arange(8, dtype=torch.float32))


def test_storage_shared_by_two_entries_is_not_donated(fused, copies):
    a = torch.arange(8, dtype=torch.float32, device="tpu")
    b = torch.empty(8, device="tpu")
    entry_of(b).buffer = entry_of(a).buffer  # two storages on one DeviceBuffer
    a.mul_(3.0)
    torch.testing.assert_close(a.cpu(), torch.arange(8, dtype=torch.float32) * 3)
    torch.testing.assert_close(b.cpu(), torch.arange(8, dtype=torch.float32))
    assert copies == [(8,)]


def test_buffer_viewed_on_the_host_keeps_its_value(fused, copies):
    t = torch.arange(8, dtype=torch.float32, device="tpu")
    host_view = entry_of(t).buffer.to_torch()  # shares the buffer's memory (zero-copy)
    t.mul_(10.0)
    torch.testing.assert_close(t.cpu(), torch.arange(8, dtype=torch.float32) * 10)
    torch.testing.assert_close(host_view, torch.arange(8, dtype=torch.float32))


def test_reads_before_the_write_in_the_same_trace_see_the_old_value(fused, copies):
    x = torch.randn(6, 4)
    t = x.to("tpu")
    doubled = t * 2.0  # recorded before the write: reads the donated argument
    rows = t[1:3]
    rows.add_(1.0)  # writes the storage through a view
    expected = x.clone()
    expected[1:3] += 1.0
    torch.testing.assert_close(doubled.cpu(), x * 2.0)
    torch.testing.assert_close(t.cpu(), expected)
    assert copies == []


def _adamw_step(model, optimizer, x, target):
    optimizer.zero_grad(set_to_none=True)
    loss = torch.nn.functional.mse_loss(model(x), target)
    loss.backward()
    optimizer.step()
    return loss.item()


def test_optimizer_steps_keep_the_parameters_memory(fused, copies):
    torch.manual_seed(0)
    reference = torch.nn.Linear(16, 8)
    model = torch.nn.Linear(16, 8).to("tpu")
    model.load_state_dict(reference.state_dict())
    ref_opt = torch.optim.AdamW(reference.parameters(), lr=1e-2)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x, target = torch.randn(4, 16), torch.randn(4, 8)
    xd, td = x.to("tpu"), target.to("tpu")
    for _ in range(2):  # warm-up: the optimizer's state appears, the traces settle
        _adamw_step(model, opt, xd, td)
        _adamw_step(reference, ref_opt, x, target)
    pointers = [_pointer(p) for p in model.parameters()]
    compiles = get_client().cache.stats.compiles
    del copies[:]
    for _ in range(3):
        loss = _adamw_step(model, opt, xd, td)
        torch.testing.assert_close(loss, _adamw_step(reference, ref_opt, x, target), rtol=1e-5, atol=1e-6)
    assert [_pointer(p) for p in model.parameters()] == pointers
    assert get_client().cache.stats.compiles == compiles
    assert copies == []
    for p, r in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p.cpu(), r.detach(), rtol=1e-5, atol=1e-6)
