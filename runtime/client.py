"""PjRT clients: platform discovery, devices, host transfers and compilation through the
compile cache.

Discovery (unless TORCH_TPU_PLATFORM forces one):
  1. tpu  -- the libtpu PjRT plugin, from TPU_LIBRARY_PATH or the `libtpu` package
  2. cuda -- the jax CUDA PjRT plugin (`xla_cuda_plugin.so` of jax_cuda13_plugin /
             jax_cuda12_plugin, or TORCH_TPU_CUDA_PLUGIN_PATH)
  3. cpu  -- XLA:CPU with TORCH_TPU_NUM_CPU_DEVICES virtual devices
A plugin that is present but fails to start is logged and skipped during discovery; a
forced platform that cannot start raises `PlatformError` saying what to install or set.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import re
import sys
import threading
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from torch_tpu.core import __version__ as _TORCH_TPU_VERSION
from torch_tpu.core import config, plugins

from . import _jaxlib
from .buffer import DeviceBuffer, host_view
from .cache import CacheConfig, CompileCache, Loaded
from .errors import (
    ArgumentError,
    CompileError,
    PlatformError,
    UnsupportedDtypeError,
    classify_jaxlib_error,
    is_out_of_memory,
    out_of_memory,
)
from .executable import CompileSpec, Executable, Signature
from .fingerprint import CacheKey, fingerprint, host_cpu_features, options_key, toolchain_fingerprint, torch_version

log = logging.getLogger("torch_tpu.runtime")

PLATFORMS = ("cpu", "cuda", "tpu")
_DEFAULT_SPEC = CompileSpec()
_ALIASES = {"gpu": "cuda", "cpu": "cpu", "cuda": "cuda", "tpu": "tpu"}


@dataclass(frozen=True, eq=False)
class Device:
    """One addressable device of a client."""

    index: int  # position in Client.devices
    id: int  # PjRT global device id
    platform: str
    kind: str
    _raw: Any = field(repr=False)
    _sharding: Any = field(repr=False)
    _raw_list: list = field(repr=False)

    def __str__(self) -> str:
        return f"{self.platform}:{self.index}"

    def memory_stats(self) -> dict[str, int]:
        """PjRT's allocator figures of this device (`bytes_in_use`, `peak_bytes_in_use`,
        `bytes_limit`, `largest_free_block_bytes` ...); empty where the platform keeps none
        (XLA:CPU allocates from the host heap)."""
        return _jaxlib.device_memory_stats(self._raw) or {}

    def memory_figures(self) -> str:
        """One line of this device's memory figures for error messages ("" when none)."""
        stats = self.memory_stats()
        if "bytes_limit" not in stats:
            return ""
        gib = 2.0**30
        text = (f"{self} has {stats.get('bytes_in_use', 0) / gib:.2f} GiB in use of "
                f"{stats['bytes_limit'] / gib:.2f} GiB")
        if "largest_free_block_bytes" in stats:
            text += f", largest free block {stats['largest_free_block_bytes'] / gib:.2f} GiB"
        return text


# -- plugin discovery ---------------------------------------------------------------------


def _libtpu_path(forced: bool) -> str | None:
    env = config.get("TPU_LIBRARY_PATH")
    if env:
        if os.path.isfile(env):
            return env
        message = f"TPU_LIBRARY_PATH={env} does not exist"
        if forced:
            raise PlatformError(f"{message}; point it at libtpu.so or unset it to use the libtpu package")
        log.warning("%s; looking for the libtpu package instead", message)
    if importlib.util.find_spec(plugins.TPU_PLUGIN_PACKAGE) is not None:
        try:
            import libtpu

            return libtpu.get_library_path()
        except Exception as err:  # noqa: BLE001 - a broken package is "not found"
            log.info("the libtpu package is installed but unusable: %s", err)
    return None


def _cuda_plugin_path() -> str | None:
    env = config.get("TORCH_TPU_CUDA_PLUGIN_PATH")
    if env:
        if os.path.isfile(env):
            return env
        raise PlatformError(
            f"TORCH_TPU_CUDA_PLUGIN_PATH={env} does not exist; point it at xla_cuda_plugin.so or unset it"
        )
    for package in plugins.CUDA_PLUGIN_PACKAGES:
        try:
            spec = importlib.util.find_spec(package)
        except (ImportError, ValueError):
            continue
        if spec is None:
            continue
        for folder in spec.submodule_search_locations or [os.path.dirname(spec.origin or "")]:
            candidate = os.path.join(folder, "xla_cuda_plugin.so")
            if os.path.isfile(candidate):
                return candidate
    return None


