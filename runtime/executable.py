"""Compiled programs: `CompileSpec` (how to compile), `Signature` (what a program takes
and returns) and `Executable` (run it on one device, or as N replicas).

Dispatch is asynchronous: `execute` / `execute_replicated` return DeviceBuffers as soon
as the work is enqueued; `DeviceBuffer.synchronize()` or `Client.synchronize()` wait.
`__call__` returns torch tensors, which waits for the outputs: by DLPack on XLA:CPU (zero-copy),
by PjRT's host copy elsewhere (every output's copy enqueued before the first is read).

Donation: a parameter the compiled program aliases to an output (`tf.aliasing_output`,
`jax.buffer_donor`, or `CompileSpec.donate_argnums`) is *donated*: a DeviceBuffer passed
there is consumed (deleted) by the call, and a host tensor passed there is copied in, so
the caller's tensor is never overwritten.
"""

from __future__ import annotations

import operator
import sys
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from . import _jaxlib, dtypes
from .buffer import ALIGNMENT, DeviceBuffer, host_tensor, numpy_host
from .errors import ArgumentError, BufferDeletedError, UnsupportedDtypeError, classify_jaxlib_error

if TYPE_CHECKING:  # pragma: no cover
    from .client import Client, Device
    from .fingerprint import CacheKey


_torch_state: dict[str, Any] = {}
_array_of = operator.attrgetter("_array")  # a DeviceBuffer's jaxlib array
_UNREAD = object()  # a lazily read figure not read yet


def _tensor_type() -> Any:
    """torch.Tensor once torch is imported (by anyone), else None; never imports torch."""
    cls = _torch_state.get("Tensor")
    if cls is None:
        torch = sys.modules.get("torch")
        if torch is None or not hasattr(torch, "Tensor"):
            return None
        cls = _torch_state["Tensor"] = torch.Tensor
        _torch_state["from_dlpack"] = _capsule_importer(torch)
    return cls


def _view_dtype(name: str) -> Any:
    return getattr(sys.modules["torch"], name)


def _from_dlpack() -> Any:
    fn = _torch_state.get("from_dlpack")
    if fn is None:
        import torch

        _tensor_type()
        fn = _torch_state["from_dlpack"] = _capsule_importer(torch)
    return fn


def _capsule_importer(torch: Any) -> Any:
    """torch's DLPack-capsule import itself: `torch.from_dlpack` is a Python wrapper that
    only forwards a capsule to it (~5 us of the smallest compiled call)."""
    return getattr(torch._C, "_from_dlpack", None) or torch.from_dlpack


def _host_outputs(cpu: bool, rows: Sequence[dtypes.ElementType]) -> Callable[[list[Any]], list[Any]]:
    """outs -> torch tensors of a program's outputs. XLA:CPU: DLPack, zero-copy. Other
    platforms: every output's host copy is enqueued first, so the transfers overlap, then
    each is read (TPU buffers cannot be exported by DLPack)."""
    if cpu:
        to_dlpack = _jaxlib.buffer_to_dlpack

        def by_dlpack(outs: list[Any]) -> list[Any]:
            from_dlpack = _torch_state.get("from_dlpack") or _from_dlpack()
            return [from_dlpack(to_dlpack(o)) for o in outs]

        return by_dlpack
    start = _jaxlib.start_host_copy
    rows = tuple(rows)

    def by_copy(outs: list[Any]) -> list[Any]:
        if len(outs) > 1:
            for o in outs:
                start(o)
        return [host_tensor(o, row) for o, row in zip(outs, rows)]

    return by_copy


