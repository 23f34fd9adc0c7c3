"""Shaped storages (issue 28): a storage's device buffer keeps the shape of the dense
tensor that produced it, so a tensor that covers its storage in that shape is passed to
programs as it is -- an eager op or a compiled call on tpu tensors runs exactly ONE
program, with no relayout program around it (on a TPU a reshape is a copy) -- while every
other view still reads and writes through the storage's element order.

Programs and transfers are counted by the runtime (`torch.tpu.transfer_stats()`)."""

import pytest
import torch

import torch_tpu.device  # noqa: F401 - registers the device where autoload is off
from torch_tpu.device import _storage


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _delta(fn):
    """(fn's result, the transfers and program launches it made), after the device is idle."""
    torch.tpu.synchronize()
    before = torch.tpu.transfer_stats()
    out = fn()
    return out, torch.tpu.transfer_stats() - before


def test_storages_take_the_shape_of_the_dense_tensor_that_made_them():
    a = torch.randn(4, 6).to("tpu")
    b = torch.randn(6, 5).to("tpu")
    assert _storage.entry_of(a).shape == (4, 6)
    assert _storage.entry_of(a @ b).shape == (4, 5)
    assert _storage.entry_of(torch.empty(3, 2, device="tpu")).shape == (3, 2)
    # A dense permuted layout keeps its memory order: channels-last is N, H, W, C.
    nhwc = torch.randn(2, 3, 4, 5).contiguous(memory_format=torch.channels_last)
    on_tpu = nhwc.to("tpu")
    assert on_tpu.stride() == nhwc.stride()
    assert _storage.entry_of(on_tpu).shape == (2, 4, 5, 3)
    torch.testing.assert_close(on_tpu.cpu(), nhwc)
    assert _storage.entry_of(on_tpu + 1).shape == (2, 4, 5, 3)


def test_the_rule_passes_only_the_covering_row_major_tensor():
    a = torch.randn(4, 6).to("tpu")
    assert _storage.passes_as_is(a)
    assert _storage.passes_as_is(a.view(4, 6))
    assert _storage.passes_as_is(a.unsqueeze(1).squeeze(1))
    for view in (a.t(), a[1:], a[:, :3], a.reshape(24), a.view(torch.int32), a.as_strided((2, 6), (6, 1), 6)):
        assert not _storage.passes_as_is(view), (view.shape, view.stride(), view.storage_offset(), view.dtype)


def test_eager_matmul_on_dense_tensors_runs_one_program():
    a, b = torch.randn(32, 16).to("tpu"), torch.randn(16, 8).to("tpu")
    a @ b  # plans and compiles
    out, moved = _delta(lambda: a @ b)
    assert moved.programs_executed == 1
    assert moved.uploads == 0 and moved.downloads == 0
    torch.testing.assert_close(out.cpu(), a.cpu() @ b.cpu())


def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 32), torch.nn.ReLU(),
                               torch.nn.Linear(32, 4))


def test_compiled_mlp_call_on_tpu_tensors_runs_one_program():
    model = _mlp().eval()
    compiled = torch.compile(_mlp().eval().to("tpu"), backend="tpu")
    x = torch.randn(8, 16)
    x_tpu = x.to("tpu")
    with torch.no_grad():
        for _ in range(2):  # compile, then a steady call
            compiled(x_tpu)
        out, moved = _delta(lambda: compiled(x_tpu))
        expected = model(x)
    assert moved.programs_executed == 1, moved
    assert moved.uploads == 0, moved
    assert out.device.type == "tpu" and _storage.entry_of(out).shape == (8, 4)
    torch.testing.assert_close(out.cpu(), expected)


def test_whole_copy_between_dense_tensors_shares_the_buffer_without_a_program():
    a, b = torch.randn(4, 6).to("tpu"), torch.randn(4, 6).to("tpu")
    expected = b.cpu()
    _, moved = _delta(lambda: a.copy_(b))
    assert moved.programs_executed == 0, moved
    torch.testing.assert_close(a.cpu(), expected)
    # The storages stay independent: an in-place op on either leaves the other as it was
    # (the shared buffer is not donated while both hold it).
    a.add_(1)
    b.mul_(2)
    torch.testing.assert_close(a.cpu(), expected + 1)
    torch.testing.assert_close(b.cpu(), expected * 2)


@pytest.mark.parametrize("case", ["broadcast", "dtype", "slice_dst", "transposed_src", "view_of_larger"])
def test_copies_that_are_not_whole_dense_values_still_run_the_copy(case):
    dst = torch.zeros(4, 6).to("tpu")
    src = {"broadcast": torch.randn(6), "dtype": torch.randn(4, 6).double(),
           "slice_dst": torch.randn(2, 6), "transposed_src": torch.randn(6, 4).t(),
           "view_of_larger": torch.randn(5, 6)[1:]}[case]
    target = dst[1:3] if case == "slice_dst" else dst
    expected = torch.zeros(4, 6)
    (expected[1:3] if case == "slice_dst" else expected).copy_(src)
    source = src.to("tpu") if case != "transposed_src" else src.t().to("tpu").t()
    if case == "view_of_larger":
        source = torch.randn(5, 6).to("tpu")[1:]
        expected = source.cpu().clone()
    target.copy_(source)
    torch.testing.assert_close(dst.cpu(), expected)


