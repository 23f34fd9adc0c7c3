"""Run-time failures of device ops (issue 13): in Debug mode every op waits for its
result, so a failure is raised at the Python line of the op that failed, naming the op
and its arguments; out-of-memory raises the runtime's DeviceOutOfMemoryError naming the
op and sizes; a deleted (freed or donated) buffer is a clear error. XLA:CPU neither runs
out of memory nor fails at run time on demand: the failures are injected where the
runtime reports them (jaxlib raising the PjRT status)."""

import inspect

import pytest
import torch

import torch_tpu.device  # noqa: F401 - registers the device where autoload is off
from torch_tpu.device import EagerMode, set_eager_mode
from torch_tpu.device import _ops
from torch_tpu.runtime import _jaxlib
from torch_tpu.runtime.errors import BufferDeletedError, DeviceOutOfMemoryError, ExecutionError


def _next_line() -> int:
    return inspect.currentframe().f_back.f_lineno + 1


def _fail_when_waited(monkeypatch, status: str):
    def block_until_ready(array):
        raise _jaxlib.JaxRuntimeError(status)

    monkeypatch.setattr(_jaxlib, "array_block_until_ready", block_until_ready)


def test_debug_mode_raises_at_the_failing_op_line(monkeypatch):
    x = torch.randn(4, 3, device="tpu")
    torch.exp(x)  # planned and compiled before the failure is injected
    _fail_when_waited(monkeypatch, "INTERNAL: injected execution failure")
    with set_eager_mode(EagerMode.DEBUG):
        line = _next_line()
        with pytest.raises(ExecutionError) as info:
            torch.exp(x)
    message = str(info.value)
    assert f"aten.exp.default at {__file__}:{line + 1}" in message
    assert "float32[4, 3] on tpu:0 (48 bytes)" in message
    assert "injected execution failure" in message
    assert "TPU_LAUNCH_BLOCKING" not in message  # Debug mode already names the op's line


@pytest.mark.parametrize("status, error", [
    ("INTERNAL: injected execution failure", ExecutionError),
    ("RESOURCE_EXHAUSTED: Out of memory while trying to allocate 64 bytes.", DeviceOutOfMemoryError),
])
@pytest.mark.parametrize("write", ["in_place", "out"])
def test_debug_mode_keeps_a_written_ops_own_failure(monkeypatch, status, error, write):
    """An in-place / out= op donates the written storage's buffer to the program: a
    failure seen while waiting is the program's error, not a "deleted buffer" one."""
    x, y = torch.randn(16, device="tpu"), torch.randn(16, device="tpu")
    out = torch.empty(16, device="tpu")
    x.add_(y), torch.add(x, y, out=out)  # planned and compiled before the failure is injected
    _fail_when_waited(monkeypatch, status)
    with set_eager_mode(EagerMode.DEBUG):
        with pytest.raises(error, match=status.split(": ", 1)[1][:20]):
            if write == "in_place":
                x.add_(y)
            else:
                torch.add(x, y, out=out)


def test_strict_mode_reports_the_failure_when_the_value_is_read(monkeypatch):
    x = torch.randn(4, device="tpu")
    torch.exp(x)
    _fail_when_waited(monkeypatch, "INTERNAL: injected execution failure")
    with set_eager_mode(EagerMode.STRICT):
        y = torch.exp(x)  # enqueued: Strict mode does not wait
        monkeypatch.setattr(_jaxlib, "buffer_to_dlpack", lambda *a: (_ for _ in ()).throw(
            _jaxlib.JaxRuntimeError("INTERNAL: injected execution failure")))
        with pytest.raises(RuntimeError, match="injected execution failure"):
            y.cpu()


def _fail_on_execute(monkeypatch, op, args, status: str):
    plan, _, _ = _ops.plan_for(op, args, {})

    def runner(arrays):
        raise _jaxlib.JaxRuntimeError(status)

    monkeypatch.setattr(plan.executable, "_runner", runner)


@pytest.mark.parametrize("mode", [EagerMode.STRICT, EagerMode.DEBUG])
def test_out_of_memory_names_op_and_sizes(monkeypatch, mode):
    a = torch.randn(64, 32, device="tpu")
    b = torch.randn(32, 16, device="tpu")
    torch.mm(a, b)
    _fail_on_execute(monkeypatch, torch.ops.aten.mm.default, (a, b),
                     "RESOURCE_EXHAUSTED: Out of memory while trying to allocate 4096 bytes.")
    with set_eager_mode(mode):
        line = _next_line()
        with pytest.raises(DeviceOutOfMemoryError) as info:
            torch.mm(a, b)
    message = str(info.value)
    assert isinstance(info.value, MemoryError)
    assert f"aten.mm.default at {__file__}:{line + 1} ran out of device memory" in message
    assert "float32[64, 32] on tpu:0 (8192 bytes), float32[32, 16] on tpu:0 (2048 bytes)" in message
    assert "trying to allocate 4096 bytes" in message
    assert "smaller batches" in message  # the runtime's advice survives


def test_deleted_buffer_names_the_op_and_line():
    from torch_tpu.device._buffers import entry_of

    x = torch.ones(3, device="tpu") * 2
    entry_of(x).buffer.delete()
    line = _next_line()
    with pytest.raises(BufferDeletedError) as info:
        x + 1
    message = str(info.value)
    assert f"aten.add.Tensor at {__file__}:{line + 1} failed" in message
    assert "device buffer was deleted (freed or donated)" in message
    line = _next_line()
    with pytest.raises(BufferDeletedError, match=rf"at {__file__}:{line + 1}, a tpu tensor's device buffer"):
        x.cpu()


def test_a_launch_refused_for_a_buffer_another_thread_rebound_reads_again(monkeypatch):
    """Another thread's in-place op may donate a storage's buffer between this op's read
    and its launch (and rebind the storage right after): PjRT's refusal is not an error
    of this op, which reads the storage again, as on CPU (where it sees either value)."""
    # Two tensor operands (no Python number, whose plan may differ from the op's) of a
    # shape no other test uses: `plan_for` finds the very plan `x * y` runs.
    x, y = torch.arange(7.0, device="tpu"), torch.full((7,), 2.0, device="tpu")
    torch.mul(x, y)
    plan, _, _ = _ops.plan_for(torch.ops.aten.mul.Tensor, (x, y), {})
    real = plan.executable._runner
    refusals = [1]

    def once_refused(arrays):
        if refusals[0]:
            refusals[0] -= 1
            raise _jaxlib.JaxRuntimeError("INVALID_ARGUMENT: Buffer has been deleted or donated.")
        return real(arrays)

    monkeypatch.setattr(plan.executable, "_runner", once_refused)
    torch.testing.assert_close((x * y).cpu(), torch.arange(7.0) * 2)
    assert refusals == [0]


def test_a_storage_that_stays_deleted_is_named_after_the_retries(monkeypatch):
    x, y = torch.arange(7.0, device="tpu"), torch.full((7,), 2.0, device="tpu")
    torch.mul(x, y)
    plan, _, _ = _ops.plan_for(torch.ops.aten.mul.Tensor, (x, y), {})
    tries = []

    def always_refused(arrays):
        tries.append(1)
        raise _jaxlib.JaxRuntimeError("INVALID_ARGUMENT: Buffer has been deleted or donated.")

    monkeypatch.setattr(plan.executable, "_runner", always_refused)
    with pytest.raises(RuntimeError, match="aten.mul.Tensor"):
        x * y
    assert len(tries) == _ops._REBOUND_RETRIES + 1
