"""torch.compile(backend="tpu") on the chip: inference and training, on host tensors and on
tpu tensors, bounded dynamism (one compile serves several sizes), numerics against CPU."""

from __future__ import annotations

import torch
import torch.nn as nn

import torch_tpu
from torch_tpu.runtime import get_client


class Block(nn.Module):
    """Small on purpose: the TPU compiler takes seconds per graph, and the suite compiles
    about ten (its time budget on the chip is 8 minutes, everything included)."""

    def __init__(self, d: int = 64) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))

    def forward(self, x):
        return x + self.mlp(self.norm(x))


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(Block(), nn.Linear(64, 10))


def test_inference_on_host_tensors(chip):
    model = _model().eval()
    x = torch.randn(4, 16, 64)
    with torch.no_grad():
        got = torch.compile(model, backend="tpu")(x)
        want = model(x)
    assert got.device.type == "cpu"
    torch.testing.assert_close(got, want, atol=2e-4, rtol=2e-4)


def test_inference_on_tpu_tensors_stays_on_the_device(chip):
    model = _model().eval()
    x = torch.randn(4, 16, 64)
    with torch.no_grad():
        want = model(x)
        on = model.to("tpu")
        got = torch.compile(on, backend="tpu")(x.to("tpu"))
    assert got.device.type == "tpu"
    torch.testing.assert_close(got.cpu(), want, atol=2e-4, rtol=2e-4)


def _train(model, x, y, steps, device):
    model = model.to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    step = torch.compile(lambda a, b: nn.functional.cross_entropy(model(a).mean(1), b), backend="tpu")
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = step(x.to(device), y.to(device))
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def test_training_on_tpu_tensors_matches_cpu(chip):
    x, y = torch.randn(8, 16, 64), torch.randint(0, 10, (8,))
    reference = _train(_model(), x, y, 5, "cpu")
    got = _train(_model(), x, y, 5, "tpu")
    assert got[-1] < got[0], f"the loss did not decrease: {got}"
    torch.testing.assert_close(torch.tensor(got), torch.tensor(reference), atol=2e-3, rtol=2e-3)


def test_training_on_host_tensors(chip):
    model = _model()
    ref = _model()
    x, y = torch.randn(8, 16, 64), torch.randint(0, 10, (8,))
    compiled = torch.compile(model, backend="tpu")
    loss = nn.functional.cross_entropy(compiled(x).mean(1), y)
    loss.backward()
    nn.functional.cross_entropy(ref(x).mean(1), y).backward()
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, atol=2e-4, rtol=2e-3, msg=lambda m: f"{name}: {m}")


def _bounded_run(on_device: bool) -> list[int]:
    torch._dynamo.reset()
    reference = _model().eval()
    model = _model().eval()
    compiled = torch.compile(model.to("tpu") if on_device else model, backend="tpu")
    stats = get_client().cache.stats
    counts = []
    for seq in (5, 17, 32, 9):
        x = torch.randn(2, seq, 64)
        arg = x.to("tpu") if on_device else x
        torch_tpu.mark_dynamic(arg, 1, max=32, min=2)
        with torch.no_grad():
            got = compiled(arg)
            want = reference(x)
        assert got.shape == (2, seq, 10) and got.device.type == ("tpu" if on_device else "cpu")
        torch.testing.assert_close(got.cpu(), want, atol=2e-4, rtol=2e-4)
        counts.append(stats.compiles)
    return counts


def test_bounded_dynamism_one_compile_serves_several_sizes(chip):
    counts = _bounded_run(on_device=False)
    assert counts[-1] == counts[0], f"programs compiled after the first size: {counts}"


def test_bounded_dynamism_on_tpu_tensors(chip):
    # tpu tensors of a new size are padded to the bound and the result cut back by two
    # single-op programs of that size (constant_pad_nd, clone: ~1 small compile each per new
    # size, none for a size seen before); the graph's own program compiles once.
    counts = _bounded_run(on_device=True)
    per_size = [b - a for a, b in zip(counts, counts[1:])]
    assert all(n <= 2 for n in per_size), f"programs compiled per new size: {per_size}"


