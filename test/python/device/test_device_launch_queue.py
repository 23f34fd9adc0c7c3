"""Strict mode's launch thread (issue 28, `runtime/launch_queue.py`): eager ops hand their
launch to one thread and return pending outputs. Results equal synchronous launches; a
failure surfaces at the next point that waits, naming the op and its line; every reader
of a pending value waits for it; Debug mode and TORCH_TPU_LAUNCH_THREAD=0 never queue.

Launches are held back on purpose by a runner that waits for an Event (`_held`), so
"still queued" is a state the test controls, not a race it hopes to win. Each test uses
shapes of its own: a plan (and its executable's runner) is shared by every op of the
same signature."""

import inspect
import os
import random
import subprocess
import sys
import textwrap
import threading

import pytest
import torch

import torch_tpu.device  # noqa: F401 - registers the device where autoload is off
from torch_tpu.device import EagerMode, _modes, _ops, set_eager_mode
from torch_tpu.device._buffers import entry_of
from torch_tpu.runtime import _jaxlib
from torch_tpu.runtime.errors import ExecutionError
from torch_tpu.runtime.launch_queue import QUEUE


def _next_line() -> int:
    return inspect.currentframe().f_back.f_lineno + 1


@pytest.fixture(autouse=True)
def _drained():
    torch.tpu.synchronize()
    yield
    try:
        torch.tpu.synchronize()
    finally:
        QUEUE.failure = None  # a test's own injected failure never reaches the next test


@pytest.fixture
def launch_thread_off():
    saved = _modes._launch_thread[0]
    _modes._launch_thread[0] = False
    yield
    _modes._launch_thread[0] = saved


def _held(monkeypatch, op, args) -> threading.Event:
    """Holds every launch of `op`'s plan for `args` until the returned Event is set."""
    plan, _, _ = _ops.plan_for(op, args, {})
    torch.tpu.synchronize()  # the warm-up launch runs with the real runner
    real = plan.executable._runner
    release = threading.Event()

    def runner(arrays):
        assert release.wait(30), "the test never released the held launch"
        return real(arrays)

    monkeypatch.setattr(plan.executable, "_runner", runner)
    return release


def _release_later(event: threading.Event, seconds: float = 0.2) -> threading.Timer:
    timer = threading.Timer(seconds, event.set)
    timer.start()
    return timer


def _pending(t: torch.Tensor) -> bool:
    return entry_of(t)._buffer.is_pending


# -- results --------------------------------------------------------------------------------
_UNARY = [torch.sin, torch.exp, torch.tanh, lambda t: t * 0.5, lambda t: t + 1, torch.neg]
_IN_PLACE = [lambda t: t.add_(1.5), lambda t: t.mul_(0.75), lambda t: t.clamp_(-2, 2), lambda t: t.sub_(0.25)]
_VIEWS = [lambda t: t.t(), lambda t: t[1:, :], lambda t: t[:, ::2], lambda t: t.reshape(-1)]


def _program(seed: int, device: str) -> list[torch.Tensor]:
    """A random sequence of functional, in-place and view ops (in-place ops through views
    too) on a few tensors; returns every tensor's final value on the host."""
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    values = [torch.randn(6, 8, generator=gen).to(device) for _ in range(3)]
    for _ in range(60):
        kind = rng.choice(["unary", "binary", "in_place", "view_write"])
        i = rng.randrange(len(values))
        if kind == "unary":
            values[i] = rng.choice(_UNARY)(values[i])
        elif kind == "binary":
            values[i] = values[i] + values[rng.randrange(len(values))] * 0.5
        elif kind == "in_place":
            rng.choice(_IN_PLACE)(values[i])
        else:
            view = rng.choice(_VIEWS)(values[i])
            view.mul_(0.5).add_(0.125)  # writes the base through the view
    return [v.cpu() for v in values]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_random_op_sequence_matches_synchronous_launches_and_cpu(seed, launch_thread_off):
    synchronous = _program(seed, "tpu")
    _modes._launch_thread[0] = True
    queued = _program(seed, "tpu")
    expected = _program(seed, "cpu")
    for q, s, e in zip(queued, synchronous, expected):
        torch.testing.assert_close(q, s, rtol=0, atol=0)
        torch.testing.assert_close(q, e, rtol=1e-5, atol=1e-5)