def _make_raw_client(platform: str, forced: bool, num_cpu_devices: int | None) -> Any:
    if platform == "cpu":
        n = num_cpu_devices if num_cpu_devices is not None else config.get("TORCH_TPU_NUM_CPU_DEVICES")
        if n < 1:
            raise PlatformError(f"TORCH_TPU_NUM_CPU_DEVICES={n}: need at least one CPU device")
        return _jaxlib.make_cpu_client(n)
    path, what, options = _plugin(platform, forced)
    return _start_plugin(platform, path, what, options)


def _plugin(platform: str, forced: bool) -> tuple[str, str, dict[str, Any]]:
    """(library path, how errors name it, client options) of the PjRT plugin of a TPU or
    CUDA `platform`; a missing plugin raises `PlatformError` saying what to install."""
    if platform == "tpu":
        path = _libtpu_path(forced)
        if path is None:
            raise PlatformError(
                "no TPU PjRT plugin: install libtpu (pip install 'libtpu==0.0.42.*', the release "
                f"paired with jaxlib {_jaxlib.JAXLIB_VERSION}) or set TPU_LIBRARY_PATH to libtpu.so"
            )
        return path, f"the libtpu plugin at {path}", {}
    if platform == "cuda":
        path = _cuda_plugin_path()
        if path is None:
            raise PlatformError(
                "no CUDA PjRT plugin: install it (pip install 'jax-cuda12-plugin[with-cuda]=="
                f"{_jaxlib.JAXLIB_VERSION}') or set TORCH_TPU_CUDA_PLUGIN_PATH to xla_cuda_plugin.so"
            )
        return path, f"the CUDA plugin at {path}", _jaxlib.gpu_plugin_options()
    raise PlatformError(f"unknown platform {platform!r}; use one of {', '.join(PLATFORMS)}")


def _start_plugin(platform: str, path: str, what: str, options: dict[str, Any],
                  distributed_client: Any = None) -> Any:
    try:
        return _jaxlib.make_plugin_client(platform, path, options, distributed_client)
    except Exception as err:  # noqa: BLE001 - plugin failures come in many types
        raise PlatformError(
            f"{what} failed to start: {err}. Check that a {platform.upper()} device is present and "
            f"not in use by another process, and that the plugin matches jaxlib {_jaxlib.JAXLIB_VERSION}"
        ) from None


def make_multiprocess_raw_client(distributed_client: Any, node_id: int, num_nodes: int, hostname: str,
                                 local_device: int | None = None) -> tuple[str, Any]:
    """(platform, raw client) of process `node_id` of a `num_nodes`-process job connected
    through `distributed_client` (the coordination service's client): the platform that
    `get_client()` would pick (TORCH_TPU_PLATFORM, else discovery: tpu, cuda, cpu).

    * XLA:CPU: one device, its collectives carried by gloo over TCP (listening at `hostname`).
    * TPU / CUDA plugins: as jax makes them, `make_c_api_client(name, options + {node_id,
      num_nodes}, distributed_client)`; the plugin exchanges its topology (and, on CUDA,
      NCCL's ids) through the coordination service. On CUDA, `local_device` (torchrun's
      LOCAL_RANK) restricts the process to that GPU (the plugin's `visible_devices`), so
      each process's `tpu:0` is its own GPU. Written from jaxlib 0.10.2's signatures and
      jax's plugin factory; not run here (no GPU or TPU): docs/explanation/distributed.md."""
    forced = config.get("TORCH_TPU_PLATFORM")
    chosen = normalize_platform(forced) if forced else None
    # Only the plugins are tried here; XLA:CPU (forced, or none of them found) is the
    # gloo-backed client below, never a plugin.
    candidates = [] if chosen == "cpu" else [chosen] if chosen else ["tpu", "cuda"]
    for platform in candidates:
        try:
            path, what, options = _plugin(platform, bool(forced))
        except PlatformError:
            if forced:
                raise
            continue
        options = {**options, "node_id": int(node_id), "num_nodes": int(num_nodes)}
        if platform == "cuda" and local_device is not None:
            options["visible_devices"] = [int(local_device)]
        try:
            return platform, _start_plugin(platform, path, what, options, distributed_client)
        except PlatformError as err:
            if forced:
                raise
            log.info("skipping %s: %s", platform, err)
    try:
        return "cpu", _jaxlib.make_distributed_cpu_client(distributed_client, node_id, num_nodes, hostname)
    except Exception as err:  # noqa: BLE001
        raise PlatformError(f"the multi-process CPU client failed to start: {err}") from None