def _cache_step(cache, pos, x):
    cache.index_copy_(1, pos, x)
    return cache.sum(1) * 2


def test_a_compiled_cache_write_consumes_the_cache_buffer_on_the_chip(chip, monkeypatch):
    """A decode-style step donates its KV cache on the TPU too: from the second call the
    cache's buffer goes in as it is (no device copy), and every value matches eager."""
    from torch_tpu.runtime.buffer import DeviceBuffer

    torch._dynamo.reset()
    step = torch.compile(_cache_step, backend="tpu")
    cache, ref = torch.zeros(2, 16, 8, device="tpu"), torch.zeros(2, 16, 8)
    copies = []
    with torch.no_grad():
        for i in range(6):
            if i == 2:
                original = DeviceBuffer.copy
                monkeypatch.setattr(DeviceBuffer, "copy", lambda self: copies.append(self.shape) or original(self))
            x = torch.randn(2, 1, 8)
            out = step(cache, torch.tensor([i], device="tpu"), x.to("tpu"))
            torch.testing.assert_close(out.cpu(), _cache_step(ref, torch.tensor([i]), x))
    monkeypatch.undo()
    assert copies == []
    torch.testing.assert_close(cache.cpu(), ref)


def _whole_step(model, opt):
    def step(x, y):
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(model(x).mean(1), y)
        loss.backward()
        opt.step()
        return loss.detach()

    return torch.compile(step, backend="tpu")


def test_a_compiled_training_step_in_fused_mode_is_one_program_on_the_chip(chip):
    """In FUSED mode the compiled step's graphs (forward, backward, AdamW) are recorded and
    run as one program per step on the TPU; its losses and parameters are Strict mode's."""
    from torch_tpu.device import EagerMode, set_eager_mode
    from torch_tpu.runtime import transfer_stats

    x, y = torch.randn(8, 16, 64), torch.randint(0, 10, (8,))
    results = {}
    for mode in (EagerMode.STRICT, EagerMode.FUSED):
        torch._dynamo.reset()
        model = _model().to("tpu")
        step = _whole_step(model, torch.optim.AdamW(model.parameters(), lr=1e-2))
        xs, ys = x.to("tpu"), y.to("tpu")
        losses, programs = [], []
        for _ in range(6):
            before = transfer_stats().programs_executed
            with set_eager_mode(mode):
                loss = step(xs, ys)
            programs.append(transfer_stats().programs_executed - before)
            losses.append(loss.item())
        results[mode] = (losses, [p.detach().cpu() for p in model.parameters()], programs)
    strict, fused = results[EagerMode.STRICT], results[EagerMode.FUSED]
    assert fused[2][-1] == 1, f"programs per FUSED step: {fused[2]}"
    assert fused[0][-1] < fused[0][0], fused[0]
    torch.testing.assert_close(torch.tensor(fused[0]), torch.tensor(strict[0]), atol=2e-3, rtol=2e-3)
    for a, b in zip(fused[1], strict[1]):
        torch.testing.assert_close(a, b, atol=2e-3, rtol=2e-3)


def test_a_compiled_training_step_with_dropout_is_one_program_on_the_chip(chip, monkeypatch):
    """A step whose forward draws random numbers (dropout) is deferred into one program in
    Strict mode, launched early from its fourth step; its masks come from the same keys as
    the graphs run one by one (TORCH_TPU_FUSE_COMPILED_STEP=0), so the training matches."""
    from torch_tpu.device import _early_launch
    from torch_tpu.runtime import transfer_stats

    x, y = torch.randn(8, 16, 64).to("tpu"), torch.randint(0, 10, (8,)).to("tpu")
    results = {}
    for deferred in ("1", "0"):
        monkeypatch.setenv("TORCH_TPU_FUSE_COMPILED_STEP", deferred)
        torch._dynamo.reset()
        torch.tpu.manual_seed(3)
        torch.manual_seed(0)
        model = nn.Sequential(Block(), nn.Dropout(0.25), nn.Linear(64, 10)).to("tpu")
        step = _whole_step(model, torch.optim.AdamW(model.parameters(), lr=1e-2))
        before = dict(_early_launch.STATS)
        losses, programs = [], []
        for _ in range(6):
            executed = transfer_stats().programs_executed
            losses.append(step(x, y).item())
            programs.append(transfer_stats().programs_executed - executed)
        hits = _early_launch.STATS["hits"] - before["hits"]
        results[deferred] = (losses, [p.detach().cpu() for p in model.parameters()], programs, hits)
    one, each = results["1"], results["0"]
    # The step alone: `loss.detach()` after opt.step() is a graph of views, run as eager views.
    assert one[2][-1] == 1 and each[2][-1] >= 4, (one[2], each[2])
    assert one[3] >= 2 and each[3] == 0, (one[3], each[3])
    torch.testing.assert_close(torch.tensor(one[0]), torch.tensor(each[0]), atol=2e-3, rtol=2e-3)
    for a, b in zip(one[1], each[1]):
        torch.testing.assert_close(a, b, atol=2e-3, rtol=2e-3)


