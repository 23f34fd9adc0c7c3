"""The one module of `torch_tpu.runtime` that touches jaxlib (`jaxlib._jax`,
`jaxlib.xla_client`, `jaxlib.mlir`). Everything else in the runtime goes through the
names defined here, so a jaxlib upgrade that moves an API is a one-file change.

Never imports `jax`, and avoids the jaxlib entry points that import it behind our back.
jaxlib's C++ creates a Python `ArrayImpl` for a buffer in two ways:

* with an *explicit* abstract value ("aval") given by the caller: `batched_device_put`,
  `array_result_handler(...)` + `ExecuteResults.consume_with_handlers`, and the
  `ArrayImpl(aval, sharding, arrays, committed, skip_checks)` constructor;
* with an aval it builds itself, in `PyArray::MakeFromSingleDeviceArray` (used by
  `dlpack_managed_tensor_to_buffer`, `ExecuteResults.disassemble_into_single_device_arrays`,
  `ArrayImpl._arrays` ...). That goes through `MakeShapedArrayCached`, whose first call
  does `import jax.core` to fetch `jax.core.ShapedArray` -- about 1.25 s when jax is
  installed -- and remembers the outcome for the life of the process.

The single-device paths here only use the first kind (our own tiny `Aval`), so a process
that never imports jax never pays for it, and a process that imports jax later still
gets real `ShapedArray` avals from jaxlib (we never poison that one-time lookup).
`unsafe_buffer_pointer()` also imports jax and is not used; the host copy of a TPU or GPU
buffer (`start_host_copy` / `host_value`) imports it once where installed, which it always is
beside those plugins (XLA:CPU buffers go by DLPack instead). Splitting the result of an N-replica execution into per-device
buffers has no explicit-aval entry point in this jaxlib, so `disassemble` (replicated
programs only) may import jax once when it is installed.

Measured facts this module relies on are in `shared/JAXLIB_NOTES.md`.
"""

from __future__ import annotations

import ctypes
import os
import re
import threading
from collections.abc import Sequence
from typing import Any

# XLA's C++ logs INFO lines (device lists ...) to stderr unless told otherwise; jax sets
# the same default before it loads jaxlib. It is read when jaxlib's library loads.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")

import numpy as np
from jaxlib import _jax, xla_client
from jaxlib import version as _jaxlib_version

from torch_tpu.core import attributes

from . import transfers

JAXLIB_VERSION: str = _jaxlib_version.__version__

# Exceptions jaxlib raises for runtime/compile failures (a RuntimeError subclass).
JaxRuntimeError = _jax.JaxRuntimeError

# Host buffer semantics for host -> device transfers.
ZERO_COPY = _jax.HostBufferSemantics.ZERO_COPY  # alias host memory when the platform can
COPY_DURING_CALL = _jax.HostBufferSemantics.IMMUTABLE_ONLY_DURING_CALL  # copy before return
COPY_ASYNC = _jax.HostBufferSemantics.IMMUTABLE_UNTIL_TRANSFER_COMPLETES  # copy, host kept alive

# Off XLA:CPU an upload either copies the host bytes into PjRT's staging memory during the
# call (COPY_DURING_CALL: it returns at once and the DMA runs from that pinned memory) or
# lets the DMA read the caller's memory (ZERO_COPY: no staging copy, but the memory must
# stay as it is until the transfer is done, so a caller that returns first waits for it).
# On a TPU v5e (2026-12-06, back-to-back `.to("tpu")` of float32 tensors, then one sync),
# staged uploads took 272 / 284 / 371 / 611 / 1,786 / 6,789 us at 64 KB / 256 KB / 1 / 4 /
# 16 / 64 MB and waited zero-copy ones 550 / 602 / 744 / 1,331 / 3,432 / 13,215 us; at
# 256 MB zero-copy was ~3x faster (first session). So up to 64 MB uploads are staged.
STAGED_UPLOAD_BYTES = 64 << 20


