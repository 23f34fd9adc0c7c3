"""ProcessGroupTPU without a job (single process): what it checks before any collective
runs -- output sizes, which it must name the collective for -- and the collectives of CPU
tensors it hands to gloo (a real one-rank gloo group on an in-memory store)."""

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
        raise AssertionError(f"a collective ran ({name}): the arguments should have been refused first")


def _group(monkeypatch, size: int) -> pg.ProcessGroupTPU:
    monkeypatch.setattr(distributed, "current", lambda: _NoCollectives())
    return pg.ProcessGroupTPU(0, size, list(range(size)), "checks", datetime.timedelta(seconds=10))


def _tpu(*shape):
    return torch.zeros(*shape, device="tpu")


@pytest.mark.parametrize("kind", ["all_gather", "gather"])
def test_a_wrong_sized_gather_output_is_refused_naming_the_collective(monkeypatch, kind):
    """An output of another element count than the input raised reshape's "shape '[4]'
    is invalid for input of size 3" after the collective, naming none."""
    group = _group(monkeypatch, 2)
    run = group.allgather if kind == "all_gather" else group.gather
    opts = c10d.AllgatherOptions() if kind == "all_gather" else c10d.GatherOptions()
    with pytest.raises(ValueError, match=rf"tpu_dist {kind}: output 1 \(\[4\]\) has 4 elements, expected 3 "
                                         r"\(the input's, \[3\]\)"):
        run([[_tpu(3), _tpu(4)]], [_tpu(3)], opts).wait()
    with pytest.raises(ValueError, match=rf"tpu_dist {kind}: 1 output tensors for 2 ranks; give one per rank"):
        run([[_tpu(3)]], [_tpu(3)], opts).wait()


def test_a_wrong_sized_scatter_input_is_refused_on_the_source(monkeypatch):
    group = _group(monkeypatch, 2)
    with pytest.raises(ValueError, match=r"tpu_dist scatter: input 0 \(\[2, 2\]\) has 4 elements, expected 3"):
        group.scatter([_tpu(3)], [[_tpu(2, 2), _tpu(3)]], c10d.ScatterOptions()).wait()


def test_a_result_that_does_not_fit_names_the_collective(monkeypatch):
    group = _group(monkeypatch, 1)
    target = _tpu(4)

    def body():
        pg._write(target, torch.ones(3, device="tpu"))
        return [], [target]

    with pytest.raises(ValueError, match=r"tpu_dist all_to_all: its result has 3 elements, the output tensor"):
        group._issue("all_to_all", [target], body).wait()


def _with_gloo(monkeypatch) -> pg.ProcessGroupTPU:
    group = _group(monkeypatch, 1)
    group._gloo = dist.ProcessGroupGloo(dist.HashStore(), 0, 1, datetime.timedelta(seconds=30))
    return group


def test_every_forwarded_collective_has_a_gloo_counterpart():
    for name in pg._FORWARDED:
        gloo_name = pg._GLOO_PER_PAIR.get(name, pg._GLOO_NAME.get(name, name))
        assert hasattr(dist.ProcessGroupGloo, gloo_name), (name, gloo_name)


def test_cpu_tensors_run_on_gloo_under_tpu_dist_names_gloo_lacks(monkeypatch):
    """all_gather_into_tensor, reduce_scatter_tensor, all_to_all_single and the coalesced
    ones of CPU tensors raised AttributeError: gloo has no method of tpu_dist's name."""
    group = _with_gloo(monkeypatch)
    x = torch.arange(4.0)

    out = torch.zeros(4)
    group.all_gather_single(out, x, c10d.AllgatherOptions()).wait()
    assert torch.equal(out, x)
    out = torch.zeros(4)
    group.reduce_scatter_single(out, x, c10d.ReduceScatterOptions()).wait()
    assert torch.equal(out, x)
    out = torch.zeros(4)
    group.all_to_all_single(out, x, [], [], c10d.AllToAllOptions()).wait()
    assert torch.equal(out, x)

    outs = [torch.zeros(4), torch.zeros(2)]
    work = group.allgather_into_tensor_coalesced(outs, [x, x[:2] + 10], c10d.AllgatherOptions())
    work.wait()
    assert torch.equal(outs[0], x) and torch.equal(outs[1], x[:2] + 10)
    assert work.result() == outs
    outs = [torch.zeros(4), torch.zeros(2)]
    group.reduce_scatter_tensor_coalesced(outs, [x, x[:2] + 10], c10d.ReduceScatterOptions()).wait()
    assert torch.equal(outs[0], x) and torch.equal(outs[1], x[:2] + 10)
