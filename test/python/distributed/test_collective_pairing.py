"""Ranks that pair different collectives, or wait on one their peers never run (issue 30).

The handshake compares the program, the user's torch.distributed call (operation and
shapes) and its call site, so a collective one rank runs from a line the others do not
(an extra call under a rank-dependent `if`) is a DistributedError on every rank naming
each rank's line -- not a silently wrong sum. A rank left waiting in a collective its peers
never run raises a DistributedError naming the collective, its group and line and where
the peers went, within the job's timeout -- never jaxlib's abort. Every call to the
coordination service that fails is a DistributedError naming what it was doing.

Thread-rank tests run the real handshake over an in-memory store (kv_store.py); torchrun
jobs (workers/pairing.py) check the whole path."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest
from free_ports import free_port_pair

from kv_store import KeyValueStore, thread_runtimes
from torch_tpu.runtime import _jaxlib
from torch_tpu.runtime.distributed import CollectiveRecord, DistributedError, _encode_latest
from torch_tpu.runtime.errors import ExecutionError

_ABORTS = ("Terminating process", "FATAL", "Aborted", "SIGABRT", "Check failure", "JaxRuntimeError")


def _record(rank: int, sequence: int, line: str, call: str = "all_reduce of [4]", site: str | None = None,
            what: str = "all_reduce(4 x float32, reduce_op=sum) over ranks [0, 1]") -> CollectiveRecord:
    return CollectiveRecord(rank, sequence, "fp-all_reduce-4", what, f"/job/{line}", call,
                            line if site is None else site)


def _handshakes(runtimes, records, timeout_s: float = 5.0) -> dict[int, BaseException | None]:
    raised: dict[int, BaseException | None] = {}

    def run(runtime, record):
        try:
            runtime.handshake("0", (0, 1), record, timeout_s)
            raised[runtime.rank] = None
        except DistributedError as err:
            raised[runtime.rank] = err

    threads = [threading.Thread(target=run, args=(rt, rec)) for rt, rec in zip(runtimes, records)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return raised


def test_same_collective_from_different_lines_is_a_divergence_on_every_rank():
    """The issue's case: rank 0's extra all_reduce (train.py:9) pairs with rank 1's next one
    (train.py:11): same program, same shapes -- it used to pass and sum the wrong buffers."""
    runtimes = thread_runtimes(2)
    raised = _handshakes(runtimes, [_record(0, 2, "train.py:9"), _record(1, 2, "train.py:11")])
    for rank in (0, 1):
        text = str(raised[rank])
        assert "group 0 diverged at collective #2" in text, text
        assert "rank 0: all_reduce(4 x float32, reduce_op=sum) over ranks [0, 1] at /job/train.py:9" in text
        assert "rank 1: all_reduce(4 x float32, reduce_op=sum) over ranks [0, 1] at /job/train.py:11" in text
        assert "They differ in the call site" in text


def test_different_calls_of_one_program_are_a_divergence():
    """all_reduce and reduce run the same all-reduce program: the call tells them apart."""
    runtimes = thread_runtimes(2)
    raised = _handshakes(runtimes, [_record(0, 3, "train.py:5", call="all_reduce of [4]"),
                                    _record(1, 3, "train.py:5", call="reduce of [4]")])
    for rank in (0, 1):
        assert "They differ in the torch.distributed call (operation, tensors' shapes)" in str(raised[rank])
        assert "(called as reduce of [4])" in str(raised[rank])


def test_shapes_of_one_element_count_are_a_divergence():
    runtimes = thread_runtimes(2)
    raised = _handshakes(runtimes, [_record(0, 1, "t.py:5", call="all_reduce of [2, 3]"),
                                    _record(1, 1, "t.py:5", call="all_reduce of [3, 2]")])
    assert all("tensors' shapes" in str(raised[r]) for r in (0, 1)), raised


def test_rooted_and_point_to_point_calls_may_come_from_different_lines():
    """`if rank == 0: broadcast(x, 0) else: broadcast(y, 0)` is PyTorch's idiom: their
    records carry no call site, and they pair."""
    runtimes = thread_runtimes(2)
    raised = _handshakes(runtimes, [_record(0, 1, "t.py:5", call="broadcast of [4]", site=""),
                                    _record(1, 1, "t.py:7", call="broadcast of [4]", site="")])
    assert raised == {0: None, 1: None}


def test_a_handshake_with_a_rank_that_left_raises_at_once_naming_where_it_left():
    runtimes = thread_runtimes(2)
    runtimes[1].note_run("0", _record(1, 2, "train.py:11"))
    runtimes[1].kv_set("hs/left/1", _encode_latest(runtimes[1]._latest))
    start = time.monotonic()
    raised = _handshakes(runtimes[:1], [_record(0, 3, "train.py:11")], timeout_s=20.0)
    assert time.monotonic() - start < 5, "waited for a rank that had left"
    text = str(raised[0])
    assert "collective #3 of group 0" in text and "rank(s) [1] left the job without reaching it" in text, text
    assert "rank 1: it left the job (its script ended or raised) after collective #2 of this group" in text


def _gloo_timeout() -> _jaxlib.JaxRuntimeError:
    return _jaxlib.JaxRuntimeError("UNKNOWN: Gloo all-reduce failed: [unbound_buffer.cc:81] Timed out waiting "
                                   "8000ms for recv operation to complete")


def test_a_collective_its_peers_never_ran_names_itself_its_group_line_and_the_peers():
    runtimes = thread_runtimes(3)
    runtimes[1].note_run("0", _record(1, 2, "train.py:8"))
    runtimes[1].kv_set("hs/left/1", _encode_latest(runtimes[1]._latest))
    runtimes[2].kv_set("hs/0/last/2", _record(2, 1, "train.py:4").encode())
    err = runtimes[0].collective_failed("0", (0, 1, 2), _record(0, 3, "train.py:8"), _gloo_timeout())
    assert isinstance(err, DistributedError)
    text = str(err)
    assert text.startswith("tpu_dist: collective #3 of group 0 (all_reduce(4 x float32, reduce_op=sum) over ranks "
                           "[0, 1] at /job/train.py:8 (called as all_reduce of [4])) failed on rank 0: no peer ran it")
    assert "rank 1: it left the job (its script ended or raised) after collective #2 of this group" in text
    assert "rank 2: still in the job; its last checked collective was #1" in text
    assert "Timed out waiting 8000ms" in text


def test_a_failed_collective_raises_the_reported_finding_first_and_other_failures_as_themselves():
    runtimes = thread_runtimes(2)
    _handshakes(runtimes[1:], [_record(1, 2, "train.py:9")], timeout_s=0.5)  # rank 1 finds rank 0 missing
    err = runtimes[0].collective_failed("0", (0, 1), _record(0, 2, "train.py:7"), _gloo_timeout())
    assert "rank(s) [0] did not reach it" in str(err) and "Rank 0 was running all_reduce" in str(err)
    oom = runtimes[0].collective_failed("0", (0, 1), _record(0, 3, "train.py:7"),
                                        _jaxlib.JaxRuntimeError("INTERNAL: the program is broken"))
    assert isinstance(oom, ExecutionError) and "collective #3 of group 0" in str(oom)


class _Leaving(KeyValueStore):
    def __init__(self, steps: list) -> None:
        super().__init__()
        self.steps = steps

    def wait_at_barrier(self, name: str, timeout_ms: int) -> None:
        self.steps.append(("barrier", name, timeout_ms))

    def shutdown(self) -> None:
        self.steps.append("left the service")


def test_a_rank_leaves_saying_where_it_stopped_and_waits_for_the_others_before_rank_0_stops_the_service():
    """jaxlib's own shutdown does not wait: rank 0 stopped the service under a peer still
    waiting in a collective, which jaxlib then aborted (SIGABRT, no Python error)."""
    steps: list = []
    runtime = thread_runtimes(2, _Leaving(steps))[0]
    runtime.timeout_s, runtime._closed = 8.0, False
    runtime._service = type("Service", (), {"shutdown": lambda self: steps.append("service stopped")})()
    runtime.note_run("0", _record(0, 2, "train.py:11"))
    runtime.shutdown()
    assert steps == [("barrier", "torch_tpu/exit", 38_000), "left the service", "service stopped"]
    assert "after collective #2 of this group" in thread_runtimes(2, runtime._dclient)[1]._peer_state("0", 0)


class _LostService(KeyValueStore):
    """The coordination service is gone (rank 0 exited): every call fails as jaxlib's does."""

    def _gone(self, *args):
        raise _jaxlib.JaxRuntimeError("UNAVAILABLE: failed to connect to all addresses; Connection refused")

    key_value_set = blocking_key_value_get = key_value_try_get = key_value_increment = _gone