def test_ops_return_pending_outputs_and_a_host_read_waits_for_them(monkeypatch):
    x = torch.arange(11.0, device="tpu")
    x * 3
    release = _held(monkeypatch, torch.ops.aten.mul.Tensor, (x, 3))
    y = x * 3
    z = y + 1  # queued behind the held launch, reading its pending output
    assert _pending(y) and _pending(z)
    _release_later(release)
    torch.testing.assert_close(z.cpu(), torch.arange(11.0) * 3 + 1)  # waits for both launches
    assert not _pending(y)


def test_a_compiled_program_takes_a_pending_eager_output(monkeypatch):
    x = torch.arange(12.0, device="tpu").reshape(3, 4)
    x.exp()
    release = _held(monkeypatch, torch.ops.aten.exp.default, (x,))
    y = x.exp()
    assert _pending(y)
    compiled = torch.compile(lambda t: (t * 2).sum(dim=0), backend="tpu")
    _release_later(release)
    torch.testing.assert_close(compiled(y).cpu(), (torch.arange(12.0).reshape(3, 4).exp() * 2).sum(dim=0))


def test_an_in_place_op_on_a_buffer_a_queued_launch_reads_keeps_that_read(monkeypatch):
    """The queue holds arrays, not buffers: the in-place op may donate `x`'s buffer, and
    the FIFO order launches the held reader first -- in Debug mode too, whose
    synchronous donation waits for the queued readers."""
    x = torch.arange(13.0, device="tpu")
    x * 2
    release = _held(monkeypatch, torch.ops.aten.mul.Tensor, (x, 2))
    y = x * 2
    x.add_(100)
    _release_later(release)
    with set_eager_mode(EagerMode.DEBUG):
        x.add_(1000)
    torch.testing.assert_close(y.cpu(), torch.arange(13.0) * 2)
    torch.testing.assert_close(x.cpu(), torch.arange(13.0) + 1100)


# -- failures -------------------------------------------------------------------------------
def _failing(monkeypatch, op, args, status="INTERNAL: injected launch failure"):
    plan, _, _ = _ops.plan_for(op, args, {})
    torch.tpu.synchronize()  # the warm-up launch runs with the real runner

    def runner(arrays):
        raise _jaxlib.JaxRuntimeError(status)

    monkeypatch.setattr(plan.executable, "_runner", runner)


def test_a_failed_launch_is_raised_at_the_next_sync_naming_the_op_and_line(monkeypatch):
    x = torch.ones(14, device="tpu")
    torch.exp(x)
    _failing(monkeypatch, torch.ops.aten.exp.default, (x,))
    line = _next_line()
    y = torch.exp(x)  # returns: the failure happens on the launch thread
    with pytest.raises(ExecutionError) as info:
        torch.tpu.synchronize()
    message = str(info.value)
    assert f"aten.exp.default at {__file__}:{line}" in message
    assert "injected launch failure" in message
    assert "TPU_LAUNCH_BLOCKING=1" in message
    # Raised once; the queue goes on: later ops run, and the failed value raises when read.
    torch.tpu.synchronize()
    torch.testing.assert_close((x + 2).cpu(), torch.full((14,), 3.0))
    with pytest.raises(ExecutionError, match=f"aten.exp.default at {__file__}:{line}"):
        y.cpu()


def test_a_failed_launch_is_raised_by_the_next_op_not_claimed_by_it(monkeypatch):
    x = torch.ones(15, device="tpu")
    torch.exp(x)
    _failing(monkeypatch, torch.ops.aten.exp.default, (x,))
    line = _next_line()
    torch.exp(x)
    QUEUE.quiesce()  # the launch thread has failed it
    with pytest.raises(ExecutionError) as info:
        x + 1
    assert f"aten.exp.default at {__file__}:{line}" in str(info.value)
    assert "aten.add" not in str(info.value)


