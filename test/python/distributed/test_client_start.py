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


def _start_all(creators, timeout_s=5.0, delays=None, finish=None):
    """Each rank's WatchedStart(creators[rank]).result(timeout_s, finish), run together (rank
    r starting delays[r] s late; timeout_s: one for all, or a list per rank): what each
    returned or raised, and the seconds it took."""
    store = _StartStore(KeyValueStore())
    outcome, took = {}, {}
    timeouts = timeout_s if isinstance(timeout_s, list) else [timeout_s] * len(creators)

    def rank_main(rank):
        time.sleep(delays[rank] if delays else 0.0)
        began = time.monotonic()
        start = _client_start.WatchedStart(creators[rank], store, rank, len(creators))
        try:
            outcome[rank] = start.result(timeouts[rank], finish)
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
        outcome, took = _start_all([lambda: "client 0", lambda: released.wait(20)], timeout_s=[0.5, 5.0])
    finally:
        released.set()
    assert isinstance(outcome[0], _client_start.StartTimeout)
    assert outcome[0].waiting_for == [1] and outcome[0].own_done
    # The rank that timed out said so: the blocked rank stops with its cause, not after its own timeout.
    assert isinstance(outcome[1], _client_start.StartFailure) and not outcome[1].own
    assert (outcome[1].rank, outcome[1].kind) == (0, _client_start.TIMED_OUT)
    assert "the client of rank(s) [1]" in outcome[1].cause
    assert took[0] < 3.0 and took[1] < 3.0


def test_a_rank_that_times_out_stops_a_peer_that_becomes_ready_just_after():
    """Rank 0 times out waiting for rank 1, whose creation completes just after: rank 1 must
    not start alone (the outcome is one key, written once, that every rank obeys)."""
    outcome, _ = _start_all([lambda: "client 0", lambda: (time.sleep(0.45), "client 1")[1]],
                            timeout_s=0.5, delays=[0.0, 0.1])
    assert isinstance(outcome[0], _client_start.StartTimeout) and outcome[0].waiting_for == [1]
    assert isinstance(outcome[1], _client_start.StartFailure)
    assert (outcome[1].rank, outcome[1].kind, outcome[1].own) == (0, _client_start.TIMED_OUT, False)


