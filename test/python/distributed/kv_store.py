"""jaxlib's DistributedRuntimeClient key-value calls over one dict: several ranks' runtimes,
as threads, share it as they would share the coordination service."""

from __future__ import annotations

import threading

from torch_tpu.runtime import _jaxlib
from torch_tpu.runtime.distributed import DistributedRuntime


class KeyValueStore:
    def __init__(self) -> None:
        self._values: dict[str, str] = {}
        self._changed = threading.Condition()

    def key_value_set(self, key: str, value: str, allow_overwrite: bool) -> None:
        with self._changed:
            if not allow_overwrite and key in self._values:
                raise _jaxlib.JaxRuntimeError(f"ALREADY_EXISTS: {key}")
            self._values[key] = value
            self._changed.notify_all()

    def blocking_key_value_get(self, key: str, timeout_ms: int) -> str:
        with self._changed:
            if not self._changed.wait_for(lambda: key in self._values, timeout_ms / 1000):
                raise _jaxlib.JaxRuntimeError(f"DEADLINE_EXCEEDED: {key}")
            return self._values[key]

    def key_value_try_get(self, key: str) -> str:
        with self._changed:
            if key not in self._values:
                raise _jaxlib.JaxRuntimeError(f"NOT_FOUND: {key}")
            return self._values[key]

    def key_value_dir_get(self, prefix: str) -> list[tuple[str, str]]:
        with self._changed:
            return [(k, v) for k, v in self._values.items() if k.startswith(prefix)]

    def key_value_increment(self, key: str, increment: int) -> int:
        with self._changed:
            value = int(self._values.get(key, "0")) + increment
            self._values[key] = str(value)
            self._changed.notify_all()
            return value

    def keys(self) -> list[str]:
        with self._changed:
            return list(self._values)


def thread_runtimes(n: int, store: KeyValueStore | None = None) -> list[DistributedRuntime]:
    """n ranks' runtimes on one store, without a client (the handshake, findings and group
    names are exercised; nothing is compiled): the fields `DistributedRuntime.__init__` sets
    that those read."""
    store = store or KeyValueStore()
    runtimes = []
    for rank in range(n):
        runtime = DistributedRuntime.__new__(DistributedRuntime)
        runtime.rank, runtime.world_size, runtime.address, runtime.timeout_s = rank, n, "memory", 5.0
        runtime._dclient = store
        runtime._raised_divergence = {}
        runtime._latest = {}
        runtime._incarnations = {}
        runtime.world_incarnation = 1
        runtime._lock = threading.Lock()
        runtimes.append(runtime)
    return runtimes