def upload_semantics(nbytes: int) -> Any:
    """The host buffer semantics of an upload of `nbytes` off XLA:CPU (see above)."""
    return COPY_DURING_CALL if nbytes <= STAGED_UPLOAD_BYTES else ZERO_COPY

RawArray = _jax.ArrayImpl
RawClient = _jax.Client
RawDevice = _jax.Device
RawExecutable = _jax.LoadedExecutable

# Hot-path entry points, re-exported as plain functions (unbound methods are as fast as
# bound ones, and keep jaxlib's method names in this file). The three that move data or
# launch programs are counted here (`transfers.py`): every path of the runtime goes through
# them, so the counts need no wrapping from outside.
_device_put = _jax.batched_device_put
_to_dlpack = _jax.buffer_to_dlpack_managed_tensor
_COUNTERS = transfers.COUNTERS


def batched_device_put(aval: Any, sharding: Any, hosts: list, devices: Any, *rest: Any) -> Any:
    """jaxlib's host -> device transfer (same arguments), counted as uploads; the host
    semantics is the third of `rest` (ZERO_COPY on XLA:CPU aliases: counted apart)."""
    counters = _COUNTERS
    nbytes = 0
    for host in hosts:
        nbytes += host.nbytes
    counters.uploads += len(hosts)
    counters.upload_bytes += nbytes
    if len(rest) > 2 and rest[2] == ZERO_COPY and devices and devices[0].platform == "cpu":
        counters.aliased_upload_bytes += nbytes
    return _device_put(aval, sharding, hosts, devices, *rest)


def buffer_to_dlpack(array: Any) -> Any:
    """A DLPack capsule of an array handed to the host without a copy (XLA:CPU), counted."""
    _COUNTERS.dlpack_exports += 1
    return _to_dlpack(array)


batched_block_until_ready = _jax.batched_block_until_ready
array_is_deleted = _jax.ArrayImpl.is_deleted
array_is_ready = _jax.ArrayImpl.is_ready
array_block_until_ready = _jax.ArrayImpl.block_until_ready
array_delete = _jax.ArrayImpl.delete
array_clone = _jax.ArrayImpl.clone


class Aval:
    """The abstract value jaxlib's C++ reads (`shape`, `dtype`, `weak_type`) when it
    builds an array with a caller-given aval. Stands in for `jax.core.ShapedArray`."""

    __slots__ = ("dtype", "shape", "weak_type")

    def __init__(self, shape: Sequence[int], dtype: np.dtype) -> None:
        self.shape = tuple(int(d) for d in shape)
        self.dtype = np.dtype(dtype)
        self.weak_type = False

    @classmethod
    def of(cls, shape: tuple[int, ...], dtype: np.dtype) -> Aval:
        """An aval from a NumPy array's shape (a tuple of ints already) and a NumPy
        dtype: what every upload builds, without `__init__`'s conversions."""
        aval = cls.__new__(cls)
        aval.shape = shape
        aval.dtype = dtype
        aval.weak_type = False
        return aval

    def __repr__(self) -> str:
        return f"Aval({self.shape}, {self.dtype})"


# -- clients ------------------------------------------------------------------------------


def make_cpu_client(num_devices: int) -> RawClient:
    return xla_client.make_cpu_client(asynchronous=True, num_devices=num_devices)


_host_custom_calls_registered = False


