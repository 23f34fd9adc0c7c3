"""`ProcessGroupTPU`: the `tpu_dist` backend, a Python `torch.distributed.ProcessGroup`.

Every collective is a compiled StableHLO collective program
(`torch_tpu.compiler.collective_programs`, lowered by `torchtpu-lower-collectives`) run
on the tensors' device buffers, one replica per process of the group. Programs work on
flat buffers (a dense tensor's elements in order), so all_gather/reduce_scatter/
all_to_all along dim 0 are the same program for every shape with the same element count;
they are cached per (collective, element count, dtype, reduce op, src, group).

What XLA:CPU lacks is composed from what it has (see docs/explanation/distributed.md):
broadcast, scatter = all-gather + slice (exact bits); reduce = all-reduce kept on dst;
gather = all-gather kept on dst; uneven all_to_all = split sizes exchanged by an
all-gather, chunks padded to the largest, one all_to_all, then sliced; send/recv = a
two-replica collective_permute; barrier = a one-element all-reduce, waited for;
BAND/BOR/BXOR = reductions of bit planes (min/max/sum of 0/1 bytes).
"""

from __future__ import annotations

import datetime
import functools
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.distributed as dist

from torch_tpu.core import config
from torch_tpu.core.user_frames import innermost_user_frame

from . import _launch

_REDUCE_OPS = {
    dist.ReduceOp.SUM: "sum",
    dist.ReduceOp.AVG: "avg",
    dist.ReduceOp.PRODUCT: "product",
    dist.ReduceOp.MIN: "min",
    dist.ReduceOp.MAX: "max",
    dist.ReduceOp.BAND: "band",
    dist.ReduceOp.BOR: "bor",
    dist.ReduceOp.BXOR: "bxor",
}

# p2p "groups": one sequence counter per channel (`p2p_channel`).
_p2p_sequences: dict[str, int] = {}
_p2p_lock = threading.Lock()


def p2p_channel(ranks: tuple[int, int], world_incarnation: int) -> str:
    """The handshake name of the point-to-point channel between two processes (global ranks,
    sorted): one per pair, shared by every group, and per making of the world group
    (`DistributedRuntime.world_incarnation`), so that a re-initialised job's sends and
    receives start their sequence afresh and never meet the old job's records."""
    from torch_tpu.runtime.distributed import incarnation

    return incarnation(f"p2p-{ranks[0]}-{ranks[1]}", world_incarnation)


class TPUWork(dist.Work):
    """A collective already enqueued on the device. `wait()` blocks until its outputs are
    computed and raises its error (an error raised while issuing it, too) -- a plain
    future-backed Work would only log it."""

    def __init__(self, buffers: Sequence[Any] = (), result: Any = None, error: BaseException | None = None,
                 failed: Callable[[Any, BaseException], BaseException] | None = None) -> None:
        super().__init__()
        self._buffers = list(buffers)
        self._result = result if result is not None else []
        self._error = error
        self._failed = failed  # (buffer, its error) -> the error naming its collective
        self._done = False

    def wait(self, timeout: datetime.timedelta | None = None) -> bool:
        if self._error is not None:
            raise self._error
        if not self._done:
            for buffer in self._buffers:
                try:
                    buffer.synchronize()
                except Exception as err:  # noqa: BLE001 - re-raised with the collective named
                    self._error = (self._failed(buffer, err) if self._failed is not None else
                                   RuntimeError(f"tpu_dist: the collective failed on the device: {err}"))
                    raise self._error from None
            self._done = True
        return True

    def is_completed(self) -> bool:
        return self._done or self._error is not None

    def is_success(self) -> bool:
        return self._done and self._error is None

    def exception(self) -> BaseException | None:
        return self._error

    def result(self) -> list[torch.Tensor]:
        return list(self._result)

    def get_future(self) -> torch.futures.Future:
        future: torch.futures.Future = torch.futures.Future()
        try:
            self.wait()
        except Exception as err:  # noqa: BLE001 - the future carries it
            future.set_exception(err)
        else:
            future.set_result(list(self._result))
        return future


# -- tensors <-> flat device buffers ------------------------------------------------------------


def _check_tpu(tensors: Sequence[torch.Tensor], what: str) -> None:
    for t in tensors:
        if not isinstance(t, torch.Tensor) or t.device.type != "tpu":
            where = t.device if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(
                f"tpu_dist {what}: expected tpu tensors (or only CPU tensors, which go to gloo), "
                f"got one on {where}. Move it with .to('tpu')"
            )


def _covers(t: torch.Tensor, entry) -> bool:
    """Whether `t` is its whole storage, elements in order: its storage's buffer is its
    flat value, and rebinding the storage writes it (every view sees the write)."""
    return (
        t.dtype == entry.dtype and t.storage_offset() == 0 and t.numel() == entry.numel and t.is_contiguous()
    )


