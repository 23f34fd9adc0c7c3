"""The eager tpu device: registration, storage and views, copies, ops through the
lowering table, fallback, modes, torch.tpu, bad input (issue 13)."""

import os
import subprocess
import sys
import textwrap
import time

import pytest
import torch

import torch_tpu
import torch_tpu.device  # noqa: F401 - registers the device where autoload is off
from torch_tpu.device import EagerMode, get_eager_mode, set_eager_mode

from cpu_only_ops import halve_on_cpu_only
from torch_tpu.device import _ops

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def _run(code: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300,
        env={**os.environ, **env}, cwd=REPO,
    )


# -- registration ---------------------------------------------------------------------
def test_autoload_without_importing_torch_tpu():
    out = _run("""
        import sys, torch
        x = torch.ones(2, device="tpu")
        print(x.device, x.cpu().tolist(), "torch_tpu.device" in sys.modules)
    """)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["tpu:0", "[1.0,", "1.0]", "True"]


def test_autoload_off():
    out = _run("""
        import torch
        try:
            torch.ones(2, device="tpu")
        except RuntimeError as e:
            print("refused")
    """, TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "refused"


def test_print_tensor_methods_and_module():
    x = torch.arange(3.0).tpu()
    assert "device='tpu:0'" in repr(x)
    assert x.is_tpu and not torch.ones(1).is_tpu
    m = torch.nn.Linear(2, 2).tpu()
    assert m.weight.device == torch.device("tpu:0")
    assert torch.tpu.is_available() and torch.tpu.device_count() >= 1
    assert torch.tpu.current_device() == 0


# -- storage and views ------------------------------------------------------------------
def _same_on_both(fn):
    """Runs fn on a CPU and a tpu tensor built alike; their final values must agree."""
    base = torch.arange(24.0).reshape(4, 6)
    cpu, tpu = base.clone(), base.clone().to("tpu")
    fn(cpu)
    fn(tpu)
    torch.testing.assert_close(tpu.cpu(), cpu)


def test_views_see_writes():
    def writes(x):
        row = x[1]
        row.add_(100)
        col = x.t()[2]
        col.mul_(-1)
        x.view(-1)[5:9].fill_(7)
        x[::2, 1::3].sub_(0.5)
        x.diagonal().copy_(torch.tensor([9.0, 8.0, 7.0, 6.0]))

    _same_on_both(writes)


# Reads and in-place writes through dtype views (`x.view(torch.int32)`), run on the device
# (TORCH_TPU_STRICT=1 forbids the CPU): same itemsize, narrower and wider views, offset views,
# a storage tail no view element covers, bool and complex.
_F32 = torch.linspace(-3, 3, 12)
_BYTES = torch.arange(11, dtype=torch.uint8)
_DTYPE_VIEWS = {
    "f32_as_i32_read": (_F32, lambda x: x.view(torch.int32) + 1),
    "f32_as_i32_write": (_F32, lambda x: x.view(torch.int32).add_(7)),
    "f32_as_u8_offset_read": (_F32, lambda x: x.view(torch.uint8)[5:13].clone()),
    "f32_as_u8_offset_write": (_F32, lambda x: x.view(torch.uint8)[5:13].fill_(3)),
    "f32_sign_bytes_strided_write": (_F32, lambda x: x[2:].view(torch.uint8).view(-1, 4)[:, 3].bitwise_xor_(0x80)),
    "f32_as_i16_offset_write": (_F32, lambda x: x.view(torch.int16)[3:9].mul_(3)),
    "bf16_as_i16_read": (torch.randn(6).to(torch.bfloat16), lambda x: x.view(torch.int16) & 0x00FF),
    "bf16_as_i16_write": (torch.randn(6).to(torch.bfloat16), lambda x: x.view(torch.int16).bitwise_and_(0x7FFF)),
    "i16_as_bf16_write": (torch.arange(-4, 4, dtype=torch.int16) * 1000, lambda x: x.view(torch.bfloat16).mul_(2)),
    "u8_as_i32_tail_read": (_BYTES, lambda x: x[4:8].view(torch.int32) + 1),
    "u8_as_i32_tail_write": (_BYTES, lambda x: x[4:8].view(torch.int32).sub_(5)),
    "u8_as_f16_offset_write": (_BYTES, lambda x: x[2:10].view(torch.float16).neg_()),
    "u8_as_bool": (torch.tensor([0, 1, 1, 0], dtype=torch.uint8), lambda x: x.view(torch.bool).logical_not()),
    "f32_as_c64_read": (_F32, lambda x: x.view(torch.complex64) * 2),
    "f32_as_c64_write": (_F32, lambda x: x.view(torch.complex64).mul_(1j)),
}


@pytest.mark.parametrize("case", list(_DTYPE_VIEWS))
def test_dtype_views_run_on_the_device(case, monkeypatch):
    monkeypatch.setenv("TORCH_TPU_STRICT", "1")
    base, fn = _DTYPE_VIEWS[case]
    cpu, tpu = base.clone(), base.clone().to("tpu")
    expected, got = fn(cpu), fn(tpu)
    assert got.device.type == "tpu"
    torch.testing.assert_close(got.cpu(), expected, rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(tpu.cpu(), cpu, rtol=0, atol=0, equal_nan=True)


_GROUPED_MM = {  # (mat_a, mat_b, offs): PyTorch's four layouts, in float32
    "rows": ((6, 4), (3, 4, 8), [2, 4, 6]),
    "columns": ((3, 8, 4), (4, 8), [4, 6, 8]),
    "contraction": ((8, 12), (12, 8), [4, 8, 12]),
    "batched": ((3, 8, 4), (3, 4, 8), None),
}


@pytest.mark.parametrize("layout", list(_GROUPED_MM))
def test_grouped_mm_float32_runs_on_the_device(layout, monkeypatch):
    # PyTorch's meta kernel of _grouped_mm takes bfloat16 only; the plan's metadata comes
    # from the lowering's own rule (registry.METADATA_RULES), so float32 is not a fallback.
    monkeypatch.setenv("TORCH_TPU_STRICT", "1")
    a_shape, b_shape, offs = _GROUPED_MM[layout]
    a, b = torch.randn(a_shape), torch.randn(b_shape)
    offs = None if offs is None else torch.tensor(offs, dtype=torch.int32)
    expected = torch._grouped_mm(a, b, offs)
    got = torch._grouped_mm(a.to("tpu"), b.to("tpu"), None if offs is None else offs.to("tpu"))
    assert got.device.type == "tpu" and got.dtype == torch.float32
    torch.testing.assert_close(got.cpu(), expected)


def test_grouped_mm_misaligned_strides_raise_pytorchs_error():
    # The rule keeps PyTorch's checks: the CPU runs the op and raises its own error.
    a, b, offs = torch.randn(6, 5), torch.randn(3, 5, 8), torch.tensor([2, 4, 6], dtype=torch.int32)
    with pytest.raises(RuntimeError, match="multiple of 16 bytes"):
        torch._grouped_mm(a, b, offs)
    with pytest.raises(RuntimeError, match="multiple of 16 bytes"):
        torch._grouped_mm(a.to("tpu"), b.to("tpu"), offs.to("tpu"))
    # Dtypes the CPU kernel rejects (float64, an out_dtype other than the operands') are
    # errors on the device too, never a result.
    a, b, offs = torch.randn(8, 16), torch.randn(2, 16, 8), torch.tensor([3, 8], dtype=torch.int32)
    for args, kwargs, message in (((a.double(), b.double(), offs), {}, "Float32, BFloat16 or Float16"),
                                  ((a, b, offs), {"out_dtype": torch.bfloat16}, "output dtype must match")):
        with pytest.raises(RuntimeError, match=message):
            torch._grouped_mm(*args, **kwargs)
        with pytest.raises(RuntimeError, match=message):
            torch._grouped_mm(*[t.to("tpu") for t in args], **kwargs)


@pytest.mark.parametrize("layout", list(_GROUPED_MM))
def test_grouped_mm_float32_compiles_on_tpu_tensors(layout, monkeypatch):
    # Dynamo traces tpu tensors with fake tensors: PyTorch's meta kernel would refuse
    # float32 before the backend sees the graph; the rule gives the fake result on tpu
    # (device/_tracing_rules.py). Forward and both gradients, against CPU eager.
    monkeypatch.setenv("TORCH_TPU_STRICT", "1")
    torch._dynamo.reset()
    a_shape, b_shape, offs = _GROUPED_MM[layout]
    a, b = torch.randn(a_shape), torch.randn(b_shape)
    offs = None if offs is None else torch.tensor(offs, dtype=torch.int32)

    def loss(a, b, offs):
        return (torch.nn.functional.grouped_mm(a.tanh(), b, offs=offs) ** 2).sum()

    a_cpu, b_cpu = a.clone().requires_grad_(), b.clone().requires_grad_()
    loss(a_cpu, b_cpu, offs).backward()
    a_tpu, b_tpu = a.to("tpu").requires_grad_(), b.to("tpu").requires_grad_()
    got = torch.compile(loss, backend="tpu")(a_tpu, b_tpu, None if offs is None else offs.to("tpu"))
    got.backward()
    assert got.device.type == "tpu"
    torch.testing.assert_close(got.cpu(), loss(a, b, offs), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(a_tpu.grad.cpu(), a_cpu.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(b_tpu.grad.cpu(), b_cpu.grad, rtol=1e-5, atol=1e-5)


def test_grouped_mm_tracing_keeps_pytorchs_checks_and_other_devices():
    # On tpu the rule still refuses what the CPU kernel refuses (mixed dtypes, strides
    # off 16 bytes); on CPU tensors FakeTensorMode keeps PyTorch's own meta kernel, which
    # takes bfloat16 only (so float32 fails there under any backend, as without torch_tpu).
    from torch._subclasses.fake_tensor import FakeTensorMode

    offs = torch.tensor([2, 4, 6], dtype=torch.int32)
    a, b = torch.randn(6, 4), torch.randn(3, 4, 8)
    real = {"a": a.to("tpu"), "b": b.to("tpu"), "b16": b.to(torch.bfloat16).to("tpu"), "offs": offs.to("tpu"),
            "misaligned": torch.randn(3, 4, 5).to("tpu"), "a_cpu": a, "b_cpu": b, "offs_cpu": offs}
    mode = FakeTensorMode()
    fake = {k: mode.from_tensor(v) for k, v in real.items()}
    with mode:
        out = torch._grouped_mm(fake["a"], fake["b"], fake["offs"])
        assert (out.shape, out.dtype, out.device.type) == ((6, 8), torch.float32, "tpu")
        with pytest.raises(RuntimeError, match="share a dtype"):
            torch._grouped_mm(fake["a"], fake["b16"], fake["offs"])
        with pytest.raises(RuntimeError, match="multiple of 16 bytes"):
            torch._grouped_mm(fake["a"], fake["misaligned"], fake["offs"])
        with pytest.raises(RuntimeError, match="Expected inputs of BF16 type"):
            torch._grouped_mm(fake["a_cpu"], fake["b_cpu"], fake["offs_cpu"])


def test_out_variant_and_inplace_promotion():
    def ops(x):
        torch.add(x[0], x[1], out=x[2])
        x[3].clamp_(max=10.0)
        x.unsqueeze(0).squeeze_(0).abs_()

    _same_on_both(ops)


def test_copies_both_ways():
    src = torch.randn(3, 4)
    x = torch.empty(3, 4, device="tpu")
    x.copy_(src, non_blocking=True)
    torch.testing.assert_close(x.cpu(), src)
    back = torch.empty(4, 3)
    back.copy_(x.t())
    torch.testing.assert_close(back, src.t())
    torch.testing.assert_close(x.to(torch.float64).cpu(), src.double())
    assert x.to("cpu", non_blocking=True).device.type == "cpu"
    torch.testing.assert_close(src.t().to("tpu").cpu(), src.t())
    assert src.t().to("tpu").stride() == src.t().stride()


def test_non_blocking_copy_of_a_computed_value_lands_at_once():
    # As a CUDA copy on an idle stream: the value is there without a synchronization.
    from torch_tpu.device import _host_copies

    x = torch.randn(64, 32).to("tpu") * 3
    expected = x.cpu()  # waits: x is computed
    y = x.to("cpu", non_blocking=True)
    assert not _host_copies._pending
    torch.testing.assert_close(y, expected, rtol=0, atol=0)


@pytest.fixture
def device_still_computing(monkeypatch):
    """Every copy's source reads as not yet computed (a busy device), so non_blocking
    copies wait for a synchronization point whatever this host's timing."""
    from torch_tpu.device import _host_copies

    monkeypatch.setattr(_host_copies, "_computed", lambda job: False)


def test_non_blocking_copy_to_host_lands_at_synchronization_points(device_still_computing, monkeypatch):
    from torch_tpu.device import _host_copies

    x = torch.randn(64, 32).to("tpu")
    expected = x.cpu()
    y = x.to("cpu", non_blocking=True)
    assert y.device.type == "cpu" and y.shape == x.shape and y.stride() == x.stride()
    assert any(job.dst is y for job in _host_copies._pending)  # returned before copying
    x.add_(1)  # a later in-place write to the source: the copy keeps the earlier value
    torch.tpu.synchronize()
    assert not _host_copies._pending
    torch.testing.assert_close(y, expected, rtol=0, atol=0)

    # Into an existing tensor, with a dtype conversion and a transposed source; an Event
    # recorded after it: query() lands what is ready and turns True without synchronize().
    z = torch.empty(32, 64, dtype=torch.float64)
    z.copy_(x.t(), non_blocking=True)
    assert any(job.dst is z for job in _host_copies._pending)
    event = torch.tpu.Event()
    event.record()
    monkeypatch.setattr(_host_copies, "_computed", lambda job: job.buffer.is_ready())  # the device finishes
    deadline = time.monotonic() + 60
    while not event.query():
        assert time.monotonic() < deadline, "Event.query() never turned True"
    torch.testing.assert_close(z, (expected + 1).t().double(), rtol=0, atol=0)

    # A blocking read of any tpu value comes after earlier non_blocking copies, and a copy
    # from a tensor a pending copy writes reads the landed value (CUDA's stream order).
    w = x.to("cpu", non_blocking=True)
    x.sum().item()
    torch.testing.assert_close(w, expected + 1, rtol=0, atol=0)
    v = (x * 2).to("cpu", non_blocking=True)
    torch.testing.assert_close(v.to("tpu").cpu(), (expected + 1) * 2, rtol=0, atol=0)
    event = torch.tpu.Event()
    u = x[::2, 1].to("cpu", non_blocking=True)
    event.record()
    event.synchronize()
    torch.testing.assert_close(u, (expected + 1)[::2, 1], rtol=0, atol=0)


def test_events_and_streams_keep_no_landed_copy_alive(device_still_computing):
    # An Event (kept for later, as for elapsed_time) must not hold the copies before it:
    # their destinations and the sources' buffers (which could then not be donated).
    import weakref

    x = torch.randn(8).to("tpu")
    y = x.to("cpu", non_blocking=True)
    stream = torch.tpu.current_stream()
    assert not stream.query()  # a copy is still pending
    event = torch.tpu.Event()
    event.record()
    event.synchronize()
    assert stream.query() and event.query()
    destination = weakref.ref(y)
    del y
    assert destination() is None


def test_non_blocking_copies_to_host_are_bounded(device_still_computing, monkeypatch):
    # Copies nobody synchronizes must not pile up: past the bound the oldest lands.
    from torch_tpu.device import _host_copies

    monkeypatch.setattr(_host_copies, "_MAX_PENDING", 2)
    x = torch.arange(4.0).to("tpu")
    copies = [(x + k).to("cpu", non_blocking=True) for k in range(3)]
    assert len(_host_copies._pending) == 2
    torch.testing.assert_close(copies[0], torch.arange(4.0))  # landed without a synchronization
    torch.tpu.synchronize()
    for k, copy in enumerate(copies):
        torch.testing.assert_close(copy, torch.arange(4.0) + k)


def test_non_blocking_copy_failure_is_raised_at_synchronization(device_still_computing):
    from torch_tpu.device import _host_copies

    x = torch.arange(4.0).to("tpu") * 2
    x.to("cpu", non_blocking=True)
    _host_copies._pending[-1].buffer.delete()  # the value can no longer be read, as after a device failure
    with pytest.raises(RuntimeError, match="non_blocking copy to the host failed.*Debug mode"):
        torch.tpu.synchronize()
    assert not _host_copies._pending


def test_non_blocking_copy_to_host_waits_in_debug_mode():
    from torch_tpu.device import _host_copies

    x = torch.arange(6.0).to("tpu")
    with set_eager_mode(EagerMode.DEBUG):
        y = x.to("cpu", non_blocking=True)
        assert not _host_copies._pending
    torch.testing.assert_close(y, torch.arange(6.0))


def test_non_blocking_copy_to_device_never_waits_for_the_device(monkeypatch):
    from torch_tpu.device import _storage

    x = torch.zeros(6, 4).to("tpu")
    cpu = torch.zeros(6, 4)
    src = torch.randn(2, 4)
    row = torch.randn(4)
    originals = src.clone(), row.clone()

    def read_back(*args):
        raise AssertionError("a host -> device copy read the device value back")

    monkeypatch.setattr(_storage, "storage_to_host", read_back)
    for t in (x, cpu):
        t[1:3].copy_(src, non_blocking=True)  # a view of the storage
        t[:, 2].copy_(row[:1].double(), non_blocking=True)  # broadcast and a dtype conversion
        t.t()[3].copy_(torch.tensor(5.0), non_blocking=True)
    whole = src.to("tpu", non_blocking=True)
    src.add_(1)  # the sources may change right after the calls
    row.add_(1)
    monkeypatch.undo()
    torch.tpu.synchronize()
    torch.testing.assert_close(x.cpu(), cpu, rtol=0, atol=0)
    torch.testing.assert_close(whole.cpu(), originals[0], rtol=0, atol=0)
    assert cpu[1, 0] == originals[0][0, 0] and cpu[0, 2] == originals[1][0]


def test_device_mismatch_error():
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device, but found at least two devices, tpu:0 and cpu!"):
        torch.ones(2, device="tpu") + torch.ones(2)
    # A 0-d CPU tensor mixes with device tensors, as on CUDA.
    torch.testing.assert_close((torch.ones(2, device="tpu") * torch.tensor(3.0)).cpu(), torch.full((2,), 3.0))


# -- ops ------------------------------------------------------------------------------
def test_python_scalars_are_runtime_operands():
    def plans():
        return sum(1 for key in _ops._PLANS if key[0] in (torch.ops.aten.mul.Tensor, torch.ops.aten.add.Tensor))

    x = torch.randn(16, device="tpu")
    y = x * 0.5 + 1  # one plan per (op, scalar kind): float for mul, int for add
    compiles = plans()
    for step in range(1, 6):
        y = x * (step + 0.25) + step
        torch.testing.assert_close(y.cpu(), x.cpu() * (step + 0.25) + step)
    assert plans() == compiles


def test_data_dependent_shapes(monkeypatch):
    monkeypatch.setenv("TORCH_TPU_STRICT", "1")
    c = torch.tensor([0.0, 2.0, 0.0, -1.0, 3.0])
    t = c.to("tpu")
    torch.testing.assert_close(torch.nonzero(t).cpu(), torch.nonzero(c))
    torch.testing.assert_close(t[t > 0].cpu(), c[c > 0])
    torch.testing.assert_close(torch.masked_select(t, t < 1).cpu(), torch.masked_select(c, c < 1))
    torch.testing.assert_close(torch.unique(t).cpu(), torch.unique(c))


def test_unlowered_op_falls_back_and_strict_names_op_and_line(monkeypatch, caplog):
    c = torch.tensor([1.0, 2.0, -3.0, 8.0])
    halved = halve_on_cpu_only(c.to("tpu"))
    assert halved.device.type == "tpu"
    torch.testing.assert_close(halved.cpu(), c / 2)
    monkeypatch.setenv("TORCH_TPU_STRICT", "1")
    with pytest.raises(RuntimeError, match=r"torchtpu_test.halve_on_cpu_only.default at .*test_device_basics.py:\d+ .*TORCH_TPU_STRICT=1"):
        halve_on_cpu_only(c.to("tpu"))


def test_second_process_compiles_nothing(tmp_path):
    script = """
        import torch
        from torch_tpu.runtime import get_client
        x = torch.arange(12.0, device="tpu").reshape(3, 4)
        y = (x * 2 + 1).sum(0).relu()
        print(y.cpu().tolist())
        print("compiles", get_client().cache.stats.compiles)
    """
    env = {"TORCH_TPU_CACHE_L2": "1", "TORCH_TPU_CACHE_DIR": str(tmp_path)}
    first, second = _run(script, **env), _run(script, **env)
    assert first.returncode == 0 and second.returncode == 0, first.stderr + second.stderr
    assert first.stdout.splitlines()[0] == second.stdout.splitlines()[0]
    assert int(first.stdout.split()[-1]) > 0
    assert second.stdout.split()[-1] == "0"


# -- modes ----------------------------------------------------------------------------
@pytest.mark.strict_only("checks the default mode and switching away from it")
def test_modes_global_and_scoped():
    assert get_eager_mode() is EagerMode.STRICT
    with set_eager_mode(EagerMode.DEBUG):
        assert get_eager_mode() is EagerMode.DEBUG
        torch.testing.assert_close((torch.ones(2, device="tpu") + 1).cpu(), torch.full((2,), 2.0))
    assert get_eager_mode() is EagerMode.STRICT
    set_eager_mode(EagerMode.DEBUG)
    try:
        assert get_eager_mode() is EagerMode.DEBUG
    finally:
        set_eager_mode(EagerMode.STRICT)
    with set_eager_mode(EagerMode.FUSED):
        assert get_eager_mode() is EagerMode.FUSED
        y = torch.ones(2, device="tpu") + 1
    # Leaving FUSED mode ran the recorded op.
    from torch_tpu.device._buffers import Pending, entry_of

    assert get_eager_mode() is EagerMode.STRICT and type(entry_of(y)._buffer) is not Pending
    torch.testing.assert_close(y.cpu(), torch.full((2,), 2.0))
    assert torch_tpu.EagerMode is EagerMode and torch_tpu.get_eager_mode() is EagerMode.STRICT


@pytest.mark.strict_only("checks how the environment selects the mode")
def test_launch_blocking_env_selects_debug():
    out = _run("import torch_tpu; print(torch_tpu.get_eager_mode().name)", TPU_LAUNCH_BLOCKING="1")
    assert out.stdout.strip() == "DEBUG", out.stderr


@pytest.mark.strict_only("checks how the environment selects the mode")
def test_defer_and_fuse_env_selects_fused():
    out = _run("import torch_tpu; print(torch_tpu.get_eager_mode().name)", TORCH_TPU_DEFER_AND_FUSE="1")
    assert out.stdout.strip() == "FUSED", out.stderr


# -- torch.tpu ---------------------------------------------------------------------------
def test_memory_stats_follow_storages():
    import gc

    gc.collect()
    before = torch.tpu.memory_allocated()
    x = torch.empty(1000, device="tpu")
    assert torch.tpu.memory_allocated() == before + 4000
    assert torch.tpu.max_memory_allocated() >= before + 4000
    del x
    gc.collect()
    assert torch.tpu.memory_allocated() == before
    torch.tpu.reset_peak_memory_stats()
    assert torch.tpu.max_memory_allocated() == before
    assert torch.tpu.memory_stats()["allocated_bytes.all.current"] == before
    torch.tpu.empty_cache()


@pytest.mark.parametrize("mode", [EagerMode.STRICT, EagerMode.FUSED])
def test_untyped_storage_resize_frees_and_regrows_in_place(mode):
    """FSDP2's free_storage / alloc_storage: `untyped_storage().resize_` on tpu storages
    (PyTorch sends it to a PrivateUse1 hook Python cannot implement) behaves like a CPU
    storage's: same storage object and views, prefix kept, new bytes zero here, 0 frees."""
    import gc

    previous = get_eager_mode()
    set_eager_mode(mode)
    try:
        gc.collect()
        before = torch.tpu.memory_allocated()
        full = torch.arange(6.0, device="tpu") * 2  # FUSED: still pending when resized
        view = full[2:]
        doubled = full * 2  # FUSED: reads the storage after it is freed, at the flush
        storage = full.untyped_storage()
        storage.resize_(0)
        assert storage.nbytes() == 0 and full.untyped_storage().nbytes() == 0
        assert doubled.cpu().tolist() == [0.0, 4.0, 8.0, 12.0, 16.0, 20.0]
        del doubled
        gc.collect()
        assert torch.tpu.memory_allocated() == before
        assert storage.resize_(24) is storage and view.untyped_storage().nbytes() == 24
        assert torch.tpu.memory_allocated() == before + 24
        full.copy_(torch.arange(6.0, device="tpu") + 1)  # views see writes after re-growth
        assert view.cpu().tolist() == [3.0, 4.0, 5.0, 6.0]
        storage.resize_(32)  # the kept prefix, then uninitialised bytes
        assert torch.empty(0, device="tpu").set_(storage, 0, (6,), (1,)).cpu().tolist() == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
        storage.resize_(8)
        assert torch.empty(0, device="tpu").set_(storage, 0, (2,), (1,)).cpu().tolist() == [1.0, 2.0]
        cpu = torch.arange(3.0).untyped_storage()  # other devices keep PyTorch's resize_
        cpu.resize_(4)
        assert cpu.nbytes() == 4 and torch.empty(0).set_(cpu, 0, (1,), (1,)).item() == 0.0
        del full, view, storage
        gc.collect()
        assert torch.tpu.memory_allocated() == before
    finally:
        set_eager_mode(previous)


def test_seed_streams_events_device_context():
    torch.tpu.manual_seed(123)
    a = torch.randn(4, device="tpu").cpu()
    torch.tpu.manual_seed(123)
    b = torch.randn(4, device="tpu").cpu()
    torch.testing.assert_close(a, b)
    assert torch.tpu.initial_seed() == 123
    state = torch.tpu.get_rng_state()
    c = torch.rand(3, device="tpu").cpu()
    torch.tpu.set_rng_state(state)
    torch.testing.assert_close(torch.rand(3, device="tpu").cpu(), c)
    s = torch.tpu.Stream(priority=-1)
    e = s.record_event()
    e.synchronize()
    torch.tpu.current_stream().wait_stream(s)
    with torch.tpu.device(0):
        assert torch.tpu.current_device() == 0
    torch.tpu.set_device("tpu:0")
    torch.tpu.synchronize()


# -- bad input ----------------------------------------------------------------------------
def test_deleted_buffer_is_a_clear_error():
    from torch_tpu.device._buffers import entry_of

    x = torch.ones(3, device="tpu") * 2
    entry_of(x).buffer.delete()
    with pytest.raises(RuntimeError, match="device buffer was deleted"):
        x.cpu()
    with pytest.raises(RuntimeError, match="device buffer was deleted"):
        x + 1


def test_lazy_conjugation_reaches_the_host():
    # ifft of a real signal returns a lazily conjugated tensor (regression: .cpu() read
    # the unconjugated storage).
    c = torch.randn(6)
    torch.testing.assert_close(torch.fft.ifft(c.to("tpu")).cpu(), torch.fft.ifft(c))
    z = torch.randn(4, dtype=torch.complex64)
    t = z.to("tpu").conj()
    torch.testing.assert_close(t.cpu(), z.conj())
    torch.testing.assert_close((t * 2).cpu(), z.conj() * 2)
    torch.testing.assert_close(t.clone().cpu(), z.conj())


def test_constant_scalars_are_decided_per_signature():
    # An integer tensor times a float needs the float as a constant (a 0-d f64 operand
    # would promote to float64); float tensors keep run-time scalars afterwards.
    i = torch.arange(4, device="tpu")
    torch.testing.assert_close((i * 0.5).cpu(), torch.arange(4) * 0.5)
    x = torch.randn(8, device="tpu")

    def plans():
        return sum(1 for key in _ops._PLANS if key[0] is torch.ops.aten.mul.Tensor)

    x * 0.1
    before = plans()
    for lr in (0.2, 0.3, 0.4):
        torch.testing.assert_close((x * lr).cpu(), x.cpu() * lr)
    assert plans() == before


@pytest.mark.parametrize("write", ["copy_from_host", "copy_on_device", "add_", "fill_", "mul_out"])
def test_writes_into_overlapping_views_raise_pytorchs_error(write):
    # An expanded view's elements share memory: PyTorch's kernels refuse to write it (the
    # value would depend on the order of the writes), but for fill_; the device does what
    # the CPU does, never keeps a last-writer-wins value.
    def do(t, src):
        view = t.expand(4, 3)
        if write == "copy_from_host":
            view.copy_(src.cpu())
        elif write == "copy_on_device":
            view.copy_(src)
        elif write == "add_":
            view.add_(src)
        elif write == "fill_":
            view.fill_(2.0)
        else:
            torch.mul(src, 2, out=view)

    results = []
    for device in ("cpu", "tpu"):
        t = torch.zeros(1, 3, device=device)
        src = torch.arange(12.0).reshape(4, 3).to(device)
        if write == "fill_":  # PyTorch's fill_ takes overlapping views
            do(t, src)
            results.append(t.cpu())
            continue
        with pytest.raises(RuntimeError, match="more than one element of the written-to tensor"):
            do(t, src)
        assert torch.equal(t.cpu(), torch.zeros(1, 3))
    if results:
        assert torch.equal(results[0], results[1]) and torch.equal(results[0], torch.full((1, 3), 2.0))


def test_complex_views_write_through():
    # view_as_real / view_as_complex / .real / .imag are views on the device as on CPU:
    # writes through them reach the tensor (an Adam step on a complex parameter).
    results = {}
    for device in ("cpu", "tpu"):
        t = torch.arange(6, dtype=torch.float32).reshape(3, 2).to(device)
        c = torch.view_as_complex(t)
        c.mul_(2j)
        r = torch.zeros(3, dtype=torch.complex64, device=device)
        r.imag.fill_(5)
        r.real.add_(1)
        torch.view_as_real(r)[0, 0] = 7
        assert torch.view_as_real(r).untyped_storage().data_ptr() == r.untyped_storage().data_ptr()
        torch.manual_seed(0)
        p = torch.nn.Parameter(torch.randn(3, dtype=torch.complex64).to(device))
        opt = torch.optim.Adam([p], lr=0.1, foreach=False)
        (p.abs() ** 2).sum().backward()
        opt.step()
        results[device] = [v.detach().cpu() for v in (t, r, c * c, p)]
    for got, want in zip(results["tpu"], results["cpu"]):
        torch.testing.assert_close(got, want)


def test_non_blocking_copy_to_host_keeps_an_empty_tensors_strides():
    x = torch.randn(3, 4, 5)
    for view in (lambda t: t[:, :0], lambda t: t[:0].permute(2, 0, 1)):
        y = view(x.to("tpu")).to("cpu", non_blocking=True)
        torch.tpu.synchronize()
        assert y.shape == view(x).shape and y.stride() == view(x).to("cpu", copy=True).stride()