def calls_host_custom_calls(module: Any) -> bool:
    """Whether `module` (text, bytecode or an MLIR object) calls a jaxlib CPU LAPACK
    handler (`lapack_*`): the targets `jax.numpy.linalg` modules use."""
    if isinstance(module, str):
        return "@lapack_" in module or '"lapack_' in module
    if isinstance(module, (bytes, bytearray)):
        return b"lapack_" in module
    if not is_mlir_object(module):
        return False
    from jaxlib.mlir import ir  # already loaded: `module` is one of its objects

    # Walk the custom calls instead of printing the module (this runs on every compile).
    op = module.operation if hasattr(module, "operation") else module
    found = False

    def visit(inner: Any) -> Any:
        nonlocal found
        inner = inner.operation
        if inner.name == "stablehlo.custom_call" and "call_target_name" in inner.attributes:
            found = str(inner.attributes["call_target_name"]).startswith('"lapack_')
        return ir.WalkResult.INTERRUPT if found else ir.WalkResult.ADVANCE

    op.walk(visit)
    return found


def register_host_custom_calls() -> None:
    """Registers jaxlib's CPU LAPACK handlers (`lapack_*_ffi`) with XLA, once per
    process, before a module calling them is compiled or loaded. jax does the same when
    it is imported; `jaxlib.lapack` alone does not import jax. It loads SciPy's LAPACK
    (~1 s on a loaded 2-core machine), so it runs only for modules that need it."""
    global _host_custom_calls_registered
    with _plugin_lock:
        if _host_custom_calls_registered:
            return
        from jaxlib import lapack

        # Fills the handlers' LAPACK function pointers (from SciPy's LAPACK); without it
        # the first call through a handler dereferences a null pointer.
        lapack._lapack.initialize()
        for name, capsule, api_version in lapack.registrations().get("cpu", ()):
            xla_client.register_custom_call_target(name, capsule, platform="cpu", api_version=api_version)
        _host_custom_calls_registered = True


_plugin_lock = threading.Lock()


def make_plugin_client(name: str, library_path: str, options: dict[str, Any],
                       distributed_client: Any = None) -> RawClient:
    """Loads (once per process), initializes and connects to a PjRT C-API plugin, the way
    jax does: load_pjrt_plugin_dynamically -> initialize_pjrt_plugin -> make_c_api_client.
    A process of a multi-process job passes its `distributed_client` (and `node_id` /
    `num_nodes` in `options`, as jax's plugin factory does)."""
    with _plugin_lock:
        if not xla_client.pjrt_plugin_loaded(name):
            xla_client.load_pjrt_plugin_dynamically(name, library_path)
        if not xla_client.pjrt_plugin_initialized(name):
            xla_client.initialize_pjrt_plugin(name)
    return xla_client.make_c_api_client(name, options, distributed_client)


def client_devices(client: RawClient) -> list[tuple[RawDevice, int, str]]:
    """(device, global id, device kind) of each addressable device, in PjRT's order."""
    return [(d, int(d.id), str(d.device_kind)) for d in client.local_devices()]


def device_memory_stats(device: RawDevice) -> dict[str, int] | None:
    """PjRT's allocator figures of a device (`bytes_in_use`, `peak_bytes_in_use`,
    `bytes_limit`, `largest_free_block_bytes`, ...), or None where the platform keeps
    none (XLA:CPU)."""
    try:
        stats = device.memory_stats()
    except Exception:  # noqa: BLE001 - platforms without an allocator report raise
        return None
    return {str(k): int(v) for k, v in stats.items()} if stats else None


def compiled_memory(executable: RawExecutable) -> dict[str, int] | None:
    """XLA's memory analysis of a compiled program, in bytes: `argument`, `output`, `alias`
    (outputs written over donated arguments) and `temp` (its temporaries); None where the
    platform gives none."""
    try:
        stats = executable.get_compiled_memory_stats()
        return {"argument": int(stats.argument_size_in_bytes), "output": int(stats.output_size_in_bytes),
                "alias": int(stats.alias_size_in_bytes), "temp": int(stats.temp_size_in_bytes)}
    except Exception:  # noqa: BLE001 - a platform without the analysis raises
        return None


def live_arrays(client: RawClient) -> list[RawArray]:
    return client.live_arrays()


def gpu_plugin_options() -> dict[str, Any]:
    return dict(xla_client.generate_pjrt_gpu_plugin_options())