def _discover(num_cpu_devices: int | None) -> tuple[str, Any]:
    for platform, find in (("tpu", lambda: _libtpu_path(False)), ("cuda", _cuda_plugin_path)):
        try:
            if find() is None:
                continue
            return platform, _make_raw_client(platform, False, None)
        except PlatformError as err:
            log.info("skipping %s: %s", platform, err)
    return "cpu", _make_raw_client("cpu", False, num_cpu_devices)


def normalize_platform(name: str) -> str:
    key = name.strip().lower()
    if key not in _ALIASES:
        raise PlatformError(f"unknown platform {name!r} (TORCH_TPU_PLATFORM); use one of cpu, cuda (gpu), tpu")
    return _ALIASES[key]


# -- the client ---------------------------------------------------------------------------


class Client:
    """A PjRT client for one platform. Use `get_client()` for the process-wide one."""

    def __init__(self, platform: str, raw: Any, cache_config: CacheConfig | None = None) -> None:
        self._raw = raw
        _, version = _jaxlib.platform_of(raw)
        self.platform = platform
        self.platform_version = version
        devices = []
        for index, (d, device_id, kind) in enumerate(_jaxlib.client_devices(raw)):
            devices.append(Device(index, device_id, platform, kind, d, _jaxlib.single_device_sharding(d), [d]))
        self.devices: tuple[Device, ...] = tuple(devices)
        self._cache_lock = threading.Lock()
        self._cache: CompileCache | None = None
        self._cache_config = cache_config
        self._key_base = self._versions()
        self._options_keys: dict[tuple[CompileSpec, tuple[int, ...]], int] = {}

    def __repr__(self) -> str:
        return f"Client({self.platform}, {len(self.devices)} device(s), {self.platform_version!r})"

    @classmethod
    def create(
        cls,
        platform: str = "cpu",
        *,
        num_cpu_devices: int | None = None,
        cache_config: CacheConfig | None = None,
    ) -> Client:
        """A new client of its own (not the process-wide one of `get_client`), with its
        own compile cache: for tests and tools that need isolation."""
        name = normalize_platform(platform)
        return cls(name, _make_raw_client(name, True, num_cpu_devices), cache_config)

    def _versions(self) -> dict[str, Any]:
        fields: dict[str, Any] = {
            "torch_tpu": _TORCH_TPU_VERSION,
            "toolchain_source": toolchain_fingerprint(),
            "torch": torch_version(),
            "jaxlib": _jaxlib.JAXLIB_VERSION,
            "platform": self.platform,
            "platform_version": self.platform_version,
            "device_kind": self.devices[0].kind if self.devices else "",
        }
        if self.platform == "cpu":
            fields["host_cpu"] = host_cpu_features()
        if self.platform == "tpu":
            try:
                from importlib.metadata import version

                fields["libtpu"] = version("libtpu")
            except Exception:  # noqa: BLE001 - libtpu from TPU_LIBRARY_PATH has no metadata
                fields["libtpu"] = config.get("TPU_LIBRARY_PATH") or ""
        return fields

    # -- cache --------------------------------------------------------------------------------

    @property
    def cache(self) -> CompileCache:
        cache = self._cache
        if cache is not None:
            return cache
        with self._cache_lock:
            if self._cache is None:
                self._cache = CompileCache(self._cache_config or CacheConfig.from_env())
            return self._cache

    def configure_cache(self, cache_config: CacheConfig) -> CompileCache:
        """Replaces the compile cache (the old in-process L1 is dropped)."""
        with self._cache_lock:
            if self._cache is not None:
                self._cache.shutdown()
            self._cache_config = cache_config
            self._cache = CompileCache(cache_config)
            return self._cache

    def options_key(self, spec: CompileSpec, device_ids: tuple[int, ...]) -> int:
        memo = (spec, device_ids)
        key = self._options_keys.get(memo)
        if key is None:
            key = options_key({**self._key_base, **spec.key_fields(), "device_ids": list(device_ids)})
            if len(self._options_keys) < 4096:
                self._options_keys[memo] = key
        return key

    # -- buffers ------------------------------------------------------------------------------

    def device(self, index: int) -> Device:
        if not 0 <= index < len(self.devices):
            raise ArgumentError(
                f"device index {index} out of range: the {self.platform} client has {len(self.devices)} "
                "device(s)" + (" (set TORCH_TPU_NUM_CPU_DEVICES for more)" if self.platform == "cpu" else "")
            )
        return self.devices[index]

    def to_device(self, value: Any, device_index: int = 0, *, copy: bool = False,
                  wait: bool = True) -> DeviceBuffer:
        """A torch tensor or NumPy array on a device. On XLA:CPU a contiguous 64-byte aligned
        tensor is aliased, not copied (`copy=True` forces a copy): do not modify it while the
        buffer is in use. Other tensors, and other platforms, are copied, and the host value
        may change as soon as this returns. Elsewhere than on XLA:CPU, the bytes are staged
        (copied during the call, which returns without waiting for the device), except that
        `wait=True` (the default) transfers more than 64 MB straight from the host memory and
        returns once the transfer is done (PjRT's zero-copy semantics: no staging copy, ~3x
        the bandwidth of one at 256 MB on a TPU v5e, where staging is ~2x faster up to
        64 MB: `_jaxlib.STAGED_UPLOAD_BYTES`)."""
        device = self.device(device_index)
        host, aligned, row = host_view(value)
        check_platform_dtype(self.platform, row, device)
        cpu = self.platform == "cpu"
        if cpu:
            semantics = _jaxlib.ZERO_COPY if (aligned and not copy) else _jaxlib.COPY_DURING_CALL
        else:
            semantics = _jaxlib.upload_semantics(host.nbytes) if wait else _jaxlib.COPY_DURING_CALL
        aval = _jaxlib.Aval.of(host.shape, row.numpy)
        try:
            array = _jaxlib.batched_device_put(aval, device._sharding, [host], device._raw_list, True, False, semantics, True)
            if not cpu and semantics is _jaxlib.ZERO_COPY:
                _jaxlib.array_block_until_ready(array)  # the host memory is read until then
        except _jaxlib.JaxRuntimeError as err:
            raise classify_jaxlib_error(err, f"copying {aval} to {device}", "see the error above",
                                        device.memory_figures()) from None
        return DeviceBuffer(array, tuple(host.shape), row, device)

    def synchronize(self) -> None:
        """Waits for every computation and transfer of this client to finish."""
        arrays = _jaxlib.live_arrays(self._raw)
        if arrays:
            try:
                _jaxlib.batched_block_until_ready(arrays)
            except _jaxlib.JaxRuntimeError as err:
                raise classify_jaxlib_error(err, f"synchronizing {self.platform}", "see the error above") from None

    # -- compiling ----------------------------------------------------------------------------

    def compile(
        self,
        module: Any,
        *,
        options: CompileSpec | None = None,
        fingerprint: Any = None,
        name: str | None = None,
    ) -> Executable:
        """Compiles a module through the compile cache (L1, L2, L3, then XLA).

        module:      MLIR text, bytecode (bytes), a jaxlib.mlir ir.Module / ir.Operation, or
                     a zero-argument callable returning one (called only on a cache miss;
                     then `fingerprint` is required)
        fingerprint: what keys the cache instead of the module: an object with
                     cache_fingerprint() -> (bytes, bytes), or a (shapeless, dims) pair of ints
        name:        how errors name the module (a file name, a graph name)
        """
        spec = options or _DEFAULT_SPEC
        hit = self.cache.l1_get(self.cache_key(module, spec, fingerprint))
        if hit is not None:
            return hit
        return self.compile_async(module, options=spec, fingerprint=fingerprint, name=name).result()

    def compile_async(
        self,
        module: Any,
        *,
        options: CompileSpec | None = None,
        fingerprint: Any = None,
        name: str | None = None,
    ) -> Future[Executable]:
        """Like `compile`, returning a future; compiles run on the cache's thread pool."""
        spec = options or _DEFAULT_SPEC
        name = name or "module"
        devices = self._devices_for(spec)
        key = self.cache_key(module, spec, fingerprint, devices)
        cache = self.cache
        hit = cache.l1_get(key)
        if hit is not None:
            done: Future[Executable] = Future()
            done.set_result(hit)
            return done
        loaded = cache.get_or_compile(
            key,
            lambda: self._compile_uncached(module, spec, key, devices, name),
            lambda payload, meta: self._load(payload, meta, spec, key, devices, name),
            self.platform_version,
        )
        result: Future[Executable] = Future()

        def done(f: Future[Loaded[Executable]]) -> None:
            err = f.exception()
            if err is not None:
                result.set_exception(err)
            else:
                loaded = f.result()
                if loaded.origin != "l1":
                    loaded.value.origin = loaded.origin
                result.set_result(loaded.value)

        loaded.add_done_callback(done)
        return result

    def cache_key(self, module: Any, spec: CompileSpec, fp: Any = None, devices: tuple[Device, ...] | None = None) -> CacheKey:
        devices = devices or self._devices_for(spec)
        if fp is None:
            if callable(module) and not _is_module_value(module):
                raise TypeError("Client.compile: a module given as a callable needs fingerprint=...")
            shapeless, dims = fingerprint(module)
        elif isinstance(fp, tuple) and len(fp) == 2 and all(isinstance(v, int) for v in fp):
            shapeless, dims = fp
        else:
            shapeless, dims = fingerprint(fp)
        return CacheKey(shapeless, dims, self.options_key(spec, tuple(d.id for d in devices)))

    def _devices_for(self, spec: CompileSpec) -> tuple[Device, ...]:
        indices = spec.device_indices if spec.device_indices is not None else tuple(range(spec.num_replicas))
        if spec.num_replicas > len(self.devices):
            raise ArgumentError(
                f"{spec.num_replicas} replicas need {spec.num_replicas} devices; the {self.platform} client "
                f"has {len(self.devices)}"
                + (" (set TORCH_TPU_NUM_CPU_DEVICES)" if self.platform == "cpu" else "")
            )
        return tuple(self.device(i) for i in indices)

    def _compile_uncached(
        self, module: Any, spec: CompileSpec, key: CacheKey, devices: tuple[Device, ...], name: str
    ) -> tuple[Executable, bytes | None, dict[str, Any]]:
        if callable(module) and not _is_module_value(module):
            module = module()
        source = module
        if spec.donate_argnums:
            if _jaxlib.is_mlir_object(source):
                source = _jaxlib.mlir_text(source, debug_info=True)
            try:
                source = _jaxlib.add_buffer_donors(source, spec.donate_argnums, name)
            except ValueError as err:
                raise CompileError(str(err)) from None
            except Exception as err:  # noqa: BLE001 - ir.MLIRError and friends
                raise CompileError(f"{name}: cannot parse the module to mark donated arguments: {err}") from None
        elif isinstance(source, bytearray):
            source = bytes(source)
        if self.platform in PLATFORM_MISSING_TYPES:
            _check_module_types(self.platform, source, name)
        host_custom_calls = self.platform == "cpu" and _jaxlib.calls_host_custom_calls(source)
        if host_custom_calls:
            _jaxlib.register_host_custom_calls()
        options = _jaxlib.compile_options(spec.num_replicas, [d.id for d in devices], spec.xla_options)
        try:
            raw = _jaxlib.compile_and_load(self._raw, source, [d._raw for d in devices], options)
        except _jaxlib.JaxRuntimeError as err:
            if is_out_of_memory(str(err)):
                raise out_of_memory(f"{name}: compiling for {devices[0]}", format_xla_error(str(err), name),
                                    devices[0].memory_figures()) from None
            raise CompileError(format_xla_error(str(err), name)) from None
        try:
            signature = Signature.of(raw)
        except Exception as err:  # noqa: BLE001
            raise CompileError(f"{name}: {err}") from None
        payload: bytes | None = None
        # Serialized only for a tier that stores it: the compile's future (a first call
        # waiting for XLA) resolves after this (~20 ms for the quickstart model).
        if self.cache.l2 is not None or self.cache.l3 is not None:
            try:
                payload = _jaxlib.serialize_executable(self._raw, raw)
            except Exception as err:  # noqa: BLE001 - some plugins cannot serialize
                log.info("%s: the %s platform cannot serialize executables (%s); not caching on disk", name,
                         self.platform, err)
        metadata = {
            "platform": self.platform,
            "platform_version": self.platform_version,
            "jaxlib": _jaxlib.JAXLIB_VERSION,
            "torch_tpu": _TORCH_TPU_VERSION,
            "name": name,
            "num_replicas": spec.num_replicas,
            "device_ids": [d.id for d in devices],
            "signature": signature.to_json(),
            "host_custom_calls": host_custom_calls,
        }
        return Executable(self, raw, signature, spec, key, devices, "compile", name), payload, metadata

    def _load(
        self, payload: bytes, metadata: dict[str, Any], spec: CompileSpec, key: CacheKey,
        devices: tuple[Device, ...], name: str,
    ) -> Executable:
        signature = Signature.from_json(metadata["signature"])
        if metadata.get("host_custom_calls"):
            _jaxlib.register_host_custom_calls()  # the handlers live in this process, not the entry
        raw = _jaxlib.deserialize_executable(self._raw, payload, [d._raw for d in devices])
        return Executable(self, raw, signature, spec, key, devices, "cache", name)


