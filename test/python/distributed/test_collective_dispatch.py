"""ProcessGroupTPU's per-call dispatch, without a job (single process): which backend a
collective's tensors go to (CPU tensors only: gloo; any tpu tensor: tpu_dist, which refuses
a mix) and the reduce op every ReduceOp spelling maps to. Both run before every
collective (the backend check is a flat walk of the arguments, bench/dist.py's Python
path); these tests pin their answers."""

from __future__ import annotations

import datetime

import pytest
import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

import torch_tpu  # noqa: F401 - registers the tpu device
from torch_tpu.distributed import _process_group as pg
from torch_tpu.runtime import distributed


class _NoCollectives:
    """A runtime that fails the test if the group reaches a collective program."""

    rank = 0

    def __getattr__(self, name):
        raise AssertionError(f"a collective program ran ({name})")


class _RecordingGloo:
    """Stands in for the group's gloo backend: records what reached it."""

    def __init__(self):
        self.calls = []

    def __getattr__(self, name):
        def run(*args, **kwargs):
            self.calls.append(name)
            return pg.TPUWork(result=[])

        return run


def _group(monkeypatch) -> tuple[pg.ProcessGroupTPU, _RecordingGloo]:
    monkeypatch.setattr(distributed, "current", lambda: _NoCollectives())
    group = pg.ProcessGroupTPU(0, 2, [0, 1], "dispatch", datetime.timedelta(seconds=10))
    group._gloo = _RecordingGloo()
    return group, group._gloo


@pytest.mark.parametrize(
    "args, expected",
    [
        (([torch.ones(2)],), True),
        (([[torch.ones(2), torch.ones(3)]], [torch.ones(2)]), True),  # nested lists (all_gather)
        ((torch.ones(4), torch.ones(4), [], []), True),  # all_to_all_single: empty split lists
        (([torch.ones(2, device="tpu")],), False),
        (([[torch.ones(2)], [torch.ones(2, device="tpu")]],), False),  # a tpu tensor deep in a list
        (([torch.ones(2, device="tpu"), torch.ones(2)],), False),
        (([], c10d.AllreduceOptions()), None),  # no tensor at all
    ],
)
def test_which_tensors_are_cpu_only(args, expected):
    assert pg._cpu_tensors_only(args) is expected


def test_cpu_tensors_go_to_gloo_and_tpu_or_mixed_ones_to_tpu_dist(monkeypatch):
    group, gloo = _group(monkeypatch)
    group.allreduce([torch.ones(2)], c10d.AllreduceOptions()).wait()
    group.allgather([[torch.ones(2), torch.ones(2)]], [torch.ones(2)], c10d.AllgatherOptions()).wait()
    assert gloo.calls == ["allreduce", "allgather"]
    # A mix reaches tpu_dist, which refuses the CPU tensor before any program runs.
    work = group.allreduce([torch.ones(2, device="tpu"), torch.ones(2)], c10d.AllreduceOptions())
    with pytest.raises(ValueError, match=r"tpu_dist all_reduce: expected tpu tensors .* got one on cpu"):
        work.wait()
    assert gloo.calls == ["allreduce", "allgather"]


_EXPECTED = {
    dist.ReduceOp.SUM: "sum", dist.ReduceOp.AVG: "avg", dist.ReduceOp.PRODUCT: "product",
    dist.ReduceOp.MIN: "min", dist.ReduceOp.MAX: "max", dist.ReduceOp.BAND: "band",
    dist.ReduceOp.BOR: "bor", dist.ReduceOp.BXOR: "bxor",
}


@pytest.mark.parametrize("kind", list(_EXPECTED), ids=str)
def test_every_reduce_op_spelling_maps_to_its_reduction(monkeypatch, kind):
    group, _ = _group(monkeypatch)
    opts = c10d.AllreduceOptions()
    opts.reduceOp = kind  # stored as a ReduceOp object, as dist.all_reduce passes it
    assert not isinstance(opts.reduceOp, type(kind))
    assert group._reduce_op(opts.reduceOp) == _EXPECTED[kind]
    assert group._reduce_op(kind) == _EXPECTED[kind]  # the default: a bare RedOpType


def test_premul_sum_is_refused_saying_what_to_do(monkeypatch):
    group, _ = _group(monkeypatch)
    premul = dist._make_nccl_premul_sum(2.0)
    with pytest.raises(ValueError, match=r"reduce op .* is not supported \(premul_sum: multiply first, then SUM\)"):
        group._reduce_op(premul)