def device_list(devices: Sequence[RawDevice]) -> Any:
    return xla_client.DeviceList(tuple(devices))


def single_device_sharding(device: RawDevice) -> Any:
    # jaxlib's SingleDeviceSharding needs methods that only jax adds (_to_xla_hlo_sharding);
    # a replicated GSPMDSharding over one device is the same placement and is pure C++.
    return _jax.GSPMDSharding(xla_client.DeviceList((device,)), xla_client.HloSharding.replicate())


def replicated_sharding(devices: Sequence[RawDevice]) -> Any:
    return _jax.GSPMDSharding(xla_client.DeviceList(tuple(devices)), xla_client.HloSharding.replicate())


def result_handler(aval: Aval, sharding: Any) -> Any:
    # skip_checks: the result already has this placement; the checks would call into jax.
    return _jax.array_result_handler(aval, sharding, True, True)


def assemble(aval: Aval, sharding: Any, arrays: Sequence[RawArray]) -> RawArray:
    """One array over several devices from one single-device array per device."""
    return _jax.ArrayImpl(aval, sharding, list(arrays), True, True)


def make_runner(executable: RawExecutable, handlers: list[Any]) -> Any:
    """run(arrays) -> output arrays of one single-device execution (asynchronous)."""
    execute_sharded = executable.execute_sharded
    counters = _COUNTERS

    def run(arrays: list[RawArray]) -> list[RawArray]:
        counters.programs_executed += 1
        return execute_sharded(arrays).consume_with_handlers(handlers)

    return run


def execute_replicated(executable: RawExecutable, arrays: list[RawArray]) -> list[list[RawArray]]:
    """[output][replica] single-device arrays of an N-replica execution."""
    _COUNTERS.programs_executed += 1
    return disassemble(executable.execute_sharded(arrays))


def disassemble(results: Any) -> list[list[RawArray]]:
    """ExecuteResults of an N-replica execution -> [output][replica] single-device arrays.
    See the module docstring: may import jax once when it is installed."""
    return results.disassemble_into_single_device_arrays()


# -- DLPack -------------------------------------------------------------------------------

# Unversioned DLPack ABI (capsule name "dltensor"), as jaxlib produces it.
_KDL_UINT = 1


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.restype = ctypes.c_void_p
_capsule_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]


class _CapsuleHolder:
    """Gives numpy's `from_dlpack` the protocol object it wants around a bare capsule."""

    __slots__ = ("capsule",)

    def __init__(self, capsule: Any) -> None:
        self.capsule = capsule

    def __dlpack__(self, stream=None, max_version=None, dl_device=None, copy=None):
        return self.capsule

    def __dlpack_device__(self) -> tuple[int, int]:
        return (1, 0)  # kDLCPU


def to_numpy(array: RawArray, dtype: np.dtype) -> np.ndarray:
    """A read-only NumPy view (zero-copy on CPU) of a single-device array, by DLPack.

    NumPy's DLPack import has no bfloat16/float8 codes: for those the capsule's dtype
    is relabelled as an unsigned integer of the same width and the result viewed as the
    ml_dtypes type, which is bit-identical."""
    capsule = buffer_to_dlpack(array)
    if dtype.kind == "V" or dtype.type.__module__.startswith("ml_dtypes"):
        tensor = _DLTensor.from_address(_capsule_pointer(capsule, b"dltensor"))
        tensor.dtype.code = _KDL_UINT
        return np.from_dlpack(_CapsuleHolder(capsule)).view(dtype)
    return np.from_dlpack(_CapsuleHolder(capsule))


# -- device -> host by copy ---------------------------------------------------------------
#
# A TPU or GPU buffer has no host memory to share: DLPack export of it fails ("cannot be used
# as a DLPack device"). Its value comes to the host through PjRT's host copy, which jaxlib
# caches on the array: `start_host_copy` enqueues it (returns at once), `host_value` waits
# for it and returns the host copy. Both look up jax's ShapedArray once when jax is
# installed (it always is beside libtpu and the CUDA plugin); without jax they work as well.