# Element types a platform's compiler cannot hold (measured: XLA:TPU aborts the process on
# a complex128 value -- in a transfer or a program -- instead of returning an error).
PLATFORM_MISSING_TYPES: dict[str, frozenset[str]] = {"tpu": frozenset({"complex<f64>"})}


def check_platform_dtype(platform: str, row: Any, device: Device) -> None:
    """Refuses a host value of an element type `platform` lacks, on its way to `device`
    (runs on every upload: the message is only built for a refusal)."""
    if row.mlir in PLATFORM_MISSING_TYPES.get(platform, ()):
        raise UnsupportedDtypeError(
            f"copying a {row.torch_name} tensor to {device}: the {platform} platform has no "
            f"{row.torch_name} ({row.mlir}) element type; "
            f"convert first (complex128 -> complex64: .to(torch.complex64)), or keep the value on the CPU"
        )


def _check_module_types(platform: str, source: Any, name: str) -> None:
    """Refuses a module holding an element type the platform lacks, before XLA sees it
    (XLA:TPU aborts on complex128). Text and MLIR objects are checked; bytecode (saved
    exports) goes to XLA as it is."""
    if isinstance(source, (bytes, bytearray)):
        return
    text = source if isinstance(source, str) else _jaxlib.mlir_text(source)
    for mlir in PLATFORM_MISSING_TYPES[platform]:
        if mlir in text:
            from .dtypes import from_mlir

            row = from_mlir(mlir)
            raise UnsupportedDtypeError(
                f"{name}: the module computes with {row.torch_name} ({mlir}), which the {platform} "
                f"platform has no element type for; use complex64 / a narrower type, or run it on the CPU"
            )


