"""The one in-process program cache, in front of the runtime's compile cache.

A hit returns the compiled program without building its module, running its pipeline or
hashing its text: the eager device's graph-argument programs, jax_ops on CPU tensors and
`tpu_dist` collectives are looked up here on every use, so a hit is one dict lookup (no
lock, no reordering). Past `MAX_PROGRAMS` the oldest entry goes (the runtime's cache
still holds its executable, so an evicted program costs a lowering and a pipeline run,
never an XLA compile).
"""

from __future__ import annotations

import threading
from typing import Any

MAX_PROGRAMS = 4096


class ProgramCache:
    def __init__(self, max_entries: int = MAX_PROGRAMS) -> None:
        self._entries: dict[tuple, Any] = {}  # insertion order: the oldest first
        self._lock = threading.Lock()
        self.max_entries = max_entries
        self.hits = 0
        self.misses = 0

    def get(self, key: tuple) -> Any:
        program = self._entries.get(key)  # one dict read: atomic under the GIL
        if program is None:
            self.misses += 1
        else:
            self.hits += 1  # statistics: a lost increment between threads is harmless
        return program

    def put(self, key: tuple, program: Any) -> None:
        with self._lock:
            self._entries.pop(key, None)
            self._entries[key] = program
            while len(self._entries) > self.max_entries:
                del self._entries[next(iter(self._entries))]

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