@pytest.mark.parametrize("call, doing", [
    (lambda rt: rt.kv_set("hs/0/3/1", "x"), "while publishing 'hs/0/3/1'"),
    (lambda rt: rt.kv_get("hs/0/3/0", 1.0), "while waiting for 'hs/0/3/0'"),
    (lambda rt: rt.kv_try_get("hs/0/diverged"), "while reading 'hs/0/diverged'"),
    (lambda rt: rt.incarnation_name("3", (1, 2), 1.0), "while counting 'hs/incarnations/3'"),
    (lambda rt: rt.handshake("0", (0, 1), _record(1, 3, "t.py:1"), 1.0), "while publishing 'hs/0/3/1'"),
])
def test_every_coordination_service_call_that_fails_is_a_distributed_error(call, doing):
    """kv_set raised jaxlib's raw gRPC JaxRuntimeError (only kv_get was translated)."""
    runtime = thread_runtimes(2, _LostService())[1]
    with pytest.raises(DistributedError) as info:
        call(runtime)
    assert f"rank 1 lost the coordination service (served by rank 0 at memory) {doing}" in str(info.value)
    assert "Rank 0 has probably exited or died" in str(info.value)


# -- torchrun jobs -------------------------------------------------------------------------------


def _job(*args: str, stage: str = "first_call") -> str:
    from test_tpu_dist import WORKERS, _env

    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_addr=127.0.0.1",
           f"--master_port={free_port_pair()}", str(WORKERS / "pairing.py"), *args]
    env = _env()
    env["TORCH_TPU_SPMD_HANDSHAKE_STAGE"] = stage
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180)
    output = proc.stdout + proc.stderr
    for abort in _ABORTS:
        assert abort not in output, output[-6000:]
    return output


