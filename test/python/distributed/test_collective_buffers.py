"""How tpu_dist hands tensors to its collective programs and takes the results back
(single process: no collective runs). A tensor that is its whole storage -- DDP's
gradient buckets, parameters, a freshly made tensor -- goes in as its storage's own
buffer (a storage kept in a 2-D tensor's shape: its flat copy, made once per value and
cached) and takes the output by rebinding the storage: no device copy of a bucket.
Any other tensor (a slice, a transposed or conjugated view, a dtype view) goes through a
copy of its elements and takes the result through a device `copy_`."""

from __future__ import annotations

import pytest
import torch

import torch_tpu  # noqa: F401 - registers the tpu device
from torch_tpu.device import _storage
from torch_tpu.distributed import _process_group as pg

BASE = torch.arange(24, dtype=torch.float32).reshape(4, 6)


def _covering_tensors():
    t = BASE.to("tpu")
    return {
        "fresh": t,
        "reshaped view of the whole storage": t.view(24),
        "int bucket": torch.arange(7, dtype=torch.int32).to("tpu"),
    }


def _partial_views():
    t = BASE.to("tpu")
    return {
        "column": (t[:, 2], BASE[:, 2]),
        "offset slice": (t[1:3], BASE[1:3]),
        "transposed": (t.t(), BASE.t()),
        "conjugated complex": (torch.complex(BASE, -BASE).to("tpu").conj(), torch.complex(BASE, -BASE).conj()),
        "negated view": (torch.complex(BASE, BASE).to("tpu").conj().imag, torch.complex(BASE, BASE).conj().imag),
    }


@pytest.mark.parametrize("name", list(_covering_tensors()))
def test_a_tensor_covering_its_storage_goes_in_as_its_buffer_flat(name):
    t = _covering_tensors()[name]
    buffer = pg._flat_buffer(t)
    entry = _storage.entry_of(t)
    if len(entry.shape) == 1:
        assert buffer is entry.buffer  # a flat storage's own buffer, not a copy
    else:
        # A shaped storage (`_buffers.py`) is reshaped on the device once per value.
        assert buffer.shape == (t.numel(),) and pg._flat_buffer(t) is buffer
    assert torch.equal(pg._as_tensor(buffer, t.shape, t.dtype).cpu(), t.cpu())


@pytest.mark.parametrize("name", list(_partial_views()))
def test_a_partial_view_goes_in_as_its_own_elements_in_order(name):
    view, want = _partial_views()[name]
    buffer = pg._flat_buffer(view)
    assert buffer is not _storage.entry_of(view).buffer
    assert buffer.shape == (view.numel(),)
    got = pg._as_tensor(buffer, view.shape, view.dtype).cpu()
    assert torch.equal(got, want.resolve_conj().resolve_neg())


def test_a_result_rebinds_a_covering_tensor_and_every_view_sees_it():
    t = BASE.to("tpu")
    column = t[:, 2]  # a view made before the write
    result = pg._flat_buffer((BASE * 10).to("tpu"))
    pg._write_result(t, result)
    assert _storage.entry_of(t).buffer is result  # rebound: no device copy
    assert torch.equal(t.cpu(), BASE * 10)
    assert torch.equal(column.cpu(), (BASE * 10)[:, 2])


def test_a_result_is_copied_into_a_partial_view_and_leaves_the_rest():
    t = BASE.to("tpu")
    before = _storage.entry_of(t).buffer
    column = t[:, 2]
    result = pg._flat_buffer(torch.full((4,), -1.0).to("tpu"))
    pg._write_result(column, result)
    want = BASE.clone()
    want[:, 2] = -1.0
    assert torch.equal(t.cpu(), want)
    assert _storage.entry_of(t).buffer is not result
    assert before is not result


def test_a_dtype_mismatched_result_is_not_rebound():
    # A tensor whose dtype differs from its storage's (a dtype view) never takes the
    # buffer as is: rebinding would relabel the storage's bytes.
    t = torch.arange(4, dtype=torch.int32).to("tpu")
    view = t.view(torch.float32)
    entry = _storage.entry_of(view)
    assert entry.dtype == torch.int32 and view.dtype == torch.float32  # the storage keeps its dtype
    assert not pg._covers(view, entry)


def test_a_tensor_value_of_another_dtype_is_converted_not_rebound():
    # _write and _write_result are one rule (_take): a value of another dtype than the
    # target's is copied with conversion, never rebound (its bytes would be relabelled).
    t = torch.zeros(4, dtype=torch.float64).to("tpu")
    value = torch.arange(4, dtype=torch.float32).to("tpu")
    pg._write(t, value)
    assert _storage.entry_of(t).buffer is not _storage.entry_of(value).buffer
    assert t.dtype == torch.float64 and torch.equal(t.cpu(), torch.arange(4, dtype=torch.float64))


def test_a_tensor_value_rebinds_a_covering_target_as_a_result_buffer_does():
    t = BASE.to("tpu")
    row_view = t[1]
    value = (BASE + 100).to("tpu")
    pg._write(t, value)
    assert _storage.entry_of(t).buffer is _storage.entry_of(value).buffer  # rebound, no copy
    assert torch.equal(row_view.cpu(), (BASE + 100)[1])
    # a non-contiguous value goes in as its elements in order (one copy), still rebinding
    u = BASE.to("tpu")
    strided = (BASE * 2).t().contiguous().to("tpu").t()
    assert not strided.is_contiguous()
    pg._write(u, strided)
    assert torch.equal(u.cpu(), BASE * 2)


@pytest.mark.parametrize("target", ["covering", "view"])
def test_taking_a_result_leaves_autograd_version_as_c10d_does(target):
    """c10d's collectives write below autograd's ADInplaceOrView key: a collective on a
    tensor autograd saved (or a view of one) does not make backward raise "modified by
    an inplace operation". The copy branch (a view) bumped the version counter."""
    w = torch.ones(4, device="tpu", requires_grad=True)
    x = w * 3
    y = (x * x).sum()  # saves x
    out = x if target == "covering" else x[1:]
    with torch.no_grad():
        result = pg._flat_buffer(torch.full((out.numel(),), 5.0).to("tpu"))
    pg._write_result(out, result)
    assert x._version == 0
    want = torch.full((4,), 5.0) if target == "covering" else torch.tensor([3.0, 5.0, 5.0, 5.0])
    assert torch.equal(x.detach().cpu(), want)
    y.backward()  # as on CPU with gloo: the saved tensor's new value, no error
    assert torch.equal(w.grad.cpu(), 2 * want * 3)


def test_a_result_of_another_element_count_is_a_named_error():
    """A result that does not fit its output raised reshape's "shape '[4]' is invalid for
    input of size 3", naming no collective; `_issue` names the collective."""
    t = torch.zeros(4, device="tpu")
    result = pg._flat_buffer(torch.ones(3).to("tpu"))
    with pytest.raises(ValueError, match=r"its result has 3 elements, the output tensor \(\[4\]\) has 4"):
        pg._write_result(t, result)
    with pytest.raises(ValueError, match=r"its result has 3 elements"):
        pg._write(t[:2], torch.ones(3).to("tpu"))
    assert torch.equal(t.cpu(), torch.zeros(4))
