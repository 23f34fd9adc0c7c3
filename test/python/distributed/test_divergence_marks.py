"""The lifetime of a divergence finding (`DistributedRuntime._report` /
`raise_reported_divergence`): several ranks' runtimes, as threads, share an in-memory
key-value store with the coordination service's semantics, and run the real handshake.

A finding explains a failed collective program only on the members of the group it was
found in, and at most once per process: a later failure -- another group's, or this
group's after the user caught the error -- is reported as itself."""

from __future__ import annotations

import threading

import pytest

from kv_store import KeyValueStore, thread_runtimes
from torch_tpu.runtime.distributed import CollectiveRecord, DistributedError, DistributedRuntime




def _record(rank: int, sequence: int, what: str) -> CollectiveRecord:
    return CollectiveRecord(rank, sequence, f"fingerprint of {what}", what, f"train.py:{10 + rank}")


def _handshakes(calls) -> dict[int, BaseException | None]:
    """Runs (runtime, group, ranks, record) handshakes together; what each rank raised."""
    raised: dict[int, BaseException | None] = {}

    def run(runtime, group, ranks, record):
        try:
            runtime.handshake(group, ranks, record, 1.0)
            raised[runtime.rank] = None
        except DistributedError as err:
            raised[runtime.rank] = err

    threads = [threading.Thread(target=run, args=call) for call in calls]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return raised


def _diverge_in_group_a(runtimes):
    """Ranks 0 and 1 (group "a") run different collectives #1: both raise."""
    a = (0, 1)
    raised = _handshakes([
        (runtimes[0], "a", a, _record(0, 1, "all_reduce(3 x float32) over ranks [0, 1]")),
        (runtimes[1], "a", a, _record(1, 1, "all_reduce(5 x float32) over ranks [0, 1]")),
    ])
    for rank in a:
        assert "group a diverged at collective #1" in str(raised[rank])


def test_a_finding_does_not_explain_a_failure_outside_its_group():
    runtimes = thread_runtimes(4)
    _diverge_in_group_a(runtimes)
    # rank 2's program of group "b" (ranks 2, 3) fails later for its own reason: no old finding
    runtimes[2].raise_reported_divergence("b", "all_gather(4 x float32) over ranks [2, 3]")
    runtimes[3].raise_reported_divergence("b", "all_gather(4 x float32) over ranks [2, 3]")
    # nor on a non-member that asks about the group itself
    runtimes[2].raise_reported_divergence("a", "all_gather(4 x float32) over ranks [2, 3]")


def test_a_finding_is_raised_once_per_process():
    runtimes = thread_runtimes(2)
    _diverge_in_group_a(runtimes)
    # the user caught the error and went on; a later program fails: not the old divergence
    for runtime in runtimes:
        runtime.raise_reported_divergence("a", "all_reduce(4 x float32) over ranks [0, 1]")


def test_a_member_that_ran_on_unchecked_raises_the_finding_of_its_group_once():
    """first_call: rank 1 waited at collective #2 of group "a" for rank 0, which ran an
    unchecked program instead; rank 0's program fails when rank 1 leaves and raises rank
    1's finding with what it was running -- once; a later failure is its own."""
    runtimes = thread_runtimes(3)
    raised = _handshakes([(runtimes[1], "a", (0, 1), _record(1, 2, "all_gather(4 x float32) over ranks [0, 1]"))])
    assert "rank(s) [0] did not reach it" in str(raised[1])
    runtimes[2].raise_reported_divergence("c", "all_reduce(1 x int32) over ranks [0, 2]")  # not a member of "a"
    with pytest.raises(DistributedError, match=r"(?s)collective #2 of group a .*Rank 0 was running all_reduce"):
        runtimes[0].raise_reported_divergence("a", "all_reduce(4 x float32) over ranks [0, 1]")
    runtimes[0].raise_reported_divergence("a", "all_reduce(4 x float32) over ranks [0, 1]")
    # the finder itself never raises its own finding twice
    runtimes[1].raise_reported_divergence("a", "all_reduce(4 x float32) over ranks [0, 1]")


def test_a_later_finding_of_the_same_group_is_raised():
    runtimes = thread_runtimes(2)
    _diverge_in_group_a(runtimes)
    raised = _handshakes([(runtimes[1], "a", (0, 1), _record(1, 7, "broadcast(2 x int64, src=0) over ranks [0, 1]"))])
    assert "collective #7 of group a" in str(raised[1])
    with pytest.raises(DistributedError, match="collective #7 of group a"):
        runtimes[0].raise_reported_divergence("a", "all_reduce(4 x float32) over ranks [0, 1]")


def test_a_rank_that_diverged_in_two_groups_keeps_each_groups_finding():
    """Rank 1 is in groups a=(0, 1) and b=(1, 2) and misses a handshake in each. With one
    mark per rank, group b's finding overwrote group a's: rank 1's failed group-a program
    was explained by group b's finding, and group a's was never raised."""
    runtimes = thread_runtimes(3)
    _handshakes([(runtimes[0], "a", (0, 1), _record(0, 2, "all_gather(4 x float32) over ranks [0, 1]"))])
    _handshakes([(runtimes[2], "b", (1, 2), _record(2, 1, "broadcast(8 x float32, src=0) over ranks [1, 2]"))])
    with pytest.raises(DistributedError, match=r"(?s)collective #2 of group a \(all_gather.*Rank 1 was running "
                                               r"all_reduce\(4 x float32\) over ranks \[0, 1\]"):
        runtimes[1].raise_reported_divergence("a", "all_reduce(4 x float32) over ranks [0, 1]")
    with pytest.raises(DistributedError, match=r"(?s)collective #1 of group b \(broadcast.*Rank 1 was running "
                                               r"broadcast\(8 x float32, src=0\) over ranks \[1, 2\]"):
        runtimes[1].raise_reported_divergence("b", "broadcast(8 x float32, src=0) over ranks [1, 2]")
    for group in ("a", "b"):  # each raised once
        runtimes[1].raise_reported_divergence(group, "all_reduce(4 x float32) over ranks [0, 1]")


def test_a_finding_is_stored_once_for_its_group():
    """Waiters and failed programs read the same key: a finding was stored twice
    (`hs/<group>/diverged`, and a mark `hs/mark/<rank>/<group>` per member), two writes per
    member that could disagree."""
    store = KeyValueStore()
    runtimes = thread_runtimes(4, store)
    _handshakes([(runtimes[0], "a", (0, 1, 2), _record(0, 4, "all_gather(4 x float32) over ranks [0, 1, 2]"))])
    findings = [k for k in store.keys() if "diverged" in k or "mark" in k]
    assert findings == ["torch_tpu/hs/a/diverged"]
    for member in (1, 2):  # both read it, once
        with pytest.raises(DistributedError, match=r"(?s)collective #4 of group a .*rank\(s\) \[1, 2\] did not"):
            runtimes[member].raise_reported_divergence("a", "all_reduce(4 x float32) over ranks [0, 1, 2]")
        runtimes[member].raise_reported_divergence("a", "all_reduce(4 x float32) over ranks [0, 1, 2]")
    runtimes[3].raise_reported_divergence("a", "all_reduce(4 x float32) over ranks [0, 3]")  # not a member
