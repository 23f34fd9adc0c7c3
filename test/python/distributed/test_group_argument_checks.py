"""ProcessGroupTPU without a job (single process): what it checks before any collective
runs -- output sizes, which it must name the collective for."""

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