def _is_module_value(module: Any) -> bool:
    return isinstance(module, (str, bytes, bytearray)) or _jaxlib.is_mlir_object(module)


_STATUS_PREFIX = re.compile(r"^[A-Z_]+:\s*")
_STDIN_LOC = re.compile(r"(^|\s)-:(\d+):(\d+):")
_NOISE = ("Failed to parse using StableHLO",)
# MLIR's parser advises a flag of mlir-opt-style tools; XLA compiles StableHLO only, so the
# useful advice is to lower the op first (torchtpu-opt runs the torchtpu passes).
_UNREGISTERED = re.compile(
    r"operation being parsed with an unregistered dialect\. If this is intended, please use "
    r"-allow-unregistered-dialect with the MLIR tool used"
)
_UNREGISTERED_ADVICE = (
    "operation of an unregistered dialect: XLA compiles StableHLO only. A torchtpu.* op must be "
    "lowered first, e.g. torchtpu-opt {name} --torchtpu-decompose-views --torchtpu-inverse-views "
    "--torchtpu-lower-collectives -o lowered.mlir (the passes `torch.compile` runs)"
)


_MISSING_HANDLER = re.compile(
    r"No (?:FFI handler registered for|registered implementation for (?:untyped )?custom call to) "
    r"([\w.$-]+) (?:on a platform|for) (\w+)"
)


