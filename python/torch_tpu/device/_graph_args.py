"""A compiled graph's tpu tensor arguments -> its program's device buffers, for the calls
that repeat: the reader `_graph_io.graph_caller` runs before every launch.

A tensor passes when it is its storage's buffer as it is: the storage's entry is found at
the tensor's data pointer (offset 0), the tensor has the program parameter's dtype and
shape, is contiguous, carries no negative or conjugate bit, and the entry's buffer is a
`DeviceBuffer` of that element type and shape on the program's device. Checked one tensor
at a time in Python that is ~0.8 us an argument on the development machine: ~145 us of a
decode step's 183 (parameters and caches), more on a TPU VM's host, where a decode step's
host time was within 10 % of its device time (88 % of the wall time; 75 % and 84 % in two
runs after this).

A repeated call passes the same tensors, with the same buffers except those the program
wrote (a decode step's caches). So after one call has passed the full check:

* the tensor side is PyTorch's own C++ tensor check (`TensorGuards`, what Dynamo's guards
  run: type, dispatch keys -- the neg and conj bits among them -- dtype, device,
  requires_grad, sizes and strides, recorded from that call's tensors), one call for all;
* the buffer side is an identity test per position (C loops through `map`), and only a
  position whose entry or buffer is not the one last checked is checked again. The
  buffers checked are held weakly: a strong reference here would keep a dead tensor's
  device memory and would count as a reader, stopping the donation of a written input
  (`_ops._donation_safe`).

A call the fast check rejects takes the full check. Its tensors become the new record
when the record served no call since the last rejection (the calls have moved on: a
tensor that changed requires_grad, another dispatch state); a record that still serves
calls is kept (calls alternating between two kinds of tensors: one kind takes the fast
check, the other the full one). Building a record costs about one full check (PyTorch's
check is made per tensor), so while records serve fewer than two calls each, the next
one is built after 1, 2, 4, ... up to 64 full checks, not on each. Without `TensorGuards`
(another PyTorch) every call takes the full check.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import compress
from operator import attrgetter, is_not
from typing import Any, Callable
from weakref import ref

import torch

from torch_tpu.runtime.buffer import DeviceBuffer

try:
    from torch._C._dynamo.guards import TensorGuards
except ImportError:  # a PyTorch without Dynamo's C++ guards: the full check every call
    TensorGuards = None

_data_ptr = torch.Tensor.data_ptr
_buffer_of_entry = attrgetter("_buffer")
_referent = ref.__call__
_MAX_BUILD_WAIT = 64  # full checks between two builds of records that serve nothing


def argument_reader(args: Sequence[tuple[tuple[int, ...], torch.dtype, Any]], device: Any,
                    entries: dict) -> Callable[[Sequence[Any]], tuple[list, list] | None]:
    """`read(tensors)` -> (buffers, entries) of a call's tensors, or None when one does not
    pass as its storage's buffer (see the module docstring). `args`: the program's
    parameters (shape, torch dtype, element type); `device`: the runtime device the
    program runs on; `entries`: the buffer table's address -> entry map."""
    checks = tuple((tuple(shape), dtype, row, dtype.is_complex) for shape, dtype, row in args)
    count = len(checks)
    positions = range(count)
    get = entries.get
    # (TensorGuards of the last fully checked call, its entries, weak references to their
    # buffers): replaced whole, so a call on another thread reads one consistent record.
    record: list[tuple[Any, list, list] | None] = [None]
    # Calls the record served since the last rejected one; full checks to let pass before
    # the next build, and how many passed (a race between threads only shifts when a
    # record is built).
    served = [0]
    backoff = [0, 0]

    def build_now() -> bool:
        if record[0] is None:
            return True
        if served[0]:  # still serving calls: kept
            if served[0] > 1:  # it paid for its build (a fast check saves ~2/3 of a full one)
                backoff[0] = backoff[1] = 0
            served[0] = 0
            return False
        wait, waited = backoff
        if waited < wait:
            backoff[1] = waited + 1
            return False
        backoff[0], backoff[1] = min(max(1, 2 * wait), _MAX_BUILD_WAIT), 0
        return True

    def buffer_passes(entry: Any, buffer: Any, k: int) -> bool:
        shape, dtype, row, _ = checks[k]
        return (buffer.__class__ is DeviceBuffer and entry.dtype is dtype and buffer._row is row
                and buffer.device is device and buffer.shape == shape)

    def full(tensors: Sequence[Any]) -> tuple[list, list] | None:
        buffers = []
        found = []
        for k, (t, (shape, dtype, _, complex_)) in enumerate(zip(tensors, checks)):
            # A storage's own address is its key: a tensor at another offset points inside
            # its storage, where no storage starts (each has its own address range), and an
            # empty one reports 0, so a hit means offset 0.
            entry = get(t.data_ptr())
            if entry is None:
                return None
            buffer = entry._buffer
            if (t.dtype is not dtype or t.shape != shape or not t.is_contiguous() or t.is_neg()
                    or (complex_ and t.is_conj()) or not buffer_passes(entry, buffer, k)):
                return None
            buffers.append(buffer)
            found.append(entry)
        if TensorGuards is not None and len(tensors) == count and build_now():
            record[0] = (_tensor_guards(tensors), found, list(map(ref, buffers)))
            served[0] = 0
        return buffers, found

    def read(tensors: Sequence[Any]) -> tuple[list, list] | None:
        last = record[0]
        if last is None or len(tensors) != count or not last[0].check(*tensors):
            return full(tensors)
        guards, last_found, last_refs = last
        found = list(map(get, map(_data_ptr, tensors)))
        if None in found:
            return None
        buffers = list(map(_buffer_of_entry, found))
        changed = set(compress(positions, map(is_not, buffers, map(_referent, last_refs))))
        changed.update(compress(positions, map(is_not, found, last_found)))
        if changed:
            refs = list(last_refs)
            for k in changed:
                buffer = buffers[k]
                if not buffer_passes(found[k], buffer, k):
                    return None
                refs[k] = ref(buffer)
            record[0] = (guards, found, refs)
        served[0] += 1
        return buffers, found

    return read


def _tensor_guards(tensors: Sequence[torch.Tensor]) -> Any:
    """PyTorch's C++ check of `tensors`' type, dispatch keys, dtype, device,
    requires_grad, sizes and strides as they are now (every size and stride static)."""
    return TensorGuards(*tensors, dynamic_dims_sizes=[list(t.shape) for t in tensors],
                        dynamic_dims_strides=[list(t.stride()) for t in tensors],
                        tensor_check_names=[f"argument {k}" for k in range(len(tensors))])
