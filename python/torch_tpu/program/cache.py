"""The one in-process program cache, in front of the runtime's compile cache.

A hit returns the compiled program without building its module, running its pipeline or
hashing its text: the eager device's graph-argument programs, jax_ops on CPU tensors and
`tpu_dist` collectives are looked up here on every use. Entries are kept in use order and
the oldest goes past `MAX_PROGRAMS` (the runtime's cache still holds its executable, so
an evicted program costs a lowering and a pipeline run, never an XLA compile).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

MAX_PROGRAMS = 4096


class ProgramCache:
    def __init__(self, max_entries: int = MAX_PROGRAMS) -> None:
        self._entries: OrderedDict[tuple, Any] = OrderedDict()
        self._lock = threading.Lock()
        self.max_entries = max_entries
        self.hits = 0
        self.misses = 0

    def get(self, key: tuple) -> Any:
        with self._lock:
            program = self._entries.get(key)
            if program is None:
                self.misses += 1
                return None
            self._entries.move_to_end(key)
            self.hits += 1
            return program

    def put(self, key: tuple, program: Any) -> None:
        with self._lock:
            self._entries[key] = program
            self._entries.move_to_end(key)
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)

    def forget(self, key: tuple, program: Any) -> None:
        """Drops `key` if it still holds `program` (a compile that failed in the background)."""
        with self._lock:
            if self._entries.get(key) is program:
                del self._entries[key]

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self.hits = self.misses = 0

    def __len__(self) -> int:
        return len(self._entries)


PROGRAMS = ProgramCache()