def format_xla_error(message: str, name: str) -> str:
    """XLA's compile error, with the module's name in place of `-` in locations, the
    status code and the parser's version boilerplate removed."""
    lines = []
    for line in message.strip().splitlines():
        line = _STATUS_PREFIX.sub("", line, count=1) if not lines else line
        if any(noise in line for noise in _NOISE) or not line.strip():
            continue
        line = _STDIN_LOC.sub(lambda m: f"{m.group(1)}{name}:{m.group(2)}:{m.group(3)}:", line)
        line = line.removeprefix("<unknown>:0: ")
        line = _UNREGISTERED.sub(_UNREGISTERED_ADVICE.format(name=name), line)
        lines.append(line)
    if not lines:
        lines = [message.strip()]
    first = lines[0]
    missing = _MISSING_HANDLER.search(message)
    if missing:
        # XLA's own lines follow (the instruction, its op metadata and source location).
        first = (
            f"{name}: error: the module calls the custom-call target '{missing.group(1)}', which has no "
            f"handler registered in this process for platform {missing.group(2)}; register it with "
            "jaxlib.xla_client.register_custom_call_target before compiling, or run the module on a "
            "platform that provides it (torch_tpu registers jaxlib's CPU LAPACK targets itself)"
        )
        return "\n".join([first] + lines)
    if not first.startswith(name + ":"):
        first = f"{name}: error: XLA cannot compile the module: {first}"
    return "\n".join([first] + lines[1:])


