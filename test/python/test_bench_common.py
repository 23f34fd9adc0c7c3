"""bench/_common.py's `wait_for_idle_threads`: the interleaved benchmarks (bench/models.py,
bench/overhead.py) start each block of calls once the process's other threads stopped
running, so that one contender's spinning workers (eager PyTorch's OpenMP pool spins for
tens of ms after each op) are not charged to the next contender (issue #17)."""

from __future__ import annotations

import os
import sys
import threading
import time

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))

import _common  # noqa: E402

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="needs /proc (Linux)")


def _spin_until(stop: threading.Event, deadline: float) -> None:
    while not stop.is_set() and time.perf_counter() < deadline:
        pass


def test_waits_for_a_spinning_thread_to_stop():
    spin_s = 0.08
    stop = threading.Event()
    spinner = threading.Thread(target=_spin_until, args=(stop, time.perf_counter() + spin_s))
    spinner.start()
    try:
        time.sleep(0.005)  # the spinner is running
        waited = _common.wait_for_idle_threads(timeout_s=5.0)
        # It returned because the spinner stopped running, not at the timeout.
        assert spin_s / 4 <= waited < 5.0
        spinner.join(timeout=1.0)
        assert not spinner.is_alive()
    finally:
        stop.set()
        spinner.join()


def test_gives_up_after_the_timeout():
    stop = threading.Event()
    spinner = threading.Thread(target=_spin_until, args=(stop, time.perf_counter() + 60))
    spinner.start()
    try:
        time.sleep(0.005)
        waited = _common.wait_for_idle_threads(timeout_s=0.05)
        assert 0.05 <= waited < 2.0
        assert spinner.is_alive()
    finally:
        stop.set()
        spinner.join()


def test_sleeping_threads_are_idle():
    stop = threading.Event()
    sleeper = threading.Thread(target=stop.wait)
    sleeper.start()
    try:
        time.sleep(0.005)
        assert _common.wait_for_idle_threads(timeout_s=1.0) < 1.0
    finally:
        stop.set()
        sleeper.join()


def test_interleaved_timings_settles_before_each_block():
    order: list[str] = []
    contenders = {
        "a": (lambda: order.append("a"), lambda r: r),
        "b": (lambda: order.append("b"), lambda r: r),
    }
    timings = _common.interleaved_timings(contenders, {"a": 4, "b": 2}, rounds=2, warmup=0,
                                          settle=lambda: order.append("|"))
    assert order == ["|", "a", "a", "|", "b", "|", "a", "a", "|", "b"]
    assert len(timings["a"].wall) == 4 and len(timings["b"].cpu) == 2 and len(timings["b"].thread) == 2
    assert all(t >= 0 for t in timings["a"].thread)


def test_host_clock_is_the_thread_clock_where_it_ticks_finely_and_wall_time_where_it_is_coarse(monkeypatch):
    fine = iter(range(10**7))
    monkeypatch.setattr(time, "thread_time", lambda: next(fine) * 1e-6)  # 1 us steps
    clock, name = _common.host_clock()
    assert clock is time.thread_time and "CPU" in name

    ticks = iter(range(10**7))
    monkeypatch.setattr(time, "thread_time", lambda: next(ticks) // 1000 * 500e-6)  # 0.5 ms steps
    clock, name = _common.host_clock()
    assert clock is time.perf_counter and "500 us" in name