def _flat_buffer(t: torch.Tensor):
    """A DeviceBuffer with `t`'s elements in row-major order, shape (numel,): the storage's
    own buffer when `t` covers it (no copy: DDP's buckets, parameters, gradients; a
    storage kept in another shape is reshaped on the device: `_graph_io.flat_buffer`),
    else a device copy of the elements."""
    from torch_tpu.device import _graph_io, _storage

    entry = _storage.entry_of(t)
    if _covers(t, entry) and not (t.is_conj() or t.is_neg()):
        return _graph_io.flat_buffer(entry)
    c = t.detach()
    if t.is_conj() or t.is_neg():
        c = c.resolve_conj().resolve_neg()
    c = c.contiguous()
    entry = _storage.entry_of(c)
    if c.storage_offset() != 0 or entry.numel != c.numel() or entry.dtype != c.dtype:
        c = c.clone()
        entry = _storage.entry_of(c)
    return _graph_io.flat_buffer(entry)


def _as_tensor(buffer, shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
    from torch_tpu.device import _storage

    size = [int(s) for s in shape]
    numel = 1
    for s in size:
        numel *= s
    return _storage.new_tensor(buffer, numel, size, list(_storage.contiguous_stride(size)), dtype, 0)


def _take(target: torch.Tensor, dtype: torch.dtype, numel: int, buffer: Callable[[], Any],
          value: Callable[[], torch.Tensor]) -> None:
    """The one rule by which `target` (any tpu tensor, possibly a view) takes a result in
    place. The result has `numel` elements of `dtype`, in order; `buffer()` gives them as a
    DeviceBuffer (flat, or a covering value's storage buffer in its shape), `value()` as a
    tensor. When `target` covers its storage and the
    result has its dtype and element count, the storage is rebound to `buffer()` (no
    device copy; every view sees it); otherwise `value()` is copied into `target` (a
    device `copy_`, converting the dtype as PyTorch's copy does). A result of another
    element count raises `_ResultSizeError` (`_issue` names the collective).

    Neither way bumps autograd's version counter: c10d's collectives write their outputs
    below the ADInplaceOrView key, so a tensor autograd saved (or a view of one) does not
    make backward raise "modified by an inplace operation" after a collective."""
    from torch_tpu.device import _storage

    if numel != target.numel():
        raise _ResultSizeError(
            f"its result has {numel} elements, the output tensor ({list(target.shape)}) has {target.numel()}; "
            "give an output of the result's size"
        )
    entry = _storage.entry_of(target)
    if dtype == target.dtype and _covers(target, entry):
        entry.buffer = buffer()
        return
    with torch.no_grad(), torch._C._AutoDispatchBelowADInplaceOrView():
        target.copy_(value().reshape(target.shape))


class _ResultSizeError(ValueError):
    """A collective's result does not fit the output tensor it is written to."""


def _elements_buffer(t: torch.Tensor):
    """A DeviceBuffer with `t`'s elements in row-major order, of any shape: the storage's
    own buffer when `t` covers it (whatever shape the storage keeps it in: the element
    order is the same), else `_flat_buffer(t)`."""
    from torch_tpu.device import _storage

    entry = _storage.entry_of(t)
    if _covers(t, entry) and not (t.is_conj() or t.is_neg()):
        return _storage.buffer_of(entry)
    return _flat_buffer(t)


def _write(target: torch.Tensor, value: torch.Tensor) -> None:
    """`target` takes the tensor `value`'s elements (`_take`)."""
    _take(target, value.dtype, value.numel(), lambda: _elements_buffer(value), lambda: value)


def _write_result(target: torch.Tensor, buffer) -> None:
    """`target` takes a program's flat output `buffer` of `target`'s dtype (`_take`): a
    covering tensor without making a tensor of it (the per-call path of all_reduce and
    broadcast)."""
    _take(target, target.dtype, buffer.shape[0], lambda: buffer,
          lambda: _as_tensor(buffer, target.shape, target.dtype))


def _check_gathered_outputs(what: str, outputs: Sequence[torch.Tensor], input: torch.Tensor, size: int) -> None:
    """Each rank's output of an all_gather / gather takes one rank's input: as gloo, every
    output must have the input's element count (checked before the collective runs)."""
    _check_one_per_rank(what, "output", outputs, "input", input, size)


def _check_scattered_inputs(inputs: Sequence[torch.Tensor], output: torch.Tensor, size: int) -> None:
    """The source's scatter list: one input per rank, each of the output's element count."""
    _check_one_per_rank("scatter", "input", inputs, "output", output, size)


def _check_one_per_rank(what: str, kind: str, tensors: Sequence[torch.Tensor], reference_kind: str,
                        reference: torch.Tensor, size: int) -> None:
    if len(tensors) != size:
        raise ValueError(f"tpu_dist {what}: {len(tensors)} {kind} tensors for {size} ranks; give one per rank")
    for i, t in enumerate(tensors):
        if t.numel() != reference.numel():
            raise ValueError(
                f"tpu_dist {what}: {kind} {i} ({list(t.shape)}) has {t.numel()} elements, expected "
                f"{reference.numel()} (the {reference_kind}'s, {list(reference.shape)})"
            )


def _element(dtype: torch.dtype) -> str:
    from torch_tpu.runtime import dtypes

    return dtypes.from_torch(dtype).mlir


# -- the process group ----------------------------------------------------------------------------


class ProcessGroupTPU(dist.ProcessGroup):
    """`tpu_dist`: collectives of tpu tensors as XLA collective programs."""

    def __init__(self, rank: int, size: int, global_ranks: Sequence[int], group_name: str,
                 timeout: datetime.timedelta | None, handshake_name: str | None = None) -> None:
        super().__init__(rank, size)
        self._global_ranks = tuple(int(r) for r in global_ranks)
        self._name = group_name or "default"
        # What the handshake's keys are under: unique per making of a group of this name
        # (`DistributedRuntime.incarnation_name`).
        self._handshake_name = handshake_name or self._name
        self._timeout_s = timeout.total_seconds() if isinstance(timeout, datetime.timedelta) else 300.0
        self._sequence = 0
        # (group, `CollectiveRecord.identity`) already compared under the `first_call` stage.
        self._checked_calls: set[tuple[str, tuple[str, str, str]]] = set()
        self._lock = threading.RLock()
        self._store = None
        self._gloo = None
        self._group_name = self._group_desc = self._name
        from torch_tpu.runtime import distributed

        runtime = distributed.current()
        if runtime is None:
            raise RuntimeError("tpu_dist: the distributed runtime is not initialized")
        self._runtime = runtime

    def _cpu_backend(self):
        """gloo over the same ranks, for CPU tensors (made on the first CPU collective)."""
        with self._lock:
            if self._gloo is None:
                store = dist.PrefixStore("tpu_dist_cpu/", self._store)
                timeout = datetime.timedelta(seconds=self._timeout_s)
                self._gloo = dist.ProcessGroupGloo(store, self.rank(), self.size(), timeout)
            return self._gloo

    # C++ keeps a group's name on its backends, and a Python group has none: PyTorch's
    # `_set_group_name` would be lost and `group_name` (DeviceMesh, FSDP2) would raise.
    def _set_group_name(self, name: str) -> None:
        self._group_name = name

    @property
    def group_name(self) -> str:
        return self._group_name

    def _set_group_desc(self, desc: str) -> None:
        self._group_desc = desc

    @property
    def group_desc(self) -> str:
        return self._group_desc

    def getBackendName(self) -> str:  # noqa: N802 - PyTorch's name
        return "tpu_dist"

    def name(self) -> str:
        return "tpu_dist"

    def __repr__(self) -> str:
        return f"ProcessGroupTPU(group {self._name}, ranks {list(self._global_ranks)}, rank {self.rank()})"

    @property
    def group_ranks(self) -> tuple[int, ...]:
        return self._global_ranks

    # -- running programs ----------------------------------------------------------------------

    def _program(self, kind: str, numel: int, dtype: torch.dtype, ranks: tuple[int, ...], **params: Any):
        """The group program of one collective, compiled through `compile_module` (cached
        once per parameters and runtime: the program holds its runtime, so the runtime's
        id in the key cannot be reused while the entry lives)."""
        from torch_tpu.compiler.collective_programs import (
            CollectiveProgramError, collective_source, program_text, rejection,
        )
        from torch_tpu.program import ProgramKey, compile_module
        from torch_tpu.program.pipelines import collective_pipeline

        name = f"tpu_dist.{kind}({numel} x {dtype})"
        subject = (kind, numel, str(dtype), ranks, tuple(sorted(params.items())), id(self._runtime))
        try:
            compiled = compile_module(
                lambda: collective_source(kind, [numel], _element(dtype), len(ranks), **params),
                key=ProgramKey("collective", subject), name=name, pipeline=collective_pipeline(),
                rejected=rejection,
                compiler=lambda module: self._group_program(module, program_text, kind, numel, dtype, ranks, params),
            )
        except CollectiveProgramError as err:
            raise ValueError(f"tpu_dist {kind}: {err}") from None
        return compiled.executable

    def _group_program(self, module, program_text, kind: str, numel: int, dtype: torch.dtype,
                       ranks: tuple[int, ...], params: dict[str, Any]):
        """The lowered `module` compiled over `ranks`, with what the handshake compares."""
        from torch_tpu.runtime.distributed import fingerprint_of

        text = program_text(module)
        program = self._runtime.compile_group_program(text, ranks, f"tpu_dist.{kind}({numel} x {dtype})")
        description = _describe(kind, numel, dtype, params, ranks)
        return program.label(description, fingerprint_of(text, description))

    def _collective(self, kind: str, buffer, dtype: torch.dtype, **params: Any):
        """Runs one collective of this group on this rank's flat buffer; returns the output."""
        with self._lock:
            self._sequence += 1
            sequence = self._sequence
        program = self._program(kind, buffer.shape[0], dtype, self._global_ranks, **params)
        return self._checked_run(self._handshake_name, self._global_ranks, sequence, program, program, [buffer])[0]

    def _checked_run(self, group: str, ranks: tuple[int, ...], sequence: int, checked_as: HandshakeSubject,
                     program, buffers: Sequence[Any]) -> list:
        """Runs `program` as collective `sequence` of `group`, after the handshake when the
        stage asks for one. What the ranks compare (`CollectiveRecord.identity`): the
        program (`checked_as`: its fingerprint and description), the user's call (the
        torch.distributed operation and its tensors' shapes) and its call site. Under
        `first_call` a handshake runs at each (program, call, call site)'s first run in the
        group: the same record on every rank that runs the same code, so the ranks agree on
        which calls they check -- and a collective that one rank reaches from a line the
        others do not is checked where it pairs."""
        record = self._record(sequence, checked_as)
        stage = config.get("TORCH_TPU_SPMD_HANDSHAKE_STAGE")
        if stage != "off":
            key = (group, record.identity)
            if stage == "every_call" or key not in self._checked_calls:
                self._runtime.handshake(group, ranks, record, self._timeout_s)
                self._checked_calls.add(key)
        outs = program.run(buffers, group, record, ranks)
        if getattr(_issuing, "call", None) is not None:
            _issuing.runs.extend((out, group, ranks, record) for out in outs)
        return outs

    def _record(self, sequence: int, program: HandshakeSubject):
        """This rank's record of collective `sequence`: the program, the torch.distributed
        call being issued (`_issue`'s, none for a compiled graph's stage), and the user's
        line; its call site is compared unless the ranks may legitimately call from
        different lines (a rooted collective, send/recv)."""
        where = user_frame()
        texts = _site_texts.get(where)
        if texts is None:
            path, lineno = where
            texts = _site_texts[where] = (f"{path}:{lineno}" if lineno else path, f"{_basename(path)}:{lineno}")
        line, site = texts
        call = getattr(_issuing, "call", None)
        if call is None:
            text = ""
        else:
            text = _call_texts.get(call[:2])
            if text is None:
                what, shapes = call[:2]
                text = _call_texts[call[:2]] = (
                    f"{what} of {', '.join(str(list(s)) for s in shapes)}" if shapes else what)
            if call[2]:
                site = ""
        return self._runtime.record_type(self._runtime.rank, sequence, program.fingerprint, program.description,
                                         line, text, site)

    def run_program(self, program: HandshakeSubject, buffers: Sequence[Any], sizes: str = "") -> list:
        """Runs a collective program compiled elsewhere -- a stage of a compiled graph
        (`torch_tpu.backend._dist_graph`), which every member runs -- as this group's next
        collective: it takes the next sequence number and goes through the handshake as
        the group's own programs do (`program` carries `fingerprint` and `description`).
        `sizes` ("s0=3"): the run-time sizes a bounded program exchanges, which its text
        does not show; checked as part of what the ranks compare."""
        with self._lock:
            self._sequence += 1
            sequence = self._sequence
        checked_as = _with_sizes(program, sizes) if sizes else program
        return self._checked_run(self._handshake_name, self._global_ranks, sequence, checked_as, program, buffers)

    def _issue(self, what: str, tensors: Sequence[torch.Tensor], body: Callable[[], tuple[list, list]],
               rooted: bool = False, shapes: bool = True) -> TPUWork:
        """Runs `body` (which enqueues the programs and returns (buffers to wait for,
        result tensors)); an error becomes the Work's, raised by `wait()`. While it runs,
        `what` and the tensors' shapes (`shapes`: False where ranks legitimately pass
        different sizes, all_to_all's splits) are the call its collectives' handshake records
        name and compare; `rooted`: the ranks may call it from different lines (a root and
        the others, a send and its receive), so the call site is not compared. A call
        issued inside another (all_to_all runs as all_to_all_single) keeps the outer one's."""
        outer = getattr(_issuing, "call", None)
        try:
            _check_tpu(tensors, what)
            if outer is None:
                _issuing.call = (what, tuple(t.shape for t in tensors) if shapes else (), rooted)
                _issuing.runs = []
            buffers, result = body()
            return TPUWork(buffers, result, failed=self._explainer(_issuing.runs))
        except _ResultSizeError as err:
            return TPUWork(error=ValueError(f"tpu_dist {what}: {err}"))
        except Exception as err:  # noqa: BLE001 - re-raised by wait()
            return TPUWork(error=err)
        finally:
            if outer is None:
                _issuing.call = None

    def _explainer(self, runs: list) -> Callable[[Any, BaseException], BaseException]:
        """What `TPUWork.wait` raises when output `buffer` fails: the collective that made
        it, named with its group and line (`DistributedRuntime.collective_failed`)."""
        runtime = self._runtime

        def explain(buffer, err: BaseException) -> BaseException:
            for out, group, ranks, record in runs:
                if out is buffer:
                    return runtime.collective_failed(group, ranks, record, err)
            return RuntimeError(f"tpu_dist: the collective failed on the device: {err}")

        return explain

    def _reduce_op(self, op: Any) -> str:
        # opts.reduceOp is a ReduceOp object; it compares equal to its RedOpType. (Comparing
        # is as fast as a dict lookup of its `op`: 2-4 us a call either way, measured.)
        name = next((n for kind, n in _REDUCE_OPS.items() if op == kind), None)
        if name is None:
            raise ValueError(f"tpu_dist: reduce op {op} is not supported (premul_sum: multiply first, then SUM)")
        return name

    # -- collectives ----------------------------------------------------------------------------

    def allreduce(self, tensors, opts=None):
        op = self._reduce_op(opts.reduceOp if opts is not None else dist.ReduceOp.SUM)

        def body():
            outs = []
            for t in tensors:
                if t.numel() == 0:
                    continue
                out = self._collective("all_reduce", _flat_buffer(t), t.dtype, reduce_op=op)
                _write_result(t, out)
                outs.append(out)
            return outs, list(tensors)

        return self._issue("all_reduce", tensors, body)

    def allreduce_coalesced(self, tensors, opts=None):
        return self.allreduce(tensors, opts)

    def broadcast(self, tensors, opts=None):
        src = opts.rootRank if opts is not None else 0

        def body():
            outs = []
            for t in tensors:
                if t.numel() == 0:
                    continue
                out = self._collective("broadcast", _flat_buffer(t), t.dtype, src=src)
                if self.rank() != src:
                    _write_result(t, out)
                outs.append(out)
            return outs, list(tensors)

        return self._issue("broadcast", tensors, body, rooted=True)

    def reduce(self, tensors, opts=None):
        op = self._reduce_op(opts.reduceOp if opts is not None else dist.ReduceOp.SUM)
        dst = opts.rootRank if opts is not None else 0

        def body():
            outs = []
            for t in tensors:
                if t.numel() == 0:
                    continue
                out = self._collective("all_reduce", _flat_buffer(t), t.dtype, reduce_op=op)
                if self.rank() == dst:
                    _write_result(t, out)
                outs.append(out)
            return outs, list(tensors)

        return self._issue("reduce", tensors, body, rooted=True)

    def _gathered(self, t: torch.Tensor):
        """All ranks' `t`, concatenated along a new leading dimension (tpu tensor)."""
        out = self._collective("all_gather", _flat_buffer(t), t.dtype)
        return out, _as_tensor(out, [self.size(), *t.shape], t.dtype)

    def allgather(self, output_lists, inputs, opts=None):
        def body():
            outs = []
            for outputs, t in zip(output_lists, inputs):
                _check_gathered_outputs("all_gather", outputs, t, self.size())
                out, stacked = self._gathered(t)
                for i, o in enumerate(outputs):
                    _write(o, stacked[i])
                outs.append(out)
            return outs, list(output_lists)

        return self._issue("all_gather", [*inputs, *[o for lst in output_lists for o in lst]], body)

    def all_gather_single(self, output, input, opts=None):
        def body():
            if output.numel() != input.numel() * self.size():
                raise ValueError(
                    f"tpu_dist all_gather_into_tensor: output has {output.numel()} elements, expected "
                    f"{input.numel()} x {self.size()} ranks"
                )
            out, stacked = self._gathered(input)
            _write(output, stacked.reshape(output.shape))
            return [out], [output]

        return self._issue("all_gather_into_tensor", [output, input], body)

    _allgather_base = all_gather_single

    def allgather_into_tensor_coalesced(self, outputs, inputs, opts=None):
        works = [self.all_gather_single(o, i, opts) for o, i in zip(outputs, inputs)]
        return _merged(works, list(outputs))

    def gather(self, output_lists, inputs, opts=None):
        dst = opts.rootRank if opts is not None else 0

        def body():
            if self.rank() == dst:  # before any collective: a wrong size on dst fails alone
                for outputs, t in zip(output_lists, inputs):
                    _check_gathered_outputs("gather", outputs, t, self.size())
            outs = []
            for k, t in enumerate(inputs):
                out, stacked = self._gathered(t)
                if self.rank() == dst:
                    for i, o in enumerate(output_lists[k]):
                        _write(o, stacked[i])
                outs.append(out)
            return outs, list(output_lists)

        return self._issue("gather", list(inputs), body, rooted=True)

    def _reduce_scattered(self, flat: torch.Tensor, op: str):
        out = self._collective("reduce_scatter", _flat_buffer(flat), flat.dtype, reduce_op=op)
        return out, _as_tensor(out, [flat.numel() // self.size()], flat.dtype)

    def reduce_scatter(self, outputs, input_lists, opts=None):
        op = self._reduce_op(opts.reduceOp if opts is not None else dist.ReduceOp.SUM)

        def body():
            outs = []
            for o, inputs in zip(outputs, input_lists):
                if len(inputs) != self.size() or any(i.numel() != o.numel() for i in inputs):
                    raise ValueError(
                        f"tpu_dist reduce_scatter: needs {self.size()} inputs of {o.numel()} elements each"
                    )
                flat = torch.cat([i.reshape(-1) for i in inputs])
                out, mine = self._reduce_scattered(flat, op)
                _write(o, mine.reshape(o.shape))
                outs.append(out)
            return outs, list(outputs)

        return self._issue("reduce_scatter", [*outputs, *[i for lst in input_lists for i in lst]], body)

    def reduce_scatter_single(self, output, input, opts=None):
        op = self._reduce_op(opts.reduceOp if opts is not None else dist.ReduceOp.SUM)

        def body():
            if input.numel() != output.numel() * self.size():
                raise ValueError(
                    f"tpu_dist reduce_scatter_tensor: input has {input.numel()} elements, expected "
                    f"{output.numel()} x {self.size()} ranks"
                )
            out, mine = self._reduce_scattered(input.reshape(-1), op)
            _write(output, mine.reshape(output.shape))
            return [out], [output]

        return self._issue("reduce_scatter_tensor", [output, input], body)

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_tensor_coalesced(self, outputs, inputs, opts=None):
        works = [self.reduce_scatter_single(o, i, opts) for o, i in zip(outputs, inputs)]
        return _merged(works, list(outputs))

    def scatter(self, outputs, input_lists, opts=None):
        src = opts.rootRank if opts is not None else 0

        def body():
            if self.rank() == src:
                for o, inputs in zip(outputs, input_lists):
                    _check_scattered_inputs(inputs, o, self.size())
            outs = []
            for k, o in enumerate(outputs):
                if self.rank() == src:
                    flat = torch.cat([i.reshape(-1) for i in input_lists[k]])
                else:  # only the source's value travels: any buffer of the right size
                    flat = torch.empty(o.numel() * self.size(), dtype=o.dtype, device=o.device)
                out = self._collective("broadcast", _flat_buffer(flat), o.dtype, src=src)
                mine = _as_tensor(out, [self.size(), o.numel()], o.dtype)[self.rank()]
                _write(o, mine.reshape(o.shape))
                outs.append(out)
            return outs, list(outputs)

        return self._issue("scatter", list(outputs), body, rooted=True)

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        def body():
            n = self.size()
            if not output_split_sizes and not input_split_sizes:
                even = input.dim() > 0 and input.shape[0] % n == 0 and input.numel() == output.numel()
                if not even:
                    raise ValueError(
                        f"tpu_dist all_to_all_single: input {list(input.shape)} and output "
                        f"{list(output.shape)} must have equal sizes, the first dividing by {n} ranks"
                    )
                out = self._collective("all_to_all", _flat_buffer(input), input.dtype)
                _write_result(output, out)
                return [out], [output]
            return self._uneven_all_to_all(output, input, list(output_split_sizes), list(input_split_sizes))

        return self._issue("all_to_all_single", [output, input], body, shapes=False)

    alltoall_base = all_to_all_single

    def _uneven_all_to_all(self, output, input, out_splits, in_splits):
        n = self.size()
        row = input[0].numel() if input.dim() > 1 and input.shape[0] else (
            output[0].numel() if output.dim() > 1 and output.shape[0] else 1)
        in_splits = in_splits or [input.shape[0] // n] * n
        out_splits = out_splits or [output.shape[0] // n] * n
        if len(in_splits) != n or len(out_splits) != n or sum(in_splits) != input.shape[0] or sum(out_splits) != output.shape[0]:
            raise ValueError(
                f"tpu_dist all_to_all_single: split sizes {in_splits} / {out_splits} must have {n} entries "
                f"summing to the input's / output's first dimension ({input.shape[0]} / {output.shape[0]})"
            )
        # Every rank's split sizes, so every rank pads its chunks to the same largest size.
        sizes = torch.tensor(in_splits, dtype=torch.int64).to(input.device)
        _, all_sizes = self._gathered(sizes)
        largest = max(1, int(all_sizes.cpu().max()))
        chunks = []
        for chunk in torch.split(input.reshape(input.shape[0], -1) if input.dim() else input, in_splits):
            flat = chunk.reshape(-1)
            pad = torch.zeros(largest * row - flat.numel(), dtype=input.dtype, device=input.device)
            chunks.append(torch.cat([flat, pad]))
        out = self._collective("all_to_all", _flat_buffer(torch.cat(chunks)), input.dtype)
        received = _as_tensor(out, [n, largest * row], input.dtype)
        pieces = [received[j, : out_splits[j] * row] for j in range(n)]
        _write(output, torch.cat(pieces).reshape(output.shape))
        return [out], [output]

    def alltoall(self, outputs, inputs, opts=None):
        def body():
            n = self.size()
            if len(inputs) != n or len(outputs) != n:
                raise ValueError(f"tpu_dist all_to_all: needs {n} input and {n} output tensors")
            dtype = inputs[0].dtype
            flat_in = torch.cat([i.reshape(-1) for i in inputs])
            flat_out = torch.empty(sum(o.numel() for o in outputs), dtype=dtype, device=inputs[0].device)
            work = self.all_to_all_single(
                flat_out, flat_in, [o.numel() for o in outputs], [i.numel() for i in inputs]
            )
            work.wait()
            for o, piece in zip(outputs, torch.split(flat_out, [o.numel() for o in outputs])):
                _write(o, piece.reshape(o.shape))
            return [], list(outputs)

        return self._issue("all_to_all", [*outputs, *inputs], body, shapes=False)

    def barrier(self, opts=None):
        def body():
            one = torch.ones(1, dtype=torch.int32, device="tpu:0")
            out = self._collective("all_reduce", _flat_buffer(one), one.dtype, reduce_op="sum")
            out.synchronize()
            return [out], []

        return self._issue("barrier", [], body)

    # -- point to point ----------------------------------------------------------------------------

    def _p2p(self, tensor: torch.Tensor, src: int, dst: int, receiving: bool):
        """One collective_permute between the two processes (group ranks src -> dst)."""
        pair = (self._global_ranks[src], self._global_ranks[dst])
        ranks = tuple(sorted(pair))
        group = p2p_channel(ranks, self._runtime.world_incarnation)
        with _p2p_lock:
            _p2p_sequences[group] = _p2p_sequences.get(group, 0) + 1
            sequence = _p2p_sequences[group]
        pairs = ((ranks.index(pair[0]), ranks.index(pair[1])),)
        program = self._program("permute", tensor.numel(), tensor.dtype, ranks, pairs=pairs)
        out = self._checked_run(group, ranks, sequence, program, program, [_flat_buffer(tensor)])[0]
        if receiving:
            _write_result(tensor, out)
        return out

    def send(self, tensors, dst, tag=0):
        def body():
            outs = [self._p2p(t, self.rank(), dst, False) for t in tensors]
            return outs, list(tensors)

        # Both sides record "send/recv" (they pair), from different lines (not compared).
        return self._issue("send/recv", tensors, body, rooted=True)

    def recv(self, tensors, src, tag=0):
        def body():
            outs = [self._p2p(t, src, self.rank(), True) for t in tensors]
            return outs, list(tensors)

        return self._issue("send/recv", tensors, body, rooted=True)

    def recv_anysource(self, tensors, tag=0):
        return TPUWork(error=ValueError(
            "tpu_dist recv: a source rank is required (XLA collectives pair a known sender with a receiver)"
        ))


_NO_FRAME = "<no Python frame: issued by C++ (e.g. DDP's gradient all-reduce)>"

# The torch.distributed call this thread is issuing (`ProcessGroupTPU._issue`):
# `call` = (operation, its tensors' shapes, rooted) and `runs` = (output, group, ranks,
# record) of each collective program it ran.
_issuing = threading.local()


def user_frame() -> tuple[str, int]:
    """(file, line) of the innermost user frame (`core/user_frames.py`: outside torch,
    its decorators, torch_tpu and the standard library): the user's collective call.
    Collectives issued from C++ (DDP's reducer, on the autograd thread) have none:
    (a description, 0)."""
    return innermost_user_frame() or (_NO_FRAME, 0)


def _basename(path: str) -> str:
    # What the ranks compare of a call site: paths differ between hosts (checkouts,
    # containers), a script's name and line do not.
    return path.rpartition("/")[2]


# Texts of what records name, made once: a record is made per collective call.
_site_texts: dict[tuple[str, int], tuple[str, str]] = {}  # (path, line) -> ("path:line", "base:line")
_call_texts: dict[tuple[str, tuple], str] = {}  # (operation, shapes) -> "all_reduce of [2, 3]"


class HandshakeSubject(Protocol):
    """What the handshake compares of a program and names in its errors, the same on every
    rank that runs the same collective: a `GroupProgram` once labelled
    (`GroupProgram.label`), or a bounded one at given sizes (`_SizedProgram`)."""

    @property
    def description(self) -> str: ...

    @property
    def fingerprint(self) -> str: ...


@dataclass(frozen=True)
class _SizedProgram:
    """What the handshake compares of a bounded program run at given sizes."""

    description: str
    fingerprint: str


def _with_sizes(program: HandshakeSubject, sizes: str) -> _SizedProgram:
    """`program` at `sizes` ("s0=3"), which its fingerprint does not show."""
    return _sized(program.description, program.fingerprint, sizes)


@functools.lru_cache(maxsize=1024)
def _sized(description: str, fingerprint: str, sizes: str) -> _SizedProgram:
    from torch_tpu.runtime.distributed import fingerprint_of

    described = f"{description} at sizes {sizes}"
    return _SizedProgram(described, fingerprint_of(fingerprint, described))


def _merged(works: list[TPUWork], result: list) -> TPUWork:
    buffers = [b for w in works for b in w._buffers]
    error = next((w._error for w in works if w._error is not None), None)
    return TPUWork(buffers, result, error)


def _describe(kind: str, numel: int, dtype: torch.dtype, params: dict, ranks: Sequence[int]) -> str:
    extra = "".join(f", {k}={v}" for k, v in sorted(params.items()))
    return f"{kind}({numel} x {str(dtype).removeprefix('torch.')}{extra}) over ranks {list(ranks)}"


# CPU tensors go to a gloo backend of the same ranks, created on first use (every member
# reaches its first CPU collective together). A Python ProcessGroup replaces PyTorch's
# per-device backend table ("cpu:gloo,tpu:tpu_dist" would still route CPU tensors here).
_FORWARDED = (
    "allreduce", "allreduce_coalesced", "broadcast", "reduce", "allgather", "all_gather_single",
    "_allgather_base", "allgather_into_tensor_coalesced", "gather", "reduce_scatter",
    "reduce_scatter_single", "_reduce_scatter_base", "reduce_scatter_tensor_coalesced", "scatter",
    "all_to_all_single", "alltoall_base", "alltoall", "send", "recv",
)


def _cpu_tensors_only(args) -> bool | None:
    """Whether the tensors in `args` (a collective's arguments: tensors, lists of them,
    options) are all CPU tensors: True, False as soon as one is not, None when there is
    none. Runs before every collective: no list is built, and `is_cpu` makes no
    torch.device."""
    found = None
    for a in args:
        if isinstance(a, torch.Tensor):
            if not a.is_cpu:
                return False
            found = True
        elif isinstance(a, (list, tuple)):
            inner = _cpu_tensors_only(a)
            if inner is False:
                return False
            found = found or inner
    return found


# gloo's Python binding names some collectives differently, and has no *_tensor_coalesced
# ones: those run as one gloo collective per (output, input) pair.
_GLOO_NAME = {
    "all_gather_single": "_allgather_base",
    "reduce_scatter_single": "_reduce_scatter_base",
    "all_to_all_single": "alltoall_base",
}
_GLOO_PER_PAIR = {
    "allgather_into_tensor_coalesced": "_allgather_base",
    "reduce_scatter_tensor_coalesced": "_reduce_scatter_base",
}


def _on_gloo(gloo, name: str, args, kwargs):
    """Collective `name` (tpu_dist's name) of CPU tensors, run by `gloo`."""
    if name in _GLOO_PER_PAIR:
        outputs, inputs, *rest = args
        run = getattr(gloo, _GLOO_PER_PAIR[name])
        works = [run(o, i, *rest, **kwargs) for o, i in zip(outputs, inputs)]
        # One Work for the list: gloo's finish in order on its own threads; waiting here
        # keeps a failure of any of them the caller's error.
        for work in works:
            work.wait()
        return TPUWork(result=list(outputs))
    return getattr(gloo, _GLOO_NAME.get(name, name))(*args, **kwargs)


def _cpu_forwarding(name: str, method: Callable) -> Callable:
    def forward(self, *args, **kwargs):
        if _cpu_tensors_only(args):
            return _on_gloo(self._cpu_backend(), name, args, kwargs)
        return method(self, *args, **kwargs)

    forward.__name__ = name
    forward.__doc__ = method.__doc__
    return forward


for _name in _FORWARDED:
    setattr(ProcessGroupTPU, _name, _cpu_forwarding(_name, getattr(ProcessGroupTPU, _name)))

_hidden_from_dynamo = False


def _hide_from_dynamo() -> None:
    """PyTorch's C++ (DDP's reducer) calls the group while Dynamo may be tracing a frame
    (`torch.compile` of a DDP model): a collective is eager work, never graph. Done when
    the first group is made, not at import (this module loads on every `import torch`,
    and importing Dynamo costs seconds)."""
    global _hidden_from_dynamo
    if _hidden_from_dynamo:
        return
    import torch._dynamo

    for cls, names in ((ProcessGroupTPU, (*_FORWARDED, "barrier")), (TPUWork, ("wait", "get_future"))):
        for name in names:
            setattr(cls, name, torch._dynamo.disable(getattr(cls, name), recursive=True))
    _hidden_from_dynamo = True


def create_backend(dist_backend_opts, backend_options=None) -> ProcessGroupTPU:
    """The factory `register_backend(..., extended_api=True)` calls for each new group."""
    _hide_from_dynamo()
    rank = dist_backend_opts.group_rank
    size = dist_backend_opts.group_size
    ranks = list(dist_backend_opts.global_ranks_in_group) or list(range(size))
    timeout = dist_backend_opts.timeout
    from torch_tpu.runtime import distributed

    runtime = distributed.current()
    if runtime is None:
        # The default group (all ranks) comes first: its rank is the global rank.
        runtime = _launch.start_runtime(ranks[rank], size, timeout, dist_backend_opts.store)
    name = str(dist_backend_opts.group_id)
    seconds = timeout.total_seconds() if isinstance(timeout, datetime.timedelta) else 300.0
    group = ProcessGroupTPU(rank, size, ranks, name, timeout,
                            handshake_name=runtime.incarnation_name(name or "default", ranks, seconds))
    group._store = dist_backend_opts.store
    return group