def test_the_first_failure_is_the_cause_every_rank_reports():
    """A peer whose creation fails because of the first failure (its connection reset when the
    failed rank left) must not replace the real cause: rank 2 names rank 0, and rank 1
    reports rank 0's cause with its own as secondary."""
    kv = KeyValueStore()
    store, outcome = _StartStore(kv), {}

    def broken():
        time.sleep(0.2)
        raise RuntimeError("libtpu: TPU in use (the real cause)")

    def knock_on():  # fails as soon as the first failure is published
        while not any(key.endswith(_client_start.OUTCOME_KEY) for key in kv.keys()):
            time.sleep(0.001)
        raise RuntimeError("connection reset by peer")

    def rank_main(rank, create):
        start = _client_start.WatchedStart(create, store, rank, 3)
        try:
            outcome[rank] = start.result(5.0)
        except Exception as err:  # noqa: BLE001
            outcome[rank] = err

    creators = [broken, knock_on, lambda: (time.sleep(0.5), "client 2")[1]]
    threads = [threading.Thread(target=rank_main, args=(r, c)) for r, c in enumerate(creators)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert outcome[0].own and outcome[0].cause == "libtpu: TPU in use (the real cause)"
    for peer in (1, 2):
        assert isinstance(outcome[peer], _client_start.StartFailure) and not outcome[peer].own
        assert (outcome[peer].rank, outcome[peer].cause) == (0, "libtpu: TPU in use (the real cause)")
    # Rank 1's own knock-on failure is named beside the cause when its creation ended before
    # its watcher read the outcome; either order is a correct report.
    assert outcome[1].secondary in ("connection reset by peer", None) and outcome[2].secondary is None


def test_a_rank_whose_finish_fails_after_creation_stops_its_peers_naming_it():
    """What a rank does with its created client (making it the process's: fails when the
    process made a client already) runs before it declares itself ready, so it fails
    through the start protocol: its peers name it instead of starting without it."""
    def finish(client):
        if client == "client 1":
            raise RuntimeError("the cpu runtime client already exists in this process")
        return f"runtime of {client}"

    outcome, _ = _start_all([lambda r=r: f"client {r}" for r in range(2)], finish=finish)
    assert isinstance(outcome[1], _client_start.StartFailure) and outcome[1].own
    assert isinstance(outcome[0], _client_start.StartFailure) and outcome[0].rank == 1
    assert "already exists" in outcome[0].cause
    assert _start_all([lambda r=r: f"client {r}" for r in range(2)], finish=lambda c: f"runtime of {c}")[0] == {
        0: "runtime of client 0", 1: "runtime of client 1"}


def test_an_interrupted_rank_stops_its_peers_naming_it():
    """Ctrl-C on one rank during start-up (`abandon`): the peer, blocked in its creation,
    stops with an error naming the interrupted rank instead of waiting for it."""
    store, outcome = _StartStore(KeyValueStore()), {}
    released = threading.Event()

    def peer():
        start = _client_start.WatchedStart(lambda: released.wait(20), store, 1, 2)
        try:
            outcome[1] = start.result(10.0)
        except Exception as err:  # noqa: BLE001
            outcome[1] = err

    began = time.monotonic()
    thread = threading.Thread(target=peer)
    thread.start()
    try:
        interrupted = _client_start.WatchedStart(lambda: released.wait(20), store, 0, 2)
        time.sleep(0.2)
        assert interrupted.abandon(KeyboardInterrupt()) is False  # the job did not start
        thread.join(30)
    finally:
        released.set()
    failure = outcome[1]
    assert isinstance(failure, _client_start.StartFailure) and not failure.own
    assert (failure.rank, failure.kind, failure.cause) == (0, _client_start.INTERRUPTED, "KeyboardInterrupt")
    assert time.monotonic() - began < 3.0


@pytest.mark.parametrize("failure, expected", [
    (_client_start.StartFailure(1, "the TPU is in use", own=True),
     r"^tpu_dist: rank 1 of 4 could not create its client: the TPU is in use\. The other ranks stop with an "
     r"error naming this rank; fix the cause and relaunch$"),
    (_client_start.StartFailure(1, "the TPU is in use", own=False),
     r"^tpu_dist: rank 3 of 4 cannot start: rank 1 could not create its client: the TPU is in use\. Fix the "
     r"cause on rank 1 \(its log has the details\) and relaunch every rank$"),
    (_client_start.StartFailure(0, "KeyboardInterrupt", own=False, kind=_client_start.INTERRUPTED),
     r"^tpu_dist: rank 3 of 4 cannot start: rank 0 was interrupted during start-up \(KeyboardInterrupt\)\. "
     r"Relaunch every rank$"),
    (_client_start.StartFailure(0, "waited 20 s for the client of rank(s) [3], which neither started nor "
                                "reported a failure", own=False, kind=_client_start.TIMED_OUT),
     r"^tpu_dist: rank 3 of 4 cannot start: rank 0 waited 20 s for the client of rank\(s\) \[3\], .* "
     r"raise init_process_group's timeout$"),
    (_client_start.StartFailure(0, "the TPU is in use", own=False, secondary="connection reset by peer"),
     r"^tpu_dist: rank 3 of 4 cannot start: rank 0 could not create its client: the TPU is in use\. \(this "
     r"rank's own client then failed too, most likely as a consequence: connection reset by peer\) Fix "),
    (_client_start.StartTimeout([0, 2], own_done=True),
     r"^tpu_dist: rank 3 of 4 waited 20 s for the client of rank\(s\) \[0, 2\], which neither started nor "
     r"reported a failure .* raise init_process_group's timeout$"),
])
def test_the_start_errors_name_the_rank_and_the_cause(failure, expected):
    from torch_tpu.runtime.distributed import _start_error

    rank = 1 if getattr(failure, "own", False) else 3
    assert re.match(expected, str(_start_error(failure, rank, 4, 20)), re.S)


def test_an_interrupt_after_the_job_started_leaves_the_rank_in_it():
    """Ctrl-C just after a peer saw every rank ready and started the job: the outcome stays
    "ok" (the peer runs on), and `abandon` says this rank is part of a started job, so it
    leaves it as a started rank does instead of as one that never started."""
    store = _StartStore(KeyValueStore())
    starts = [_client_start.WatchedStart(lambda r=r: f"client {r}", store, r, 2) for r in range(2)]
    results = [None, None]
    threads = [threading.Thread(target=lambda r=r: results.__setitem__(r, starts[r].result(5.0))) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert results == ["client 0", "client 1"]
    assert starts[0].abandon(KeyboardInterrupt()) is True
    assert store.try_get(_client_start.OUTCOME_KEY) == "ok"
