"""A process group made again under a name an earlier group had (`DistributedRuntime.
incarnation_name`): its handshakes run under keys of their own, so they never meet the
old group's records. Ranks' runtimes as threads over an in-memory key-value store; the
torchrun job is test_tpu_dist.py::test_a_group_made_again_under_its_old_name_does_not_meet_the_old_groups_records."""

from __future__ import annotations

import threading

import pytest

from kv_store import thread_runtimes
from torch_tpu.distributed._process_group import p2p_channel
from torch_tpu.runtime.distributed import CollectiveRecord, DistributedError, DistributedRuntime, group_label




def _together(calls):
    """Runs each (function, args) on its own thread; what each returned or raised."""
    results = [None] * len(calls)

    def run(i, fn, args):
        try:
            results[i] = fn(*args)
        except Exception as err:  # noqa: BLE001
            results[i] = err

    threads = [threading.Thread(target=run, args=(i, fn, args)) for i, (fn, args) in enumerate(calls)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return results


def _make(runtimes, members, name):
    return _together([(runtimes[r].incarnation_name, (name, members, 5.0)) for r in members])


def test_each_making_of_a_name_gets_its_own_handshake_name_on_every_member():
    runtimes = thread_runtimes(3)
    assert _make(runtimes, (0, 1), "1") == ["1", "1"]
    assert _make(runtimes, (0, 1), "1") == ["1#2", "1#2"]  # destroyed, made again
    # the name over other ranks (after a re-init): rank 1 made "1" twice, rank 2 never
    assert _make(runtimes, (1, 2), "1") == ["1#3", "1#3"]
    assert _make(runtimes, (0, 1, 2), "0") == ["0", "0", "0"]


def _record(rank, what, line):
    return CollectiveRecord(rank, 1, f"fingerprint of {what}", what, f"train.py:{line}")


def test_a_new_group_does_not_compare_with_the_old_groups_records():
    """Rank 1 comes late to the new group's collective #1: rank 0 must wait for it, not
    compare with rank 1's record of the old group's #1 (a false divergence)."""
    runtimes = thread_runtimes(2)
    old = _make(runtimes, (0, 1), "0")
    _together([(runtimes[r].handshake, (old[r], (0, 1), _record(r, "all_reduce(4 x float32)", 20), 1.0))
               for r in range(2)])
    new = _make(runtimes, (0, 1), "0")
    # named as the user knows the group: PyTorch's name, which making of it (not "0#2")
    with pytest.raises(DistributedError, match=r"collective #1 of group 0 \(incarnation 2\) \(all_reduce\(8 x "
                                               r"float32\) at train\.py:30\) on rank 0: rank\(s\) \[1\] did not "
                                               r"reach it"):
        runtimes[0].handshake(new[0], (0, 1), _record(0, "all_reduce(8 x float32)", 30), 0.3)
    # together, the new group's collective #1 checks fine
    new = _make(runtimes, (0, 1), "0")
    assert _together([(runtimes[r].handshake, (new[r], (0, 1), _record(r, "all_reduce(8 x float32)", 30), 2.0))
                      for r in range(2)]) == [None, None]


def test_a_member_whose_first_rank_never_makes_the_group_is_told_so():
    runtimes = thread_runtimes(2)
    with pytest.raises(DistributedError, match=r"rank 1 made process group 5 over ranks \[0, 1\], but its first "
                                               r"rank 0 did not make it within 0.2 s"):
        runtimes[1].incarnation_name("5", (0, 1), 0.2)


def test_point_to_point_channels_are_named_after_the_world_groups_incarnation():
    """Sends and receives use one channel per pair of processes, shared by every group: a
    re-initialised job (the world group "0" made again) gets new channels, whose sequence
    restarts, instead of meeting the old job's p2p records. Another group over every rank
    does not count."""
    runtimes = thread_runtimes(3)
    _make(runtimes, (0, 1, 2), "0")
    assert [r.world_incarnation for r in runtimes] == [1, 1, 1]
    assert p2p_channel((0, 2), runtimes[0].world_incarnation) == "p2p-0-2"
    _make(runtimes, (0, 1, 2), "1")  # new_group over every rank
    _make(runtimes, (0, 1, 2), "0")  # destroy_process_group, init_process_group
    assert [r.world_incarnation for r in runtimes] == [2, 2, 2]
    assert p2p_channel((0, 2), runtimes[2].world_incarnation) == "p2p-0-2#2"


def test_errors_name_the_group_as_pytorch_does():
    assert group_label("0") == "0"
    assert group_label("0#2") == "0 (incarnation 2)"
    assert group_label("p2p-0-1#3") == "p2p-0-1 (incarnation 3)"