@dataclass(frozen=True)
class CompileSpec:
    """Options of one compilation; all of them are part of the cache key.

    num_replicas:    run as N replicas (collectives across them), one device each
    donate_argnums:  parameters to donate (marked `jax.buffer_donor`, so XLA may reuse
                     their buffers for outputs); parameters that the module already
                     aliases (`tf.aliasing_output`) are donated without being listed
    device_indices:  indices into `Client.devices` to run on (default: the first
                     `num_replicas` devices)
    xla_options:     XLA debug-option overrides, e.g. (("xla_cpu_enable_fast_math", "false"),),
                     and build options as jax passes them (exec_time_optimization_effort,
                     memory_fitting_effort, optimization_level, memory_fitting_level)
    """

    num_replicas: int = 1
    donate_argnums: tuple[int, ...] = ()
    device_indices: tuple[int, ...] | None = None
    xla_options: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.num_replicas, int) or self.num_replicas < 1:
            raise ValueError(f"CompileSpec.num_replicas must be a positive int, got {self.num_replicas!r}")
        donate = tuple(sorted({int(i) for i in self.donate_argnums}))
        if any(i < 0 for i in donate):
            raise ValueError(f"CompileSpec.donate_argnums must be >= 0, got {self.donate_argnums!r}")
        object.__setattr__(self, "donate_argnums", donate)
        if self.device_indices is not None:
            devices = tuple(int(i) for i in self.device_indices)
            if len(devices) != self.num_replicas or len(set(devices)) != len(devices):
                raise ValueError(
                    f"CompileSpec.device_indices {self.device_indices!r} must list {self.num_replicas} "
                    "distinct devices (one per replica)"
                )
            object.__setattr__(self, "device_indices", devices)
        object.__setattr__(self, "xla_options", tuple((str(k), str(v)) for k, v in self.xla_options))

    def key_fields(self) -> dict[str, Any]:
        return {
            "num_replicas": self.num_replicas,
            "donate_argnums": list(self.donate_argnums),
            "xla_options": [list(kv) for kv in self.xla_options],
        }


@dataclass(frozen=True)
class TensorSpec:
    dtype: np.dtype
    shape: tuple[int, ...]

    @property
    def element_type(self) -> dtypes.ElementType:
        return dtypes.from_numpy(self.dtype)

    def __str__(self) -> str:
        return dtypes.type_string(self.shape, self.dtype)


