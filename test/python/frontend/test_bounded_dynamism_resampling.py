"""Resampling and computed indices under bounded dynamism (#30 item 4): upsampling
(nearest, nearest-exact, linear/bilinear/trilinear, bicubic; 1-d, 2-d, 3-d; scale
factors, recomputed scales and output sizes taken from another dynamic tensor) with its
spatial dims dynamic, against eager at sizes up to and at the bound.

PyTorch decomposes nearest upsampling into `_unsafe_index` with indices computed from the
sizes (the other modes run in eager along a dynamic spatial dim). The padded program must
give every logical position what the static program gives it, in two places the static
program is exact by construction:

* an index past the end of a dynamic dim is clamped to the run-time last element, as the
  static program's gather clamps it (the padded one would read the padding: zeros);
* graphs that differ only in a size passed in as a value (`TruncToInt(1.7*s0)` from the
  eager part of a partitioned graph) are distinct programs (their output bounds differ),
  never one cached executable for both.

The OpInfo sweep (test_bounded_dynamism_opinfo.py) marks dims 0 and 1 only, so it never
reaches spatial dims; this module does."""

from __future__ import annotations

import logging

import pytest
import torch
import torch.nn.functional as F

import torch_tpu
from torch_tpu.backend import _compile

TOL = {"atol": 1e-5, "rtol": 1e-5}
BOUND = 16
SIZES = (13, 4, BOUND)  # below the bound, the smallest allowed, at the bound

MODES = {
    1: [("nearest", None), ("nearest-exact", None), ("linear", False), ("linear", True)],
    2: [("nearest", None), ("nearest-exact", None), ("bilinear", False), ("bilinear", True), ("bicubic", False)],
    3: [("nearest", None), ("nearest-exact", None), ("trilinear", True)],
}
FORMS = ("scale", "recomputed", "size_of_other")


@pytest.fixture(autouse=True)
def _fresh():
    torch._dynamo.reset()
    _compile._reported_fallbacks.clear()
    yield
    torch._dynamo.reset()


def _interpolate(form: str, mode: str, align_corners, scale: float = 2.5):
    def fn(x, other):
        if form == "scale":
            return F.interpolate(x, scale_factor=scale, mode=mode, align_corners=align_corners)
        if form == "recomputed":
            return F.interpolate(x, scale_factor=scale, mode=mode, align_corners=align_corners,
                                 recompute_scale_factor=True)
        return F.interpolate(x, size=tuple(other.shape), mode=mode, align_corners=align_corners)

    return fn


def _check(fn, nd: int, sizes=SIZES) -> None:
    compiled = torch.compile(fn, backend="tpu")
    for n in sizes:
        g = torch.Generator().manual_seed(n)
        # Values away from 0, so a position that reads the zero padding cannot pass.
        x = torch.rand((2, 3) + (n,) * nd, generator=g) + 1
        other = torch.empty((n + 3,) * nd)
        # min=4: PyTorch guards small output sizes (trunc(0.6 * n) > 1) and would refuse
        # smaller ranges with ConstraintViolationError; the dims stay dynamic from 4 up.
        torch_tpu.mark_dynamic(x, list(range(2, 2 + nd)), min=4, max=BOUND)
        torch_tpu.mark_dynamic(other, list(range(nd)), min=4, max=BOUND + 3)
        torch.testing.assert_close(compiled(x, other), fn(x, other), **TOL, msg=f"size {n}")


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("nd, mode, align_corners", [(nd, m, a) for nd, modes in MODES.items() for m, a in modes])
def test_upsampling_along_dynamic_spatial_dims_equals_eager(nd, mode, align_corners, form):
    _check(_interpolate(form, mode, align_corners), nd)


@pytest.mark.parametrize("mode", ["nearest", "nearest-exact"])
def test_graphs_differing_only_in_a_size_value_are_distinct_programs(mode):
    """Scale 1.3 then 2.9 (scales no other test compiles: the executable cache is
    process-wide): the compiled part takes the output size as a value, so the two graphs
    have one structure; the second must not run the first's executable (its output bound,
    1.3 * 16, is below 2.9 * 16)."""
    for scale in (1.3, 2.9):
        torch._dynamo.reset()
        _check(_interpolate("scale", mode, None, scale), 2, sizes=(5, BOUND))


def test_an_index_past_the_end_clamps_to_the_run_time_last_element():
    """`_unsafe_index` one past the end: the static program's gather clamps it to the last
    element; the padded program must too, not read the padding (the last row came back
    as zeros)."""

    def fn(x):
        past = torch.arange(x.shape[0]) + 1
        before = torch.arange(3) - 1 - x.shape[1]  # one before the start, from the end
        return aten._unsafe_index(x, [past]), aten._unsafe_index(x, [None, before])

    def clamped(x):
        past = (torch.arange(x.shape[0]) + 1).clamp(max=x.shape[0] - 1)
        before = (torch.arange(3) - 1 - x.shape[1] + x.shape[1]).clamp(min=0)
        return x[past], x[:, before]

    static = torch.rand(6, 7) + 1
    torch.testing.assert_close(torch.compile(fn, backend="tpu")(static), clamped(static))
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend="tpu")
    for n in (5, 9, BOUND):
        x = torch.rand(n, n + 1) + 1
        torch_tpu.mark_dynamic(x, 0, min=4, max=BOUND)
        torch_tpu.mark_dynamic(x, 1, min=4, max=BOUND + 1)
        torch.testing.assert_close(compiled(x), clamped(x), msg=f"size {n}")


def test_nearest_upsampling_compiles_along_a_dynamic_dim(caplog):
    """Exactness is not bought with eager: nearest upsampling's decomposition (arange,
    scale, `_unsafe_index`) is compiled with the dims dynamic; only the size arithmetic
    in Python floats runs in eager."""
    with caplog.at_level(logging.WARNING, logger="torch_tpu"):
        _check(_interpolate("scale", "nearest", None), 2, sizes=(5, 11))
    fallen = [r.getMessage() for r in caplog.records if "cannot be compiled" in r.getMessage()]
    assert not any("_unsafe_index" in m or "arange" in m for m in fallen), fallen


aten = torch.ops.aten
