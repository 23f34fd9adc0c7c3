"""The tpu device's random generator (issue 13 item 7): one (seed, offset) state per
device, drawn from by eager random ops on the device and by compiled graphs on tpu
tensors; reproducible, savable, statistically sound."""

import subprocess
import sys

import pytest
import torch

import torch_tpu.device  # noqa: F401 - registers the device where autoload is off
from torch_tpu.device import _fallback

N = 200_000


@pytest.fixture
def on_device_only(monkeypatch):
    """Random ops must run on the device: the CPU fallback would draw from CPU's stream."""

    def fail(op, *_args, **_kwargs):
        raise AssertionError(f"{op} ran on CPU")

    monkeypatch.setattr(_fallback, "run_on_cpu", fail)


def _offset() -> int:
    state = torch.tpu.get_rng_state()
    assert state.dtype == torch.uint8 and state.numel() == 16
    return int(state.numpy().view("<u8")[1])


DRAWS = {
    "rand": lambda: torch.rand(64, device="tpu"),
    "randn": lambda: torch.randn(8, 8, device="tpu"),
    "normal_": lambda: torch.empty(64, device="tpu").normal_(2.0, 3.0),
    "uniform_": lambda: torch.empty(64, device="tpu").uniform_(-1.0, 1.0),
    "bernoulli_": lambda: torch.empty(64, device="tpu").bernoulli_(0.3),
    "bernoulli": lambda: torch.bernoulli(torch.full((64,), 0.5, device="tpu")),
    "dropout": lambda: torch.nn.functional.dropout(torch.ones(64, device="tpu"), 0.5),
}


@pytest.mark.parametrize("name", sorted(DRAWS))
def test_eager_draws_reproducible_and_advance_state(on_device_only, name):
    draw = DRAWS[name]
    torch.tpu.manual_seed(1234)
    start = _offset()
    first, second = draw(), draw()
    assert first.device.type == "tpu"
    assert _offset() > start  # drawn from the device generator
    torch.tpu.manual_seed(1234)
    again = draw()
    assert torch.equal(first.cpu(), again.cpu())
    assert not torch.equal(first.cpu(), second.cpu())


def test_state_save_restore(on_device_only):
    torch.tpu.manual_seed(7)
    torch.randn(10, device="tpu")
    state = torch.tpu.get_rng_state()
    expected = torch.randn(100, device="tpu").cpu()
    torch.randn(3, device="tpu")  # moves on
    torch.tpu.set_rng_state(state)
    assert torch.equal(torch.randn(100, device="tpu").cpu(), expected)
    assert torch.tpu.initial_seed() == 7
    with pytest.raises(RuntimeError, match="16-byte uint8"):
        torch.tpu.set_rng_state(torch.get_rng_state())  # CPU's state is not this one


def test_torch_manual_seed_seeds_the_device():
    torch.manual_seed(99)
    a = torch.rand(16, device="tpu").cpu()
    torch.tpu.manual_seed(99)
    assert torch.equal(torch.rand(16, device="tpu").cpu(), a)
    assert torch.tpu.initial_seed() == 99


def test_eager_and_compiled_share_the_generator(on_device_only):
    torch._dynamo.reset()
    noisy = torch.compile(lambda x: x + torch.rand_like(x), backend="tpu")
    zeros = torch.zeros(32, device="tpu")
    torch.tpu.manual_seed(5)
    before = _offset()
    compiled_draw = noisy(zeros).cpu()
    assert _offset() == before + 1  # the compiled graph took one key of the device's state
    eager_after = torch.rand(32, device="tpu").cpu()
    # Same seed, same order of programs: the same values, whichever ran compiled.
    torch.tpu.manual_seed(5)
    assert torch.equal(noisy(zeros).cpu(), compiled_draw)
    assert torch.equal(torch.rand(32, device="tpu").cpu(), eager_after)
    # Restoring the state replays the compiled draw.
    torch.tpu.manual_seed(5)
    state = torch.tpu.get_rng_state()
    first = noisy(zeros).cpu()
    torch.tpu.set_rng_state(state)
    assert torch.equal(noisy(zeros).cpu(), first)
    torch._dynamo.reset()


def test_statistics(on_device_only):
    torch.tpu.manual_seed(0)
    normal = torch.randn(N, device="tpu").cpu().double()
    assert abs(normal.mean().item()) < 0.01 and abs(normal.std().item() - 1) < 0.01
    uniform = torch.rand(N, device="tpu").cpu().double()
    assert abs(uniform.mean().item() - 0.5) < 0.005 and abs(uniform.std().item() - 12**-0.5) < 0.005
    assert 0 <= uniform.min().item() and uniform.max().item() < 1
    shifted = torch.empty(N, device="tpu").normal_(2.0, 3.0).cpu().double()
    assert abs(shifted.mean().item() - 2) < 0.03 and abs(shifted.std().item() - 3) < 0.03
    coins = torch.empty(N, device="tpu").bernoulli_(0.3).cpu()
    assert abs(coins.mean().item() - 0.3) < 0.005
    dropped = torch.nn.functional.dropout(torch.ones(N, device="tpu"), 0.25).cpu()
    assert abs((dropped == 0).double().mean().item() - 0.25) < 0.005
    assert torch.all((dropped == 0) | torch.isclose(dropped, torch.tensor(1 / 0.75)))
    # Successive draws are not correlated (distinct keys per program).
    a, b = torch.rand(N, device="tpu").cpu().double(), torch.rand(N, device="tpu").cpu().double()
    assert abs(torch.corrcoef(torch.stack([a, b]))[0, 1].item()) < 0.01


def test_reproducible_run_to_run():
    """Another process with the same seed draws the same values (and an unseeded one
    starts from a fixed default seed)."""
    code = (
        "import torch, torch_tpu.device\n"
        "u = torch.rand(4, device='tpu').cpu().tolist()\n"
        "torch.tpu.manual_seed(2024)\n"
        "print(repr((u, torch.randn(6, device='tpu').cpu().tolist())))\n"
    )
    outputs = [
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True).stdout
        for _ in range(2)
    ]
    assert outputs[0] == outputs[1]
    torch.tpu.manual_seed(2024)
    assert eval(outputs[0].strip().splitlines()[-1])[1] == torch.randn(6, device="tpu").cpu().tolist()


def test_ops_that_draw_internally_equal_cpu_given_their_random_inputs():
    """fractional max pooling with explicit window offsets and multi-head attention without
    dropout read no generator: their tpu results equal CPU's exactly (the OpInfo suite
    compares only shapes for their random samples)."""
    import torch.nn.functional as F

    torch.manual_seed(0)
    x, samples = torch.randn(1, 2, 5, 5, 5), torch.rand(1, 2, 3)
    expected = F.fractional_max_pool3d(x, 2, output_size=(3, 3, 3), _random_samples=samples)
    actual = F.fractional_max_pool3d(x.to("tpu"), 2, output_size=(3, 3, 3), _random_samples=samples.to("tpu"))
    torch.testing.assert_close(actual.cpu(), expected, rtol=0, atol=0)

    mha = torch.nn.MultiheadAttention(8, 2, dropout=0.5).eval()
    q = torch.randn(4, 3, 8)
    expected, _ = mha(q, q, q)
    actual, _ = mha.to("tpu")(q.to("tpu"), q.to("tpu"), q.to("tpu"))
    torch.testing.assert_close(actual.cpu(), expected, rtol=1e-5, atol=1e-5)
