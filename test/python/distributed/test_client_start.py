"""The watched, collective creation of the multi-process client (`runtime/_client_start.py`):
ranks as threads over an in-memory key-value store, creation functions standing in for
jaxlib's. A rank whose creation fails makes every other rank raise its cause, even a rank
whose own creation is blocked (as XLA:CPU's is, waiting for the failed rank's topology);
the job starts only when every rank's creation succeeded. The 2-process job with a real
client is test_tpu_dist.py::test_a_rank_whose_client_fails_stops_every_rank_with_an_error_naming_it."""

from __future__ import annotations

import re
import threading
import time

import pytest

from kv_store import KeyValueStore
from torch_tpu.runtime import _client_start
from torch_tpu.runtime.distributed import _StartStore


def _start_all(creators, timeout_s=5.0):
    """Each rank's WatchedStart(creators[rank]).result(timeout_s), run together: what each
    returned or raised, and the seconds it took."""
    store = _StartStore(KeyValueStore())
    outcome, took = {}, {}

    def rank_main(rank):
        began = time.monotonic()
        start = _client_start.WatchedStart(creators[rank], store, rank, len(creators))
        try:
            outcome[rank] = start.result(timeout_s)
        except Exception as err:  # noqa: BLE001
            outcome[rank] = err
        took[rank] = time.monotonic() - began

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(len(creators))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return outcome, took


def test_every_rank_gets_its_client_once_all_are_created():
    outcome, _ = _start_all([lambda r=r: f"client {r}" for r in range(3)])
    assert outcome == {0: "client 0", 1: "client 1", 2: "client 2"}


def test_a_failing_rank_makes_a_blocked_peer_raise_its_cause():
    released = threading.Event()

    def blocked():  # XLA:CPU waits in C++ for the failed rank's topology
        released.wait(20)
        raise RuntimeError("the coordination service went away")

    def broken():
        time.sleep(0.2)
        raise RuntimeError("libtpu: the TPU is in use by process 42")

    try:
        outcome, took = _start_all([blocked, broken, blocked])
    finally:
        released.set()
    assert isinstance(outcome[1], _client_start.StartFailure) and outcome[1].own
    for peer in (0, 2):
        failure = outcome[peer]
        assert isinstance(failure, _client_start.StartFailure) and not failure.own
        assert (failure.rank, failure.cause) == (1, "libtpu: the TPU is in use by process 42")
        assert took[peer] < 2.0  # found by polling, not by waiting out the timeout


def test_a_rank_that_fails_after_its_peers_succeeded_stops_them():
    """A plugin's creation can succeed on some ranks before another's fails: the ranks that
    succeeded wait for every rank's readiness, so they do not start a job without it."""
    def late():
        time.sleep(0.3)
        raise RuntimeError("NCCL: unhandled system error")

    outcome, _ = _start_all([lambda: "client 0", late])
    assert isinstance(outcome[0], _client_start.StartFailure)
    assert (outcome[0].rank, outcome[0].cause, outcome[0].own) == (1, "NCCL: unhandled system error", False)


def test_a_rank_that_neither_starts_nor_fails_is_named_after_the_timeout():
    released = threading.Event()
    try:
        outcome, took = _start_all([lambda: "client 0", lambda: released.wait(20)], timeout_s=0.5)
    finally:
        released.set()
    assert isinstance(outcome[0], _client_start.StartTimeout)
    assert outcome[0].waiting_for == [1] and outcome[0].own_done
    assert isinstance(outcome[1], _client_start.StartTimeout) and not outcome[1].own_done
    assert took[0] < 3.0


@pytest.mark.parametrize("failure, expected", [
    (_client_start.StartFailure(1, "the TPU is in use", own=True),
     r"^tpu_dist: rank 1 of 4 could not create its client: the TPU is in use\. The other ranks stop with an "
     r"error naming this rank; fix the cause and relaunch$"),
    (_client_start.StartFailure(1, "the TPU is in use", own=False),
     r"^tpu_dist: rank 3 of 4 cannot start: rank 1 could not create its client: the TPU is in use\. Fix the "
     r"cause on rank 1 \(its log has the details\) and relaunch every rank$"),
    (_client_start.StartTimeout([0, 2], own_done=True),
     r"^tpu_dist: rank 3 of 4 waited 20 s for the client of rank\(s\) \[0, 2\], which neither started nor "
     r"reported a failure .* raise init_process_group's timeout$"),
])
def test_the_start_errors_name_the_rank_and_the_cause(failure, expected):
    from torch_tpu.runtime.distributed import _start_error

    rank = 1 if getattr(failure, "own", False) else 3
    assert re.match(expected, str(_start_error(failure, rank, 4, 20)), re.S)