def start_host_copy(array: RawArray) -> None:
    """Enqueues the device -> host copy of a single-device array without waiting."""
    array._copy_single_device_array_to_host_async()


def host_value(array: RawArray, fresh: bool = False) -> np.ndarray:
    """A single-device array's value in host memory (read-only NumPy array; ml_dtypes for
    bf16 and the f8 types). Waits for the value and the copy; on XLA:CPU it may alias the
    buffer instead of copying (then no download is counted). `fresh`: a handle made for
    this one read (`ArrayImpl.clone()`), whose copy nobody reads again: counted as a
    download without remembering the array (`transfers.py`)."""
    host, did_copy = array._single_device_array_to_np_array_did_copy()
    if did_copy:
        if fresh:
            _COUNTERS.downloads += 1
            _COUNTERS.download_bytes += host.nbytes
        else:
            _COUNTERS.download(array, host.nbytes)
    return host


_ALWAYS_COPY = [_jax.ArrayCopySemantics.ALWAYS_COPY]


def array_copy(array: RawArray, device: RawDevice, sharding: Any) -> RawArray:
    """A new array with its own memory holding `array`'s value, on `device` (enqueued
    without waiting). `ArrayImpl.clone()` is not a copy: it shares the device memory."""
    return _jax.batched_copy_array_to_devices_with_sharding(
        [array], [device_list((device,))], [sharding], _ALWAYS_COPY)[0]


def data_pointer(array: RawArray) -> int:
    """The device address of a single-device array's memory, read from a DLPack capsule
    that is dropped unconsumed (its deleter releases the external reference at once, so
    the array can still be donated). `unsafe_buffer_pointer()` would import jax."""
    capsule = _to_dlpack(array)  # (not an export: the capsule is dropped unconsumed)
    try:
        return int(_DLTensor.from_address(_capsule_pointer(capsule, b"dltensor")).data or 0)
    finally:
        del capsule


# -- compiling ----------------------------------------------------------------------------


_EFFORT_O2 = 29  # xla::ExecutionOptions EffortLevel O2 (jax._src.config.EffortLevel.O2)
_NO_FDO_PROFILE = -1  # jax._src.compiler._NO_PROFILE_DONT_RETRIEVE
# Options of ExecutableBuildOptions itself, not XLA debug options: an env override of these
# names would not reach XLA, so they are set on the build options (as jax does).
BUILD_OPTION_OVERRIDES = frozenset(
    {"exec_time_optimization_effort", "memory_fitting_effort", "optimization_level", "memory_fitting_level"}
)


def compile_options(
    num_replicas: int, device_ids: Sequence[int], xla_options: Sequence[tuple[str, str]]
) -> Any:
    opts = xla_client.CompileOptions()
    opts.num_replicas = num_replicas
    opts.num_partitions = 1
    # As jax.jit compiles (jax._src.compiler.get_compile_options, jax 0.10.2), so a program
    # costs what JAX's would: memory fitting at effort O2 (XLA's EffortLevel; jax's default)
    # and no XLA-AutoFDO profile lookup (-1: never retrieve one). jax's partitioner flags
    # (use_spmd_partitioning, use_shardy_partitioner) stay off: these are one-partition
    # programs (test_runtime_compile_options.py compares the two option sets).
    opts.executable_build_options.memory_fitting_level = _EFFORT_O2
    opts.profile_version = _NO_FDO_PROFILE
    opts.device_assignment = xla_client.DeviceAssignment.create(
        np.asarray(list(device_ids), dtype=np.int64).reshape(num_replicas, 1)
    )
    overrides = []
    for name, value in xla_options:
        if name in BUILD_OPTION_OVERRIDES:
            setattr(opts.executable_build_options, name, _xla_option_value(value))
        else:
            overrides.append((name, _xla_option_value(value)))
    if overrides:
        opts.env_option_overrides = overrides
    return opts