def _line(marker: str) -> int:
    from test_tpu_dist import WORKERS

    lines = (WORKERS / "pairing.py").read_text().splitlines()
    return next(i for i, text in enumerate(lines, 1) if text.endswith(f"# {marker}"))


@pytest.mark.parametrize("stage", ["first_call", "every_call"])
def test_an_extra_collective_on_one_rank_is_an_error_on_every_rank(stage):
    out = _job("extra", stage=stage)
    extra, common = _line("extra line"), _line("common line")
    for rank in (0, 1):
        assert f"rank {rank}: raised after" in out and f"rank {rank}: finished" not in out, out[-6000:]
    assert out.count("DistributedError: tpu_dist: the ranks of group 0 diverged at collective #2:") == 2, out[-6000:]
    assert out.count(f"rank 0: all_reduce(4 x float32, reduce_op=sum) over ranks [0, 1] at ") == 2
    assert out.count(f"pairing.py:{extra} (called as all_reduce of [4])") == 2, out[-6000:]
    assert out.count(f"pairing.py:{common} (called as all_reduce of [4])") == 2, out[-6000:]
    assert out.count("They differ in the call site") == 2


def test_different_operations_on_one_line_are_an_error_on_every_rank():
    out = _job("ops")
    line = _line("ops line")
    assert out.count("diverged at collective #2:") == 2, out[-6000:]
    assert out.count(f"pairing.py:{line} (called as all_reduce of [4])") == 2, out[-6000:]
    assert out.count(f"pairing.py:{line} (called as reduce of [4])") == 2, out[-6000:]
    assert out.count("They differ in the torch.distributed call") == 2


@pytest.mark.parametrize("waiting", [1, 0])
def test_a_rank_waiting_on_a_collective_its_peer_never_runs_raises_a_python_error(waiting):
    """The peer finished and left; rank 1 used to be aborted by jaxlib (SIGABRT, no Python
    error) when rank 0 -- which serves the coordination service -- exited."""
    out = _job("stuck", str(waiting))
    peer, line = 1 - waiting, _line("the helper's line")
    assert f"rank {peer}: finished with" in out, out[-6000:]
    assert (f"rank {waiting}: raised after" in out and "DistributedError: tpu_dist: collective #3 of group 0 "
            "(all_reduce(4 x float32, reduce_op=sum) over ranks [0, 1] at ") in out, out[-6000:]
    assert f"pairing.py:{line} (called as all_reduce of [4])) failed on rank {waiting}" in out, out[-6000:]
    assert f"rank {peer}: it left the job (its script ended or raised) after collective #2 of this group" in out
    seconds = float(out.split(f"rank {waiting}: raised after ")[1].split()[0])
    assert seconds < 30, out[-6000:]  # the collective timeout is 8 s
