"""One launch thread per process: program launches handed over in order, so the caller
returns as soon as its output buffers exist and its next Python work overlaps PjRT's
launch of the previous program (the eager device's Strict mode; `Executable.buffer_launcher`).

A queued launch's outputs are *pending* DeviceBuffers: shape, element type and device are
known from the program's signature; their value is `(launch, k)` until a reader takes
output k of the launch's `results`. A DeviceBuffer hands out its array through one
accessor (`DeviceBuffer._array`), which waits for that launch: no reader outside the
launch thread can see an unfilled array (host reads, other programs' arguments, DLPack,
copies, deletion all go through it). The launch thread writes no DeviceBuffer, and reads
only results of launches before its current one (the queue is FIFO).

Why a thread helps: PjRT's `execute_sharded` releases the GIL while it launches (measured
on XLA:CPU: a Python thread kept counting at ~60% of its solo rate during 28 ms launches
of a matmul program, on 2 cores shared with XLA's own threads).

Errors: a launch that fails is kept (the first one) with what the enqueuer said about it
(`context`: the op and the user's line) and raised at the next point that waits -- a
wait for a buffer, `drain()`, or the next `enqueue` -- as CUDA reports an asynchronous
error at the next synchronizing call. Outputs of a failed launch stay failed: reading one
raises that failure, and a later launch that takes one as argument fails with it.

No deadlock: the enqueuer never holds a lock the launch thread needs while it waits (the
condition is released by `wait`), and the launch thread runs no enqueuer code. The
queue is bounded (`DEPTH` launches): an enqueuer past it waits for the oldest, so memory
held by queued arguments stays bounded. The thread is a daemon; the queue is drained at
interpreter exit and before `os.fork` (a child starts with an empty queue and no thread).
"""

from __future__ import annotations

import atexit
import itertools
import logging
import os
import queue
import threading
from collections.abc import Callable, Sequence
from typing import Any

log = logging.getLogger(__name__)

# Launches that may wait in the queue before `enqueue` waits for the oldest: deep enough
# to hide launch latency behind a long run of small ops, shallow enough that the buffers
# queued launches keep alive (arguments, donated inputs) stay few.
DEPTH = 128


class Launch:
    """One queued launch: `run(arrays)` returns its output arrays (`results` once run).

    `arguments` are what `run` reads, each taken when the launch was enqueued: a jaxlib
    array, or `(launch, k)` for output k of an earlier queued launch (resolved when this one
    runs, after that one). The queue holds no DeviceBuffer, so holding a launch never
    makes a buffer look shared (the eager device donates a buffer only when nothing else
    references it). A pending DeviceBuffer's value is `(launch, k)` too.

    `context` describes the launch for an error message: `describe(error, context)` (the
    enqueuer's) turns a failure into the exception to raise (with the op and its line)."""

    __slots__ = ("number", "run", "arguments", "context", "describe", "done", "results", "error")

    def __init__(self, run: Callable[[list[Any]], Sequence[Any]], arguments: list[Any], context: Any = None,
                 describe: Callable[[BaseException, Any], BaseException] | None = None) -> None:
        self.run = run
        self.arguments = arguments
        self.context = context
        self.describe = describe
        self.done = False
        self.results: Sequence[Any] | None = None
        self.error: BaseException | None = None
        self.number = 0


def resolve(argument: Any) -> Any:
    """The array of a launch argument (on the launch thread: its producer ran already)."""
    if argument.__class__ is not tuple:
        return argument
    producer, k = argument
    if producer.results is None:
        raise _Upstream(producer.error)
    return producer.results[k]


class _Upstream(Exception):
    """An argument of a launch is an output of an earlier launch that failed: this launch
    fails with that launch's error (the one failure the user must see, reported once)."""

    def __init__(self, error: BaseException | None) -> None:
        super().__init__(error)
        self.error = error