def _xla_option_value(value: str) -> Any:
    low = value.strip().lower()
    if low in ("true", "false"):
        return low == "true"
    try:
        return int(value)
    except ValueError:
        pass
    try:
        return float(value)
    except ValueError:
        return value


def compile_and_load(client: RawClient, module: Any, devices: Sequence[RawDevice], options: Any) -> RawExecutable:
    return client.compile_and_load(module, xla_client.DeviceList(tuple(devices)), options)


def serialize_executable(client: RawClient, executable: RawExecutable) -> bytes:
    return bytes(client.serialize_executable(executable))


def deserialize_executable(client: RawClient, data: bytes, devices: Sequence[RawDevice]) -> RawExecutable:
    return client.deserialize_executable(data, xla_client.DeviceList(tuple(devices)), None)


_ALIAS_SECTION = re.compile(r"input_output_alias=\{(.*?)\}\s*(?:,\s*[a-z_]+=|$)")
_ALIAS_ENTRY = re.compile(r"\{[^{}]*\}:\s*\((\d+),")
_DONOR_SECTION = re.compile(r"buffer_donor=\{(.*?)\}\s*(?:,\s*[a-z_]+=|$)")
_DONOR_ENTRY = re.compile(r"\((\d+),")


def executable_signature(
    executable: RawExecutable,
) -> tuple[list[tuple[np.dtype, tuple[int, ...]]], list[tuple[np.dtype, tuple[int, ...]]], list[int]]:
    """(parameters, results, donated parameter indices) of a compiled executable, from
    its HLO: the program shape and the `input_output_alias` / `buffer_donor` header."""
    module = executable.hlo_modules()[0]
    program_shape = xla_client.XlaComputation(module.as_serialized_hlo_module_proto()).program_shape()

    def leaf(shape: Any) -> tuple[np.dtype, tuple[int, ...]]:
        return np.dtype(shape.numpy_dtype()), tuple(int(d) for d in shape.dimensions())

    params = [leaf(s) for s in program_shape.parameter_shapes()]
    result = program_shape.result_shape()
    results = [leaf(s) for s in result.tuple_shapes()] if result.is_tuple() else [leaf(result)]
    header = module.to_string().split("\n", 1)[0]
    donated: set[int] = set()
    section = _ALIAS_SECTION.search(header)
    if section:
        donated.update(int(m) for m in _ALIAS_ENTRY.findall(section.group(1)))
    section = _DONOR_SECTION.search(header)
    if section:
        donated.update(int(m) for m in _DONOR_ENTRY.findall(section.group(1)))
    return params, results, sorted(donated)


# -- MLIR (only when a module must be edited or printed) ----------------------------------

_mlir_lock = threading.Lock()
_mlir_context: Any = None


def _mlir() -> tuple[Any, Any]:
    """jaxlib.mlir's `ir` and a context with jax's dialects, created on first use
    (importing jaxlib.mlir costs ~0.6 s, so the runtime never does it eagerly)."""
    global _mlir_context
    with _mlir_lock:
        from jaxlib.mlir import ir

        if _mlir_context is None:
            from torch_tpu.core.mlir_context import make_context

            _mlir_context = make_context()
        return ir, _mlir_context


def is_mlir_object(obj: Any) -> bool:
    """True for a jaxlib.mlir `ir.Module` or `ir.Operation` (checked without importing
    jaxlib.mlir)."""
    return type(obj).__module__.startswith("jaxlib.mlir")


def mlir_text(obj: Any, debug_info: bool = False) -> str:
    """The printed form of an `ir.Module` / `ir.Operation`."""
    op = obj.operation
    return op.get_asm(enable_debug_info=debug_info)