@dataclass(frozen=True)
class Signature:
    args: tuple[TensorSpec, ...]
    results: tuple[TensorSpec, ...]
    donated: tuple[int, ...]

    def to_json(self) -> dict[str, Any]:
        def enc(specs: Sequence[TensorSpec]) -> list[Any]:
            return [[dtypes.from_numpy(s.dtype).mlir, list(s.shape)] for s in specs]

        return {"args": enc(self.args), "results": enc(self.results), "donated": list(self.donated)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Signature:
        def dec(items: list[Any]) -> tuple[TensorSpec, ...]:
            return tuple(TensorSpec(dtypes.from_mlir(t).numpy, tuple(int(d) for d in shape)) for t, shape in items)

        return cls(dec(data["args"]), dec(data["results"]), tuple(int(i) for i in data["donated"]))

    @classmethod
    def of(cls, raw: Any) -> Signature:
        params, results, donated = _jaxlib.executable_signature(raw)
        for dtype, _ in list(params) + list(results):
            if np.dtype(dtype) not in dtypes.BY_NUMPY:
                raise UnsupportedDtypeError(
                    f"the program has a parameter or result of type {dtype}, which torch_tpu "
                    "cannot exchange with PyTorch"
                )
        return cls(
            tuple(TensorSpec(np.dtype(d), s) for d, s in params),
            tuple(TensorSpec(np.dtype(d), s) for d, s in results),
            tuple(donated),
        )

    def describe_args(self) -> str:
        return "(" + ", ".join(str(a) for a in self.args) + ")"


class Executable:
    """A loaded program. Obtain one with `Client.compile`."""

    def __init__(
        self,
        client: Client,
        raw: Any,
        signature: Signature,
        spec: CompileSpec,
        key: CacheKey,
        devices: Sequence[Device],
        origin: str,
        name: str,
    ) -> None:
        self.client = client
        self.signature = signature
        self.spec = spec
        self.key = key
        self.devices = tuple(devices)
        self.origin = origin  # where it was first obtained: "compile", "l1", "l2", "l3"
        self.name = name
        self._raw = raw
        self._memory: Any = _UNREAD  # `memory_analysis`, read on first use
        self._nargs = len(signature.args)
        donated = set(signature.donated)
        cpu = client.platform == "cpu"
        self._in_rows = [a.element_type for a in signature.args]
        self._in_avals = [_jaxlib.Aval(a.shape, a.dtype) for a in signature.args]
        self._out_rows = [r.element_type for r in signature.results]
        self._out_avals = [_jaxlib.Aval(r.shape, r.dtype) for r in signature.results]
        self._donated = [i in donated for i in range(self._nargs)]
        self._alias_ok = [cpu and not d for d in self._donated]
        self._in_torch_dtypes: list[Any] | None = None
        dev0 = self.devices[0]
        self._handlers = [_jaxlib.result_handler(aval, dev0._sharding) for aval in self._out_avals]
        self._runner = _jaxlib.make_runner(raw, self._handlers)
        self._host_outputs = _host_outputs(cpu, self._out_rows)
        if spec.num_replicas > 1:
            raw_devices = [d._raw for d in self.devices]
            self._replicated_sharding = _jaxlib.replicated_sharding(raw_devices)
        # Host arguments are aliased (zero-copy) only by calls that wait for their results
        # (`__call__`); `execute` returns at once, so the caller may write its tensors while
        # the program still reads them: its converters copy host data during the call.
        self._converters = [self._make_converter(i) for i in range(self._nargs)]
        self._enqueue_converters: list[Callable[..., Any]] | None = None

    def __repr__(self) -> str:
        return (
            f"Executable({self.name}: {self.signature.describe_args()} -> "
            f"({', '.join(str(r) for r in self.signature.results)}), replicas={self.spec.num_replicas}, "
            f"key={self.key})"
        )

    @property
    def num_args(self) -> int:
        return self._nargs

    @property
    def donated_args(self) -> tuple[int, ...]:
        return self.signature.donated

    # -- argument conversion ------------------------------------------------------------------

    def _torch_dtypes(self) -> list[Any]:
        if self._in_torch_dtypes is None:
            self._in_torch_dtypes = [dtypes.torch_dtype(r) for r in self._in_rows]
        return self._in_torch_dtypes

    def _mismatch(self, index: int, got: str, replica: int | None = None) -> ArgumentError:
        where = f"replica {replica}, " if replica is not None else ""
        return ArgumentError(
            f"{self.name}: {where}argument {index}: expected {self.signature.args[index]}, got {got}; "
            f"the program takes {self.signature.describe_args()}"
        )

    def _make_converter(self, i: int, waits: bool = True) -> Callable[[Any, Any], Any]:
        """Per-argument conversion to a raw device array, with everything that does not
        depend on the value precomputed (the dispatch hot path). `waits`: the caller waits
        for the program's results before returning, so host memory may be aliased."""
        aval = self._in_avals[i]
        row = self._in_rows[i]
        shape = aval.shape
        alias_ok = self._alias_ok[i] and waits
        donated = self._donated[i]
        put = _jaxlib.batched_device_put
        is_deleted = _jaxlib.array_is_deleted
        clone = _jaxlib.array_clone
        zero_copy = _jaxlib.ZERO_COPY
        copy = _jaxlib.COPY_DURING_CALL
        torch_dtypes = self._torch_dtypes
        np_dtype = row.numpy
        mismatch = self._mismatch
        align_mask = ALIGNMENT - 1

        view = row.torch_view_as
        # Off XLA:CPU, zero-copy semantics do not alias: PjRT reads the host memory until the
        # transfer completes, with no staging copy (what jax.device_put does). A call that
        # waits for its results outlasts the transfer, so it may use them for an argument
        # too large to stage (`_jaxlib.upload_semantics`: staging is faster up to 64 MB);
        # `execute` (returns at once) copies during the call. No array is reused across
        # calls there: it would hold the tensor's old value.
        shares_host = self.client.platform == "cpu"
        nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(row.numpy).itemsize
        host_semantics = _jaxlib.upload_semantics(nbytes) if waits else copy
        # torch.Tensor and this parameter's torch dtype, set on the first tensor seen (this
        # module never imports torch): a plain tensor, the common host argument, is then
        # recognised by one identity check before any other kind is considered.
        tensor_class: list[Any] = [None, None]

        def is_tensor(value: Any) -> bool:
            cls = _tensor_type()
            if cls is None or not isinstance(value, cls):
                return False
            if tensor_class[0] is None:
                tensor_class[1] = torch_dtypes()[i]
                tensor_class[0] = cls
            return True

        # The last DeviceBuffer this position accepted, weakly held: a buffer's shape,
        # element type and device never change, so the same buffer again (a resident
        # parameter, on every call) needs only the check that can change, its deletion.
        # Not for a donated position, whose buffer a call consumes. Nothing here holds the
        # buffer or its array: a program that donates that buffer later (an optimizer step
        # writing the parameter in place) must find it referenced by its tensor alone.
        accepted: list[Any] = [None]

        def forget(ref: Any) -> None:
            if accepted[0] is ref:
                accepted[0] = None

        # The host tensor this position aliased last (weakly held), its address and, once
        # the same tensor came back, a device array aliasing that memory: passing the same
        # tensor again (an input kept across calls, a buffer refilled in place) reuses the
        # array instead of making one per call (~8 us, and PjRT's first use of a new array
        # costs ~10 us more). Only where host memory is aliased anyway (`alias_ok`, calls
        # that wait), so the array always reads the tensor's current contents. The tensor
        # object is held weakly and the array let go with it (the array keeps the memory
        # through its NumPy view, whose base is another tensor object).
        aliased: list[tuple[Any, int, Any]] = [(None, 0, None)]

        def forget_alias(ref: Any) -> None:
            if aliased[0][0] is ref:
                aliased[0] = (None, 0, None)

        def convert(value: Any, device: Any, replica: int | None = None) -> Any:
            ref = accepted[0]
            if ref is not None and ref() is value and value.device is device and not is_deleted(value._array):
                return value._array
            ref, address, array = aliased[0]
            # Everything the slow path checks of a tensor (the `.data` of the same object may
            # have been replaced by another dtype, or a conj/neg view, at the same address).
            if (array is not None and ref() is value and value.data_ptr() == address
                    and value.dtype is tensor_class[1] and value.is_contiguous() and value.shape == shape
                    and not value.is_conj() and not value.is_neg() and not is_deleted(array)):
                return array
            if type(value) is tensor_class[0] or (type(value) is not DeviceBuffer and is_tensor(value)):
                if value.dtype is not tensor_class[1]:
                    raise mismatch(i, f"a {value.dtype} tensor of shape {list(value.shape)}", replica)
                t = value
                if not t.is_cpu or t.requires_grad or not t.is_contiguous() or t.is_neg() or t.is_conj():
                    t = t.detach().cpu().resolve_conj().resolve_neg().contiguous()
                host = t.numpy() if view is None else t.view(_view_dtype(view)).numpy().view(np_dtype)
                if host.shape != shape:
                    raise mismatch(i, f"a {value.dtype} tensor of shape {list(value.shape)}", replica)
                if not shares_host:
                    return put(aval, device._sharding, [host], device._raw_list, True, False, host_semantics, True)
                # Zero-copy: the array aliases the tensor's memory, which must not change until
                # the results are ready (`__call__` waits for them; `execute` copies instead:
                # `waits` false, so `alias_ok` false). Never
                # for a donated parameter (XLA would write into the caller's tensor: `alias_ok`
                # is false there) nor an unaligned pointer (XLA:CPU would copy anyway).
                address = t.data_ptr()
                if not alias_ok or address & align_mask:
                    return put(aval, device._sharding, [host], device._raw_list, True, False, copy, True)
                if t is value:
                    ref, seen, _ = aliased[0]
                    if ref is not None and ref() is value and seen == address and host.nbytes:
                        # The same tensor a second time: keep an array aliasing its memory.
                        array = put(aval, device._sharding, [host], device._raw_list, True, False, zero_copy, True)
                        aliased[0] = (ref, address, array)
                        return array
                    aliased[0] = (weakref.ref(value, forget_alias), address, None)
                return put(aval, device._sharding, [host], device._raw_list, True, False, zero_copy, True)
            if type(value) is DeviceBuffer:
                if value.shape != shape or value._row is not row:
                    raise mismatch(i, f"DeviceBuffer {value.type_string}", replica)
                if value.device is not device:
                    if str(value.device) == str(device):
                        raise mismatch(
                            i, f"a DeviceBuffer of another Client (its {value.device} is not this "
                            "program's); create buffers with the client that compiled the program", replica,
                        )
                    raise mismatch(
                        i, f"a DeviceBuffer on {value.device} (the program runs on {device}); "
                        f"move it with Client.to_device(buffer.to_torch(), {device.index})", replica,
                    )
                array = value._array
                if is_deleted(array):
                    raise BufferDeletedError(
                        f"{self.name}: argument {i}: the DeviceBuffer was deleted or donated to an "
                        "earlier call; pass that call's output instead"
                    )
                if donated:
                    if value._exported:
                        # Its memory is shared with a torch tensor / NumPy array: donate a copy.
                        return clone(array)
                else:
                    accepted[0] = weakref.ref(value, forget)
                return array
            if isinstance(value, np.ndarray):
                if value.dtype != np_dtype or value.shape != shape:
                    raise mismatch(i, f"a {dtypes.type_string(value.shape, value.dtype)} NumPy array", replica)
                host, aligned = numpy_host(value)
                if not shares_host:
                    semantics = host_semantics
                else:
                    semantics = zero_copy if (alias_ok and aligned) else copy
                return put(aval, device._sharding, [host], device._raw_list, True, False, semantics, True)
            if isinstance(value, np.generic):
                return convert(np.asarray(value), device, replica)
            raise mismatch(i, f"a {type(value).__qualname__}", replica)

        return convert

    def _check_arity(self, n: int, replica: int | None = None) -> None:
        if n != self._nargs:
            where = f" (replica {replica})" if replica is not None else ""
            raise ArgumentError(
                f"{self.name}: takes {self._nargs} argument{'s' if self._nargs != 1 else ''} "
                f"{self.signature.describe_args()}, got {n}{where}"
            )

    def _failed(self, err: Exception) -> Exception:
        return classify_jaxlib_error(
            err, f"running {self.name} on {', '.join(str(d) for d in self.devices)}",
            "check the arguments' devices and that no buffer is passed twice where one is donated",
            self.devices[0].memory_figures() if self.devices else "",
        )

    # -- single device ------------------------------------------------------------------------

    def __call__(self, *args: Any) -> list[Any]:
        """Runs on the program's device with torch tensors / DeviceBuffers / NumPy arrays;
        returns the results as a list of torch tensors (zero-copy on CPU)."""
        if self.spec.num_replicas != 1:
            raise ArgumentError(
                f"{self.name} was compiled for {self.spec.num_replicas} replicas; call "
                "execute_replicated([[args of replica 0], [args of replica 1], ...])"
            )
        if len(args) != self._nargs:
            self._check_arity(len(args))
        device = self.devices[0]
        arrays = [convert(a, device) for convert, a in zip(self._converters, args)]
        try:
            outs = self._runner(arrays)
        except _jaxlib.JaxRuntimeError as err:
            raise self._failed(err) from None
        try:
            return self._host_outputs(outs)
        except _jaxlib.JaxRuntimeError as err:
            raise classify_jaxlib_error(err, f"running {self.name}", "see the error above") from None

    def caller(self, result_type: type = list) -> Callable[..., Any]:
        """`__call__` as one precomputed closure, its results in a `result_type` (list or
        tuple): for a caller that calls one program many times (a compiled graph whose
        arguments pass through untouched). The same converters (host memory aliased only
        while the call waits for its results), the same errors; what `__call__` looks up
        per call is bound once, and a program with one argument and one result skips the
        list building (the smallest compiled call: `x + 1` on 8 floats). Runs the raw
        executable directly, not `_runner` (which tests of the enqueuing paths replace)."""
        if self.spec.num_replicas != 1 or result_type not in (list, tuple):
            raise ArgumentError(f"{self.name}: caller() is for a one-device program returning a list or tuple")
        converters = tuple(self._converters)
        nargs = self._nargs
        device = self.devices[0]
        execute_sharded = self._raw.execute_sharded
        counters = _jaxlib.transfers.COUNTERS  # (the runner counts its launches: so does this)
        handlers = self._handlers
        host_outputs = self._host_outputs
        from_dlpack = _from_dlpack()
        to_dlpack = _jaxlib.buffer_to_dlpack
        runtime_error = _jaxlib.JaxRuntimeError
        failed = self._failed
        check_arity = self._check_arity
        name = self.name

        def exported(err: Exception) -> Exception:
            return classify_jaxlib_error(err, f"running {name}", "see the error above")

        if nargs == 1 and len(handlers) == 1 and self.client.platform == "cpu":
            (convert,) = converters
            as_tuple = result_type is tuple

            def call_one(*args: Any) -> Any:
                if len(args) != 1:
                    check_arity(len(args))
                array = convert(args[0], device)
                counters.programs_executed += 1
                try:
                    (out,) = execute_sharded([array]).consume_with_handlers(handlers)
                except runtime_error as err:
                    raise failed(err) from None
                try:
                    result = from_dlpack(to_dlpack(out))
                except runtime_error as err:
                    raise exported(err) from None
                return (result,) if as_tuple else [result]

            return call_one

        def call(*args: Any) -> Any:
            if len(args) != nargs:
                check_arity(len(args))
            arrays = [convert(a, device) for convert, a in zip(converters, args)]
            counters.programs_executed += 1
            try:
                outs = execute_sharded(arrays).consume_with_handlers(handlers)
            except runtime_error as err:
                raise failed(err) from None
            try:
                return result_type(host_outputs(outs))
            except runtime_error as err:
                raise exported(err) from None

        return call

    def _enqueuing_converters(self) -> list[Callable[..., Any]]:
        if self._enqueue_converters is None:
            self._enqueue_converters = [self._make_converter(i, waits=False) for i in range(self._nargs)]
        return self._enqueue_converters

    def execute(self, args: Sequence[Any]) -> list[DeviceBuffer]:
        """Enqueues one run; returns its outputs as DeviceBuffers without waiting for them
        and without copying to the host. Host tensors and arrays passed here are copied
        during the call (the caller may write them as soon as it returns)."""
        if self.spec.num_replicas != 1:
            raise ArgumentError(
                f"{self.name} was compiled for {self.spec.num_replicas} replicas; use execute_replicated"
            )
        if len(args) != self._nargs:
            self._check_arity(len(args))
        device = self.devices[0]
        arrays = [convert(a, device) for convert, a in zip(self._enqueuing_converters(), args)]
        try:
            outs = self._runner(arrays)
        except _jaxlib.JaxRuntimeError as err:
            raise self._failed(err) from None
        specs = self.signature.results
        rows = self._out_rows
        return [DeviceBuffer(o, specs[k].shape, rows[k], device) for k, o in enumerate(outs)]

    def memory_analysis(self) -> dict[str, int] | None:
        """XLA's figures of what a run of this program allocates, in bytes (`argument`,
        `output`, `alias`: outputs written over donated arguments, `temp`); None where the
        platform gives none. A run needs `output - alias + temp` beside its arguments."""
        if self._memory is _UNREAD:
            self._memory = _jaxlib.compiled_memory(self._raw)
        return self._memory

    def buffer_launcher(self) -> Callable[[Sequence[DeviceBuffer]], list[DeviceBuffer]]:
        """`execute` for a caller whose arguments are live DeviceBuffers made for this
        program (the eager device's single-op plans: their shapes, element types and
        device are part of the plan's key): launch(buffers) -> output DeviceBuffers.

        Skips the per-argument conversion (~10 us of a ~30 us small op); what it would
        catch still fails loudly: PjRT rejects a buffer of the wrong size or a deleted
        one (raised here as the runtime's error class), and a donated argument that
        shares its memory with the host is still replaced by a copy."""
        if self.spec.num_replicas != 1:
            raise ArgumentError(f"{self.name} was compiled for {self.spec.num_replicas} replicas")
        clone = _jaxlib.array_clone
        donated = tuple(i for i, d in enumerate(self._donated) if d)
        device = self.devices[0]
        outputs = tuple((r.shape, row) for r, row in zip(self.signature.results, self._out_rows))
        failed = self._failed
        nargs = self._nargs

        def launch(buffers: Sequence[DeviceBuffer]) -> list[DeviceBuffer]:
            if len(buffers) != nargs:
                self._check_arity(len(buffers))
            arrays = list(map(_array_of, buffers))  # (C-level: a list comprehension is a frame)
            for i in donated:
                if buffers[i]._exported:
                    arrays[i] = clone(arrays[i])  # its memory is shared with the host
            try:
                outs = self._runner(arrays)  # read per call, as `execute` does (tests replace it)
            except _jaxlib.JaxRuntimeError as err:
                raise failed(err) from None
            if one_output:  # (most ops)
                return [DeviceBuffer(outs[0], shape0, row0, device)]
            return [DeviceBuffer(o, shape, row, device) for o, (shape, row) in zip(outs, outputs)]

        one_output = len(outputs) == 1
        shape0, row0 = outputs[0] if one_output else (None, None)
        return launch

    # -- replicated ---------------------------------------------------------------------------

    def execute_replicated(self, per_device_args: Sequence[Sequence[Any]]) -> list[list[DeviceBuffer]]:
        """Runs all replicas at once. `per_device_args[r]` are the arguments of replica r
        (on `self.devices[r]`); returns `outputs[r][k]`, output k of replica r."""
        n = self.spec.num_replicas
        if len(per_device_args) != n:
            raise ArgumentError(
                f"{self.name}: compiled for {n} replica{'s' if n != 1 else ''}, got arguments for "
                f"{len(per_device_args)}; pass one argument list per replica"
            )
        for r, args in enumerate(per_device_args):
            self._check_arity(len(args), r)
        if n == 1:
            return [self.execute(per_device_args[0])]
        arrays = []
        converters = self._enqueuing_converters()
        for i in range(self._nargs):
            convert = converters[i]
            shards = [convert(per_device_args[r][i], self.devices[r], r) for r in range(n)]
            arrays.append(_jaxlib.assemble(self._in_avals[i], self._replicated_sharding, shards))
        try:
            per_output = _jaxlib.execute_replicated(self._raw, arrays)
        except _jaxlib.JaxRuntimeError as err:
            raise self._failed(err) from None
        specs = self.signature.results
        rows = self._out_rows
        return [
            [DeviceBuffer(per_output[k][r], specs[k].shape, rows[k], self.devices[r]) for k in range(len(specs))]
            for r in range(n)
        ]