class LaunchQueue:
    def __init__(self, depth: int = DEPTH) -> None:
        self.depth = depth
        self._reset()

    def _reset(self) -> None:
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()  # (C put/get: the hot path)
        self._order = threading.Lock()  # numbers and puts in one order (enqueuers on several threads)
        self._numbers = itertools.count(1)
        self._changed = threading.Condition(threading.Lock())
        self._waiters = 0  # threads in `_wait_until`: the launch thread notifies only then
        self._finished = 0  # launches run (or failed), all in order: a single writer
        self._enqueued = 0
        self._last: Launch | None = None
        self.failure: BaseException | None = None  # the first failure not yet raised
        self._thread: threading.Thread | None = None

    # -- enqueuer side ----------------------------------------------------------------------

    def enqueue(self, launch: Launch) -> None:
        """Hands `launch` to the launch thread (its outputs already made pending by the
        caller). Raises a failure of an earlier launch first, never this one's."""
        if self.failure is not None:
            self.raise_failure()
        if self._thread is None:
            self._start()
        order = self._order
        order.acquire()
        try:
            launch.number = number = next(self._numbers)
            self._enqueued = number
            self._last = launch
            self._jobs.put(launch)
        finally:
            order.release()
        if number - self._finished > self.depth:
            # Backpressure: wait for the oldest launch beyond the bound.
            self._wait_until(lambda: number - self._finished <= self.depth)

    def is_launch_thread(self) -> bool:
        return threading.current_thread() is self._thread

    def wait_for(self, launch: Launch) -> None:
        """Waits until `launch` ran (every launch before it too); raises nothing itself:
        `launch.results` or `launch.error` says how it went."""
        if launch.done:
            return
        if self.is_launch_thread():
            raise RuntimeError(
                "torch_tpu: internal error: the launch thread read an output of a launch queued after the "
                "one it runs; set TORCH_TPU_LAUNCH_THREAD=0 and report this to torch_tpu")
        self._wait_until(lambda: launch.done)

    def drain(self) -> None:
        """Waits for every queued launch, then raises the first failure not yet raised."""
        last = self._last
        if last is not None and not last.done and not self.is_launch_thread():
            self._wait_until(lambda: last.done)
        if self.failure is not None:
            self.raise_failure()

    def idle(self) -> bool:
        last = self._last
        return last is None or last.done

    def raise_failure(self) -> None:
        failure, self.failure = self.failure, None
        if failure is not None:
            raise failure

    def reported(self, error: BaseException) -> None:
        """`error` (a launch's) was raised by a read of its output: not again at a sync."""
        if self.failure is error:
            self.failure = None

    def _forked(self) -> None:
        """In a child process: the parent's thread is not here, and its locks may have
        been held at the fork. Launches still queued then (another thread enqueued while
        the parent drained) are never run: waiting for one raises."""
        failure = self.failure
        self._reset()
        self.failure = failure

    def _wait_until(self, ready: Callable[[], bool]) -> None:
        changed = self._changed
        with changed:
            self._waiters += 1
            try:
                while not ready():
                    thread = self._thread
                    if thread is None or not thread.is_alive():
                        raise RuntimeError(
                            "torch_tpu: the launch thread is gone with launches queued (it died, or this is "
                            "a child process forked while it ran); set TORCH_TPU_LAUNCH_THREAD=0 and report "
                            "this to torch_tpu")
                    # (A timeout only to notice a dead thread: the launch thread notifies.)
                    changed.wait(1.0)
            finally:
                self._waiters -= 1

    # -- the launch thread ------------------------------------------------------------------

    def _start(self) -> None:
        with self._order:
            if self._thread is None:
                thread = threading.Thread(target=self._serve, name="torch_tpu-launch", daemon=True)
                thread.start()
                self._thread = thread

    def _serve(self) -> None:
        jobs = self._jobs
        while True:
            launch = jobs.get()
            if launch is None:
                return
            self._run(launch)
            self._finished = launch.number
            launch.done = True
            launch.arguments = ()  # let the arguments' arrays go now
            if self._waiters:
                with self._changed:
                    self._changed.notify_all()

    def _run(self, launch: Launch) -> None:
        try:
            launch.results = launch.run(list(map(resolve, launch.arguments)))
        except _Upstream as upstream:
            launch.error = upstream.error
        except BaseException as err:  # noqa: BLE001 - kept and raised where the caller waits
            error = err
            if launch.describe is not None:
                try:
                    error = launch.describe(err, launch.context)
                except BaseException as bad:  # noqa: BLE001 - never lose the failure itself
                    log.error("torch_tpu: describing a failed launch failed: %r", bad)
            launch.error = error
            if self.failure is None:
                self.failure = error

    def quiesce(self) -> None:
        """Drains without raising (exit, fork): a failure stays for the next waiter."""
        last = self._last
        if last is None or last.done or self.is_launch_thread():
            return
        try:
            self._wait_until(lambda: last.done)
        except RuntimeError as err:  # the thread is gone: nothing left to wait for
            log.warning("%s", err)


QUEUE = LaunchQueue()


atexit.register(QUEUE.quiesce)
os.register_at_fork(before=QUEUE.quiesce, after_in_child=QUEUE._forked)