def test_ops_reading_a_failed_output_fail_with_the_same_error_once(monkeypatch):
    x = torch.ones(16, 2, device="tpu")
    torch.exp(x)
    _failing(monkeypatch, torch.ops.aten.exp.default, (x,))
    line = _next_line()
    y = torch.exp(x)
    QUEUE.quiesce()
    with pytest.raises(ExecutionError, match=f"aten.exp.default at {__file__}:{line}"):
        y * 2  # the next op raises the failure
    z = y * 2  # reported: queued, and fails with the exp's error (its argument is never computed)
    assert "failed" in repr(entry_of(y)._buffer)
    with pytest.raises(ExecutionError, match=f"aten.exp.default at {__file__}:{line}"):
        z.cpu()
    torch.tpu.synchronize()  # already reported by the read: not again


# -- where launches are not queued ------------------------------------------------------------
def test_debug_mode_never_queues(monkeypatch):
    x = torch.ones(17, device="tpu")
    enqueued = []
    monkeypatch.setattr(QUEUE, "enqueue", enqueued.append)
    with set_eager_mode(EagerMode.DEBUG):
        y = (x + 1).exp()
        x.mul_(2)
    assert enqueued == [] and not _pending(y)
    torch.testing.assert_close(y.cpu(), torch.full((17,), 2.0).exp())


def test_the_switch_off_launches_on_the_caller(monkeypatch, launch_thread_off):
    x = torch.ones(18, device="tpu")
    torch.tpu.synchronize()
    enqueued = []
    monkeypatch.setattr(QUEUE, "enqueue", enqueued.append)
    y = (x + 1).exp()
    x.mul_(2)
    assert enqueued == [] and not _pending(y)
    torch.testing.assert_close(x.cpu(), torch.full((18,), 2.0))


def test_synchronize_drains_the_queue(monkeypatch):
    x = torch.ones(19, device="tpu")
    x + 1
    release = _held(monkeypatch, torch.ops.aten.add.Tensor, (x, 1))
    y = x + 1
    assert not QUEUE.idle()
    _release_later(release)
    torch.tpu.synchronize()
    assert QUEUE.idle() and not _pending(y)


# -- process lifetime -----------------------------------------------------------------------
def test_the_queue_drains_before_fork_and_the_child_starts_empty(monkeypatch):
    x = torch.ones(20, device="tpu")
    x + 1
    release = _held(monkeypatch, torch.ops.aten.add.Tensor, (x, 1))
    y = x + 1
    _release_later(release)
    read, write = os.pipe()
    pid = os.fork()  # the before-fork hook waits for the held launch
    if pid == 0:
        try:
            ok = QUEUE.idle() and QUEUE._thread is None and not _pending(y)
            QUEUE.drain()  # nothing to wait for, no dead thread to wait on
            os.write(write, b"1" if ok else b"0")
        finally:
            os._exit(0)
    os.close(write)
    answer = os.read(read, 1)
    os.waitpid(pid, 0)
    assert answer == b"1"
    assert not _pending(y)


def test_launches_still_queued_at_exit_run():
    script = textwrap.dedent("""
        import time
        import torch
        import torch_tpu.device
        from torch_tpu.device import _ops
        x = torch.ones(21, device="tpu")
        torch.tpu.synchronize()
        plan, _, _ = _ops.plan_for(torch.ops.aten.exp.default, (x,), {})
        real = plan.executable._runner
        def slow(arrays):
            time.sleep(0.5)
            print("launched", flush=True)
            return real(arrays)
        plan.executable._runner = slow
        torch.exp(x)
        print("returned", flush=True)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["returned", "launched"]


def test_backpressure_bounds_the_queue():
    from torch_tpu.runtime.launch_queue import Launch, LaunchQueue

    q = LaunchQueue(depth=4)
    release = threading.Event()
    ran = []

    def run(arrays):
        release.wait(30)
        ran.append(1)
        return []

    enqueued = []

    def producer():
        for _ in range(10):
            q.enqueue(Launch(run, []))
            enqueued.append(1)

    thread = threading.Thread(target=producer)
    thread.start()
    thread.join(0.5)
    assert thread.is_alive() and len(enqueued) == q.depth  # the fifth waits for the oldest
    release.set()
    thread.join(30)
    q.drain()
    assert len(ran) == 10
