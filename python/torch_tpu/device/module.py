"""`torch.tpu`: the device module of the eager `tpu` device (registered with
`torch._register_device_module`, as `torch.cuda` is for CUDA)."""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any, NamedTuple

import torch

from . import _random
from ._buffers import TABLE

_state = threading.local()


def _client():
    from torch_tpu.runtime import get_client

    return get_client()


def is_available() -> bool:
    try:
        return len(_client().devices) > 0
    except Exception:  # noqa: BLE001 - no platform starts: not available
        return False


def is_initialized() -> bool:
    return True


def _is_in_bad_fork() -> bool:
    return False


def get_amp_supported_dtype() -> list[torch.dtype]:
    """The dtypes `torch.autocast("tpu", dtype=...)` accepts (PyTorch's autocast asks
    the device module). bfloat16 is the TPU's native low-precision type; float16 is
    supported by XLA too."""
    return [torch.bfloat16, torch.float16]


def is_bf16_supported(including_emulation: bool = True) -> bool:
    return True


def get_autocast_dtype() -> torch.dtype:
    return torch.get_autocast_dtype("tpu")


def device_count() -> int:
    return len(_client().devices)


def current_device() -> int:
    return getattr(_state, "device", 0)


def _index(device: Any) -> int:
    if device is None:
        return current_device()
    if isinstance(device, int):
        return device
    device = torch.device(device)
    if device.type != "tpu":
        raise ValueError(f"torch.tpu: expected a tpu device, got {device}")
    return device.index if device.index is not None else current_device()


def set_device(device: Any) -> None:
    index = _index(device)
    if not 0 <= index < device_count():
        raise RuntimeError(f"torch.tpu.set_device: tpu:{index} does not exist ({device_count()} device(s))")
    _state.device = index


class device(contextlib.ContextDecorator):
    """`with torch.tpu.device(1): ...` makes tpu:1 the current device in the block."""

    def __init__(self, device: Any) -> None:
        self.index = _index(device) if device is not None else None

    def __enter__(self):
        self.previous = current_device()
        if self.index is not None:
            set_device(self.index)
        return self

    def __exit__(self, *exc) -> None:
        _state.device = self.previous


def synchronize(device: Any = None) -> None:
    """Runs the ops FUSED mode recorded, then waits for every enqueued op and transfer
    (of every device: one client), non_blocking copies to the host included."""
    from ._fused import flush_all
    from ._host_copies import land

    flush_all()
    _client().synchronize()
    land()


# -- random ---------------------------------------------------------------------------
# Each device has one generator (_random.py), drawn from by eager tpu random ops and by
# compiled graphs on tpu tensors. Random ops without a lowering run on CPU and draw from
# the CPU generator, so seeding also seeds that one (reproducible either way).
def manual_seed(seed: int) -> None:
    _random.generator(current_device()).manual_seed(int(seed))
    torch.default_generator.manual_seed(int(seed))


def manual_seed_all(seed: int) -> None:
    for index in range(device_count()):
        _random.generator(index).manual_seed(int(seed))
    torch.default_generator.manual_seed(int(seed))


def seed() -> None:
    manual_seed(torch.seed())


def seed_all() -> None:
    manual_seed_all(torch.seed())


def initial_seed() -> int:
    return _random.generator(current_device()).seed


def get_rng_state(device: Any = "tpu") -> torch.Tensor:
    """The device generator's state: 16 bytes (seed, offset), as CUDA's."""
    return _random.generator(_index(device)).get_state()


def set_rng_state(new_state: torch.Tensor, device: Any = "tpu") -> None:
    _random.generator(_index(device)).set_state(new_state)


def get_rng_state_all() -> list[torch.Tensor]:
    return [get_rng_state(index) for index in range(device_count())]


def set_rng_state_all(states) -> None:
    for index, state in enumerate(states):
        set_rng_state(state, index)


# -- streams and events (synchronous: one in-order queue per device) ------------------------
class Stream:
    """A stream: ops on the device run in order on one queue, so every stream is that
    queue; `synchronize` waits for all of it. Enough for FSDP2's stream handling."""

    def __init__(self, device: Any = None, priority: int = 0, **kwargs: Any) -> None:
        self.device = torch.device("tpu", _index(device))
        self.priority = priority

    def synchronize(self) -> None:
        synchronize()

    def wait_stream(self, stream: "Stream") -> None:
        pass

    def wait_event(self, event: "Event") -> None:
        pass

    def record_event(self, event: "Event | None" = None) -> "Event":
        event = event or Event()
        event.record(self)
        return event

    def query(self) -> bool:
        """Whether everything enqueued has completed: non_blocking copies to the host
        land when their values are computed (ops on the device are not tracked)."""
        from ._host_copies import land_ready, snapshot

        return land_ready(snapshot())

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        pass