def test_a_repeating_compiled_step_is_launched_at_its_forward_on_the_chip(chip, monkeypatch):
    """Strict mode launches a repeating step's program at its forward's call
    (TORCH_TPU_EARLY_STEP_LAUNCH), undonated; its results are bit for bit those of the
    step run at its end."""
    from torch_tpu.device import _early_launch, _fused

    x, y = torch.randn(8, 16, 64).to("tpu"), torch.randint(0, 10, (8,)).to("tpu")
    results = {}
    for early in ("1", "0"):
        monkeypatch.setenv("TORCH_TPU_EARLY_STEP_LAUNCH", early)
        torch._dynamo.reset()
        _fused._PROGRAMS.clear()  # both trainings take the same paths at the same steps
        _fused._SEEN_ONCE.clear()
        _early_launch._PROGRAMS.clear()
        model = _model().to("tpu")
        step = _whole_step(model, torch.optim.AdamW(model.parameters(), lr=1e-2))
        before = dict(_early_launch.STATS)
        losses = [step(x, y).item() for _ in range(7)]
        hits = _early_launch.STATS["hits"] - before["hits"]
        results[early] = (losses, [p.detach().cpu() for p in model.parameters()], hits)
    assert results["1"][2] == 3 and results["0"][2] == 0, (results["1"][2], results["0"][2])
    assert results["1"][0] == results["0"][0]
    for a, b in zip(results["1"][1], results["0"][1]):
        assert torch.equal(a, b)


def test_a_step_after_a_large_allocation_is_still_launched_early_on_the_chip(chip):
    """The early launch's room check is against the memory in use at the launch, not the
    process's peak (which only grows): a step trained after a tensor of most of the chip's
    memory was made and freed is still launched early (a compiled step in FUSED mode run
    after a Strict one had 0 launches on the chip when the check read the peak)."""
    from tpu_support import tpu_only

    from torch_tpu.device import _early_launch, _fused

    tpu_only(chip, "XLA:CPU reports no memory limit: every step fits there")
    stats = torch.tpu.memory_stats()
    room = int(0.8 * stats["bytes_limit"]) - stats["bytes_in_use"]
    big = torch.ones(room // 4, device="tpu")  # the peak is now ~80 % of the chip
    torch.tpu.synchronize()
    del big
    assert torch.tpu.memory_stats()["peak_bytes_in_use"] >= 0.8 * stats["bytes_limit"] - 2**20
    x, y = torch.randn(8, 16, 64).to("tpu"), torch.randint(0, 10, (8,)).to("tpu")
    torch._dynamo.reset()
    _fused._PROGRAMS.clear()
    _fused._SEEN_ONCE.clear()
    _early_launch._PROGRAMS.clear()
    _early_launch._NO_ROOM.clear()
    model = _model().to("tpu")
    step = _whole_step(model, torch.optim.AdamW(model.parameters(), lr=1e-2))
    before = dict(_early_launch.STATS)
    for _ in range(7):
        step(x, y).item()
    assert _early_launch.STATS["hits"] - before["hits"] == 3  # as in the test above, with no large allocation