def test_compiled_step_that_updates_its_inputs_runs_one_program_per_graph():
    """aot_autograd writes a graph's updated inputs back with `copy_` after the program:
    on tpu tensors that is a buffer rebind, so an optimizer-like update of N tensors is
    one program, not 1 + N."""
    params = [torch.randn(8, 8).to("tpu") for _ in range(6)]
    expected = [p.cpu() for p in params]

    @torch.compile(backend="tpu")
    def update(tensors, scale):
        for t in tensors:
            t.mul_(scale).add_(1)

    scale = torch.tensor(0.5).to("tpu")
    with torch.no_grad():
        update(params, scale)
        _, moved = _delta(lambda: update(params, scale))
    assert moved.programs_executed == 1, moved
    for p, e in zip(params, expected):
        torch.testing.assert_close(p.cpu(), (e * 0.5 + 1) * 0.5 + 1)


def test_views_of_shaped_storages_read_and_write_through_storage_order():
    base = torch.arange(24.0).reshape(4, 6)
    a = base.clone().to("tpu")
    a[1:3].mul_(2)
    base[1:3].mul_(2)
    a.t()[0].add_(1)
    base.t()[0].add_(1)
    a.view(-1)[5::7].fill_(-1)
    base.view(-1)[5::7].fill_(-1)
    a.as_strided((2, 2), (1, 6), 2).sub_(3)
    base.as_strided((2, 2), (1, 6), 2).sub_(3)
    # In-place writes into views keep the storage's shape: the whole tensor still passes as is.
    assert _storage.entry_of(a).shape == (4, 6) and _storage.passes_as_is(a)
    torch.testing.assert_close(a.cpu(), base)
    torch.testing.assert_close(a[1:, ::2].cpu(), base[1:, ::2])
    torch.testing.assert_close(a.t().contiguous().cpu(), base.t().contiguous())
    assert a.untyped_storage().nbytes() == 24 * 4


def test_compiled_call_on_views_reads_them_on_the_device():
    base = torch.randn(6, 8)
    a = base.to("tpu")
    fn = torch.compile(lambda x, y: x * 2 + y, backend="tpu")
    for _ in range(2):
        out = fn(a[1:5, ::2], a.t()[:4, :4])
    torch.testing.assert_close(out.cpu(), base[1:5, ::2] * 2 + base.t()[:4, :4])


def test_resize_and_set_keep_values():
    a = torch.arange(6.0).reshape(2, 3).to("tpu")
    a.resize_(3, 3)
    assert a.shape == (3, 3)
    torch.testing.assert_close(a.cpu().reshape(-1)[:6], torch.arange(6.0))
    b = torch.empty(0, device="tpu")
    b.set_(a.untyped_storage(), 0, (9,), (1,))
    torch.testing.assert_close(b.cpu()[:6], torch.arange(6.0))
    b.add_(1)
    torch.testing.assert_close(a.cpu().reshape(-1)[:6], torch.arange(6.0) + 1)


def test_transfer_stats_count_uploads_and_programs():
    torch.tpu.synchronize()
    torch.tpu.reset_transfer_stats()
    assert torch.tpu.transfer_stats().uploads == 0
    host = torch.randn(64, 32)
    _, moved = _delta(lambda: host.to("tpu"))
    assert moved.uploads == 1 and moved.upload_bytes == host.numel() * 4
    assert moved.programs_executed == 0


def test_compiled_call_on_host_tensors_uploads_only_the_batch():
    """Module state stays resident on the device: after the first call a compiled call
    on host tensors moves its input batch and nothing else."""
    model = _mlp()
    compiled = torch.compile(model, backend="tpu")
    with torch.no_grad():
        for _ in range(2):
            compiled(torch.randn(8, 16))
        for _ in range(3):
            x = torch.randn(8, 16)
            out, moved = _delta(lambda: compiled(x))
            assert moved.uploads == 1, moved
            assert moved.upload_bytes == x.numel() * x.element_size(), moved
            assert moved.programs_executed == 1, moved
            torch.testing.assert_close(out, model(x))


def test_a_flat_storage_adopts_the_shape_of_the_tensor_covering_it():
    """A storage written from the host flat (here grown and shrunk by `resize_`) is
    reshaped once by the first compiled call that takes the tensor covering it; later
    calls pass it as is."""
    host = torch.randn(4, 8)
    b = host.to("tpu")
    storage = b.untyped_storage()
    storage.resize_(storage.nbytes() * 2)
    storage.resize_(storage.nbytes() // 2)  # the tensor's size again, its buffer flat
    assert _storage.entry_of(b).shape == (32,) and not _storage.passes_as_is(b)
    fn = torch.compile(lambda x: x * 2, backend="tpu")
    fn(b)
    assert _storage.passes_as_is(b) and _storage.entry_of(b).shape == (4, 8)
    out, moved = _delta(lambda: fn(b))
    assert moved.programs_executed == 1
    torch.testing.assert_close(out.cpu(), host * 2)
    torch.testing.assert_close(b.cpu(), host)
    # A view that does not cover its storage leaves the storage's shape alone.
    torch.testing.assert_close(fn(b[1:]).cpu(), host[1:] * 2)
    assert _storage.entry_of(b).shape == (4, 8)