class Event:
    """Marks a point in the device's one queue. `synchronize()` waits for the work before
    it, non_blocking copies to the host included; `query()` says whether those copies have
    landed. With `enable_timing=True`, `record()` waits for the work enqueued before it and
    stamps the host's clock (PjRT gives no device timestamps), so `elapsed_time` measures
    the work enqueued between two records, as a CUDA timing event pair does -- at the cost of
    the wait at each record."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False) -> None:
        self._recorded = False
        self._copies = 0  # the last non_blocking copy before it (_host_copies.snapshot)
        self._timing = enable_timing
        self._stamp: float | None = None  # perf_counter at the record, once the work before it was done

    def record(self, stream: Stream | None = None) -> None:
        from ._host_copies import snapshot

        self._recorded = True
        self._copies = snapshot()
        if self._timing:
            synchronize()
            self._stamp = time.perf_counter()

    def wait(self, stream: Stream | None = None) -> None:
        pass

    def query(self) -> bool:
        from ._host_copies import land_ready

        return land_ready(self._copies)

    def synchronize(self) -> None:
        from ._host_copies import land

        land(self._copies)
        synchronize()

    def elapsed_time(self, end: "Event") -> float:
        """Milliseconds from this event's record to `end`'s (both made with enable_timing=True
        and recorded, as CUDA requires)."""
        if not (self._timing and end._timing):
            raise RuntimeError("torch.tpu.Event.elapsed_time: both events must be created with enable_timing=True")
        if self._stamp is None or end._stamp is None:
            raise RuntimeError("torch.tpu.Event.elapsed_time: both events must be recorded before the elapsed time "
                               "between them can be read; call record() on each")
        return (end._stamp - self._stamp) * 1000.0


_default_streams: dict[int, Stream] = {}


def current_stream(device: Any = None) -> Stream:
    index = _index(device)
    if index not in _default_streams:
        _default_streams[index] = Stream(index)
    return _default_streams[index]


default_stream = current_stream


@contextlib.contextmanager
def stream(s: Stream | None):
    yield s


# -- memory ---------------------------------------------------------------------------
def memory_allocated(device: Any = None) -> int:
    """Bytes held by live tpu storages of the device."""
    return TABLE.allocated_bytes.get(_index(device), 0)


def max_memory_allocated(device: Any = None) -> int:
    return TABLE.peak_bytes.get(_index(device), 0)


def reset_peak_memory_stats(device: Any = None) -> None:
    TABLE.reset_peak(_index(device))


def _runtime_device(device: Any):
    return _client().device(_index(device))


def memory_stats(device: Any = None) -> dict[str, int]:
    """torch.cuda-style figures: bytes of live tpu storages (`allocated_bytes.all.*`, what
    PyTorch holds), the device allocator's (`reserved_bytes.all.*`: `memory_reserved()` and
    `max_memory_reserved()`) and, where the platform keeps them (TPU, GPU), the device allocator's own
    figures from PjRT (`bytes_in_use`, `peak_bytes_in_use`, `bytes_limit`,
    `largest_free_block_bytes`, ...: everything on the chip, compiled programs' temporaries
    and buffers torch_tpu holds for itself included)."""
    index = _index(device)
    allocator = _runtime_device(index).memory_stats()
    stats = {
        "allocated_bytes.all.current": memory_allocated(index),
        "allocated_bytes.all.peak": max_memory_allocated(index),
        "num_storages": len(TABLE),
        "reserved_bytes.all.current": _reserved(allocator, index),
        "reserved_bytes.all.peak": _peak_reserved(allocator, index),
    }
    stats.update(allocator)
    return stats


def transfer_stats():
    """The process's host <-> device traffic and program launches so far
    (`torch_tpu.runtime.TransferStats`: uploads, upload_bytes, aliased_upload_bytes,
    downloads, download_bytes, dlpack_exports, programs_executed); subtract two snapshots
    for what happened in between. Process-wide, like the runtime's client."""
    from torch_tpu.runtime import transfer_stats as runtime_stats

    return runtime_stats()