# -- process-wide clients -----------------------------------------------------------------

_clients: dict[str, Client] = {}
_default: str | None = None
_clients_lock = threading.Lock()


def get_client(platform: str | None = None, *, num_cpu_devices: int | None = None) -> Client:
    """The process-wide client of a platform ("cpu", "cuda"/"gpu", "tpu"), created on first
    use; without `platform`, TORCH_TPU_PLATFORM or discovery decides. `num_cpu_devices`
    overrides TORCH_TPU_NUM_CPU_DEVICES when the CPU client is created."""
    global _default
    with _clients_lock:
        if platform is None:
            if _default is None:
                forced = config.get("TORCH_TPU_PLATFORM")
                if forced:
                    name = normalize_platform(forced)
                    raw = _make_raw_client(name, True, num_cpu_devices)
                else:
                    name, raw = _discover(num_cpu_devices)
                _default = name
                if name not in _clients:
                    _clients[name] = Client(name, raw)
                log.info("torch_tpu runtime: using %s", _clients[name])
            client = _clients[_default]
        else:
            name = normalize_platform(platform)
            client = _clients.get(name)
            if client is None:
                client = Client(name, _make_raw_client(name, True, num_cpu_devices))
                _clients[name] = client
        if num_cpu_devices is not None and client.platform == "cpu" and len(client.devices) < num_cpu_devices:
            raise PlatformError(
                f"the CPU client already exists with {len(client.devices)} device(s); {num_cpu_devices} "
                "requested. Set TORCH_TPU_NUM_CPU_DEVICES before the first use of the runtime"
            )
        return client


def install_client(platform: str, raw: Any) -> Client:
    """Makes a client built elsewhere in the runtime (the multi-process client of
    `runtime.distributed`) the process-wide one of `platform` and the default. Raises if
    the runtime already made a client of that platform: its buffers would belong to it."""
    global _default
    name = normalize_platform(platform)
    with _clients_lock:
        if name in _clients or (_default is not None and _default != name):
            raise _client_exists_error(_default or name)
        client = _clients[name] = Client(name, raw)
        _default = name
        return client


def require_no_client() -> None:
    """Raises (as `install_client` would) if the runtime already made a client in this
    process: checked before a multi-process client is created, so that the rank fails
    before it takes part in the collective creation, not after its peers counted on it."""
    with _clients_lock:
        existing = _default or next(iter(_clients), None)
    if existing is not None:
        raise _client_exists_error(existing)


def uninstall_client(client: Client) -> None:
    """Undoes `install_client(...)` of a multi-process job that then could not start, so
    the process can still try again (or run single-process) without a client tied to it."""
    global _default
    with _clients_lock:
        if _clients.get(client.platform) is client:
            del _clients[client.platform]
            if _default == client.platform:
                _default = None


def _client_exists_error(platform: str) -> PlatformError:
    return PlatformError(
        f"the {platform} runtime client already exists in this process, so it cannot "
        "become part of a multi-process job: call torch.distributed.init_process_group "
        "(or torch_tpu.runtime.distributed.initialize) before the first tpu tensor or compile"
    )


def synchronize() -> None:
    """Waits for all work of every client created so far."""
    for client in list(_clients.values()):
        client.synchronize()
