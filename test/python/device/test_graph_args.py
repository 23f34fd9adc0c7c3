"""A compiled graph's tpu tensor arguments read as their storages' buffers
(`device/_graph_args.py`): after one fully checked call, a repeated call is checked by
PyTorch's C++ tensor check and an identity test per position; whatever the full check
refuses, the fast check refuses too."""

import gc
import sys
import weakref

import pytest
import torch

import torch_tpu.device  # noqa: F401 - registers the device where autoload is off
from torch_tpu.device import _graph_args
from torch_tpu.device._buffers import TABLE, entry_of


@pytest.fixture(params=["tensor guards", "python only"])
def reader_kind(request, monkeypatch):
    if request.param == "python only":
        monkeypatch.setattr(_graph_args, "TensorGuards", None)
    return request.param


def _reader(tensors):
    specs = [(tuple(t.shape), t.dtype, entry_of(t).buffer._row) for t in tensors]
    return _graph_args.argument_reader(specs, entry_of(tensors[0]).buffer.device, TABLE._entries)


def _tensors():
    return [torch.randn(4, 3, device="tpu"), torch.randn(5, device="tpu"),
            torch.randn(2, 2, dtype=torch.complex64, device="tpu")]


def test_a_repeated_call_reads_each_storage_s_current_buffer(reader_kind):
    tensors = _tensors()
    read = _reader(tensors)
    for _ in range(3):
        buffers, entries = read(tensors)
        assert buffers == [entry_of(t).buffer for t in tensors]
        assert entries == [entry_of(t) for t in tensors]
    tensors[1].add_(1)  # the storage takes a new buffer (the op's result)
    buffers, _ = read(tensors)
    assert buffers[1] is entry_of(tensors[1]).buffer
    torch.testing.assert_close(buffers[1].to_torch(), tensors[1].cpu())


@pytest.mark.parametrize("make", [
    pytest.param(lambda t: t.t().contiguous().t(), id="transposed"),
    pytest.param(lambda t: t.double(), id="dtype"),
    pytest.param(lambda t: torch._neg_view(t), id="negative bit"),
    pytest.param(lambda t: t.conj(), id="conjugate bit"),
    pytest.param(lambda t: t.reshape(1, -1), id="shape"),
    pytest.param(lambda t: torch.cat([t.reshape(-1), t.reshape(-1)])[1:t.numel() + 1].view(t.shape),
                 id="offset"),
    pytest.param(lambda t: t.cpu(), id="cpu"),
])
def test_a_tensor_that_is_not_its_storage_s_buffer_is_refused_after_fast_calls(reader_kind, make):
    tensors = _tensors()
    read = _reader(tensors)
    for _ in range(2):
        assert read(tensors) is not None
    refused = 0
    for position in range(3):
        other = list(tensors)
        changed = make(tensors[position])
        same = tensors[position]
        if (changed.dtype == same.dtype and changed.device == same.device
                and changed.shape == same.shape and changed.is_contiguous() and not changed.is_neg()
                and not changed.is_conj() and changed.storage_offset() == 0):
            continue  # (the conjugate of a real tensor is itself)
        other[position] = changed
        assert read(other) is None
        assert read(tensors) is not None  # and the record still serves the passing call
        refused += 1
    assert refused


def test_a_storage_whose_buffer_no_longer_has_the_parameter_s_shape_is_refused(reader_kind):
    tensors = _tensors()
    read = _reader(tensors)
    for _ in range(2):
        assert read(tensors) is not None
    entry = entry_of(tensors[0])
    kept = entry.buffer
    flat = torch.randn(12, device="tpu")  # the same bytes as a 1-D buffer
    entry.buffer = entry_of(flat).buffer
    assert read(tensors) is None
    entry.buffer = kept
    assert read(tensors) is not None


def test_a_tensor_that_starts_requiring_grad_still_passes_and_becomes_the_record(reader_kind):
    tensors = _tensors()
    read = _reader(tensors)
    assert read(tensors) is not None
    tensors[0].requires_grad_(True)
    for _ in range(2):
        buffers, _ = read(tensors)
        assert buffers[0] is entry_of(tensors[0]).buffer


def test_the_reader_holds_no_buffer_so_donation_and_freeing_see_the_real_holders(reader_kind):
    """A strong reference would count as a reader in `_ops._donation_safe` (no donation of
    a written cache) and keep a dead tensor's device memory."""
    tensors = _tensors()
    read = _reader(tensors)
    before = [sys.getrefcount(entry_of(t).buffer) for t in tensors]
    for _ in range(3):
        got = read(tensors)
    del got
    assert [sys.getrefcount(entry_of(t).buffer) for t in tensors] == before
    gone = weakref.ref(entry_of(tensors[0]).buffer)
    del tensors[0]
    gc.collect()
    assert gone() is None


def test_alternating_kinds_of_tensors_keep_the_record_and_build_rarely(monkeypatch):
    """A record that serves every other call is kept (the other calls take the full check);
    while records serve fewer than two calls, the next is built after 1, 2, 4, ... up to 64
    full checks, not on every call: building costs about one full check."""
    builds = []
    real = _graph_args._tensor_guards
    monkeypatch.setattr(_graph_args, "_tensor_guards", lambda ts: builds.append(1) or real(ts))
    tensors = _tensors()
    other = list(tensors)
    other[0] = torch.randn(4, 3, device="tpu").requires_grad_(True)  # passes; another record
    read = _reader(tensors)
    for _ in range(20):
        assert read(tensors)[0][0] is entry_of(tensors[0]).buffer
        assert read(other)[0][0] is entry_of(other[0]).buffer
    assert len(builds) <= 2  # the first record, and at most one of the other kind

    builds.clear()
    kinds = [list(tensors) for _ in range(4)]
    for k, kind in enumerate(kinds):
        kind[1] = torch.randn(5, device="tpu").requires_grad_(k % 2 == 0)
        kind[2] = torch.randn(2, 2, dtype=torch.complex64, device="tpu").requires_grad_(k >= 2)
    for _ in range(16):  # four kinds in turn: no record serves any call
        for kind in kinds:
            assert read(kind)[0][1] is entry_of(kind[1]).buffer
    assert 3 <= len(builds) <= 10, builds

    builds.clear()
    for _ in range(70):  # the calls settle on one kind: within 64 full checks, its record
        assert read(other) is not None
    assert len(builds) == 1