def reset_transfer_stats() -> None:
    """Sets `transfer_stats()`'s counters back to zero."""
    from torch_tpu.runtime import reset_transfer_stats as runtime_reset

    runtime_reset()


def mem_get_info(device: Any = None) -> tuple[int, int]:
    """(free, total) bytes of the device's memory, as `torch.cuda.mem_get_info`; from PjRT's
    allocator (`bytes_limit` - `bytes_in_use`). XLA:CPU keeps no such figures: raises."""
    target = _runtime_device(device)
    stats = target.memory_stats()
    if "bytes_limit" not in stats:
        raise RuntimeError(f"torch.tpu.mem_get_info: the {target.platform} platform reports no device memory "
                           "figures (XLA:CPU allocates from the host heap); use memory_allocated() instead")
    return stats["bytes_limit"] - stats.get("bytes_in_use", 0), stats["bytes_limit"]


def memory_reserved(device: Any = None) -> int:
    """Bytes the device allocator holds (PjRT `bytes_reserved` where reported, else its
    bytes in use); on XLA:CPU, the bytes of live tpu storages."""
    return _reserved(_runtime_device(device).memory_stats(), device)


def max_memory_reserved(device: Any = None) -> int:
    return _peak_reserved(_runtime_device(device).memory_stats(), device)


def _reserved(allocator: dict[str, int], device: Any) -> int:
    """`memory_reserved` from the allocator's figures (PjRT's `memory_stats()`, read once)."""
    if not allocator:
        return memory_allocated(device)
    return max(allocator.get("bytes_reserved", 0), allocator.get("bytes_in_use", 0))


def _peak_reserved(allocator: dict[str, int], device: Any) -> int:
    if not allocator:
        return max_memory_allocated(device)
    return max(allocator.get("peak_bytes_reserved", 0), allocator.get("peak_bytes_in_use", 0))


def _format_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


# memory_stats() keys a summary names, in order: (key, label); abbreviated summaries stop at
# the PjRT allocator's figures.
_SUMMARY_ROWS = (
    ("allocated_bytes.all.current", "allocated by tpu storages, current"),
    ("allocated_bytes.all.peak", "allocated by tpu storages, peak"),
    ("reserved_bytes.all.current", "reserved by the device allocator, current"),
    ("reserved_bytes.all.peak", "reserved by the device allocator, peak"),
)


def memory_summary(device: Any = None, abbreviated: bool = False) -> str:
    """A readable table of `memory_stats()`, as `torch.cuda.memory_summary`: the bytes of
    live tpu storages and the device allocator's reserved bytes (current and peak), then,
    unless `abbreviated`, every other figure PjRT reports for the device (byte figures in
    KiB/MiB/GiB; none on XLA:CPU)."""
    index = _index(device)
    stats = memory_stats(index)
    target = _runtime_device(index)
    lines = [f"torch_tpu memory summary, tpu:{index} ({target.kind}, {target.platform})",
             f"  {'storages live':44s} {stats['num_storages']}"]
    lines += [f"  {label:44s} {_format_bytes(stats[key])}" for key, label in _SUMMARY_ROWS]
    if not abbreviated:
        shown = {key for key, _ in _SUMMARY_ROWS} | {"num_storages"}
        rest = sorted(k for k in stats if k not in shown)
        if rest:
            lines.append("  device allocator (PjRT):")
        for key in rest:
            value = stats[key]
            lines.append(f"    {key:42s} {_format_bytes(value) if 'bytes' in key else value}")
    return "\n".join(lines) + "\n"


class _DeviceProperties(NamedTuple):
    name: str
    platform: str
    total_memory: int


def get_device_name(device: Any = None) -> str:
    """The device's kind as PjRT names it (e.g. "TPU v5 lite"; "cpu" on XLA:CPU)."""
    return _runtime_device(device).kind


def get_device_properties(device: Any = None) -> _DeviceProperties:
    target = _runtime_device(device)
    return _DeviceProperties(target.kind, target.platform, target.memory_stats().get("bytes_limit", 0))


def empty_cache() -> None:
    """Frees what no tensor uses: storages are freed when their last tensor goes, so
    this only drops the runtime's arrays nobody references (a garbage collection)."""
    import gc

    gc.collect()