def add_buffer_donors(module: str | bytes, arg_indices: Sequence[int], source_name: str) -> str:
    """Marks arguments of the public entry function (`main`) as donated buffers
    (`jax.buffer_donor = true`, which XLA turns into input/output aliasing when an output
    can reuse the buffer), unless they already carry `tf.aliasing_output`. Returns text."""
    ir, ctx = _mlir()
    with ctx, ir.Location.unknown():
        parsed = ir.Module.parse(module)  # text or bytecode
        main = None
        for op in parsed.body.operations:
            if op.operation.name == "func.func" and ir.StringAttr(op.attributes["sym_name"]).value == "main":
                main = op
                break
        if main is None:
            raise ValueError(f"{source_name}: no func.func @main to mark donated arguments on")
        n_args = len(main.regions[0].blocks[0].arguments)
        old = main.attributes["arg_attrs"] if "arg_attrs" in main.attributes else None  # noqa: SIM401 (no .get)
        dicts = []
        for i in range(n_args):
            entries = {}
            if old is not None:
                current = ir.DictAttr(ir.ArrayAttr(old)[i])
                for j in range(len(current)):
                    named = current[j]
                    entries[named.name] = named.attr
            if i in arg_indices and attributes.ALIASING_OUTPUT not in entries:
                entries[attributes.BUFFER_DONOR] = ir.BoolAttr.get(True)
            dicts.append(ir.DictAttr.get(entries))
        bad = [i for i in arg_indices if not 0 <= i < n_args]
        if bad:
            raise ValueError(
                f"{source_name}: donate_argnums {bad} out of range; @main has {n_args} arguments"
            )
        main.attributes["arg_attrs"] = ir.ArrayAttr.get(dicts)
        return parsed.operation.get_asm(enable_debug_info=True)


# -- versions -----------------------------------------------------------------------------


def platform_of(client: RawClient) -> tuple[str, str]:
    """(platform name, platform version) of a client."""
    return str(client.platform), str(client.platform_version)


# -- several processes (torch_tpu.runtime.distributed) ------------------------------------

DistributedRuntimeClient = _jax.DistributedRuntimeClient


def distributed_service(address: str, num_nodes: int, heartbeat_timeout_s: int, shutdown_timeout_s: int) -> Any:
    """The coordination service (run by process 0 only) at `address` ("host:port")."""
    return _jax.get_distributed_runtime_service(
        address, num_nodes, heartbeat_timeout=heartbeat_timeout_s, shutdown_timeout=shutdown_timeout_s
    )


def distributed_client(
    address: str, node_id: int, init_timeout_s: int, heartbeat_timeout_s: int, shutdown_timeout_s: int
) -> Any:
    """A process's connection to the coordination service; `.connect()` blocks until every
    process has connected (or `init_timeout_s` passes). A process that misses heartbeats
    for `heartbeat_timeout_s` makes the service abort all of them (jaxlib's
    `missed_heartbeat_callback` cannot take a Python function: std::bad_cast)."""
    return _jax.get_distributed_runtime_client(
        address, node_id, init_timeout=init_timeout_s, heartbeat_timeout=heartbeat_timeout_s,
        shutdown_timeout=shutdown_timeout_s, shutdown_on_destruction=False,
    )


def make_distributed_cpu_client(dclient: Any, node_id: int, num_nodes: int, hostname: str) -> RawClient:
    """XLA:CPU with one device in this process, its collectives carried by gloo over TCP
    to the other processes (device ids are global, and not 0..N-1)."""
    collectives = _jax.make_gloo_tcp_collectives(distributed_client=dclient, hostname=hostname)
    return xla_client.make_cpu_client(
        asynchronous=True, distributed_client=dclient, node_id=node_id, num_nodes=num_nodes,
        collectives=collectives, num_devices=1,
    )


def global_devices(client: RawClient) -> list[tuple[RawDevice, int, int]]:
    """(device, global id, process index) of every device of every process."""
    return [(d, int(d.id), int(d.process_index)) for d in client.devices()]
