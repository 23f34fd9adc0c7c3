"""In-place donation on the eager tpu device (issue 13): an in-place / out= op donates the
written storage's old buffer to the op, so XLA writes the new value over it (`x.add_(1)`
in a loop allocates nothing) -- but only when nothing else can read the old value."""

import pytest
import torch

import torch_tpu.device  # noqa: F401 - registers the device where autoload is off
from torch_tpu.device import _ops
from torch_tpu.device._buffers import entry_of


def _pointer(t: torch.Tensor) -> int:
    return entry_of(t).buffer.unsafe_data_pointer()


def test_in_place_loop_writes_over_its_own_buffer():
    x = torch.zeros(4096, device="tpu")
    x.add_(1.0)  # plans and compiles
    first = _pointer(x)
    for _ in range(5):
        x.add_(1.0)
        # Without donation the result is a new allocation made while the old buffer is
        # alive, so its address differs.
        assert _pointer(x) == first
    torch.testing.assert_close(x.cpu(), torch.full((4096,), 6.0))


def test_out_argument_is_donated():
    a, b = torch.randn(256), torch.randn(256)
    out = torch.empty(256, device="tpu")
    torch.add(a.to("tpu"), b.to("tpu"), out=out)
    first = _pointer(out)
    torch.add(a.to("tpu"), b.to("tpu"), out=out)
    assert _pointer(out) == first
    torch.testing.assert_close(out.cpu(), a + b)


def test_views_of_a_donated_storage_see_the_write(copies):
    base = torch.arange(24, dtype=torch.float32)
    t = base.to("tpu")
    rows = t.view(4, 6)
    copies.clear()
    rows[1:3].mul_(2.0)
    base.view(4, 6)[1:3].mul_(2.0)
    assert copies == []
    torch.testing.assert_close(t.cpu(), base)
    torch.testing.assert_close(rows.cpu(), base.view(4, 6))


def test_storage_read_by_the_same_op_is_not_donated(copies):
    x = torch.randn(64)
    t = x.to("tpu")
    copies.clear()
    t.add_(t)  # the old value is also the op's second operand: copied
    assert copies == [(64,)]
    t.mul_(t.flip(0))  # a different storage: donated
    assert copies == [(64,)]
    torch.testing.assert_close(t.cpu(), (x + x) * (x + x).flip(0))


def test_buffer_held_elsewhere_keeps_its_value(copies):
    t = torch.arange(8, dtype=torch.float32).to("tpu")
    held = entry_of(t).buffer  # e.g. a compiled graph's argument list, or a caller
    copies.clear()
    t.add_(1.0)
    assert copies == [(8,)]
    assert not held.is_deleted
    torch.testing.assert_close(held.to_torch(), torch.arange(8, dtype=torch.float32))
    torch.testing.assert_close(t.cpu(), torch.arange(8, dtype=torch.float32) + 1)


def test_buffer_viewed_on_the_host_keeps_its_value(copies):
    t = torch.arange(8, dtype=torch.float32).to("tpu")
    host_view = entry_of(t).buffer.to_torch()  # shares the buffer's memory (zero-copy)
    copies.clear()
    t.mul_(10.0)
    assert copies == [(8,)]
    torch.testing.assert_close(host_view, torch.arange(8, dtype=torch.float32))
    torch.testing.assert_close(t.cpu(), torch.arange(8, dtype=torch.float32) * 10)


def test_in_place_write_of_a_saved_tensor_is_caught_by_autograd_as_on_cpu():
    for device in ("cpu", "tpu"):
        a = torch.randn(5).to(device).requires_grad_()
        y = a.exp()  # saves its result for backward
        y.add_(1.0)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            y.sum().backward()


def test_donation_in_a_training_step_matches_cpu():
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 4)
    reference = torch.nn.Linear(16, 4)
    reference.load_state_dict(model.state_dict())
    model.to("tpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    x = torch.randn(8, 16)
    for _ in range(3):
        for m, o, inp in ((model, opt, x.to("tpu")), (reference, ref_opt, x)):
            o.zero_grad()
            m(inp).square().mean().backward()
            o.step()
    torch.testing.assert_close(model.weight.cpu(), reference.weight, rtol=1e-5, atol=1e-6)


def test_op_enqueued_before_the_donation_reads_the_old_value():
    x = torch.randn(1 << 20)
    t = x.to("tpu")
    for _ in range(3):
        doubled = t * 2.0  # enqueued (Strict mode): reads t's buffer, maybe still pending
        t.add_(1.0)  # donates that buffer
        torch.testing.assert_close(doubled.cpu(), x * 2.0)
        x = x + 1.0
    torch.testing.assert_close(t.cpu(), x)


def test_donation_survives_a_failed_compiled_call():
    """A compiled call that raises can leave Dynamo's frame-evaluation hook installed,
    which adds a reference to every call's arguments: the donation check measures that,
    or no in-place op would donate again in the process (seen in CI after
    test_device_compile's device-mismatch test)."""
    fn = torch.compile(lambda a, b: a + b, backend="tpu")
    with pytest.raises(Exception, match="device"):
        fn(torch.randn(3), torch.randn(3).to("tpu"))
    x = torch.zeros(4096, device="tpu")
    x.add_(1.0)
    first = _pointer(x)
    for _ in range(3):
        x.add_(1.0)
        assert _pointer(x) == first
    torch.testing.assert_close(x.cpu(), torch.full((4096,), 4.0))
