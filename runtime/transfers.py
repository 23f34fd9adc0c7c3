"""Host <-> device traffic and program launches of this process, counted where they
happen: at the runtime's one gateway to jaxlib (`_jaxlib`), so every path -- Client.to_device,
the executables' argument converters, DeviceBuffer reads, eager ops, compiled graphs --
is seen without anyone wrapping functions.

    from torch_tpu.runtime import transfer_stats, reset_transfer_stats
    reset_transfer_stats()
    ...                                   # the code to account for
    s = transfer_stats()                  # a frozen snapshot
    s.upload_bytes, s.programs_executed

What counts:

* an upload: one host array handed to the device (`batched_device_put`). On XLA:CPU a
  zero-copy upload aliases host memory and moves nothing: it is counted, and its bytes
  also go to `aliased_upload_bytes`, so `upload_bytes - aliased_upload_bytes` is what was
  copied.
* a download: the first host copy of a device array (TPU, GPU; jaxlib keeps that copy on
  the array, so reading it again moves nothing). XLA:CPU hands buffers to torch by DLPack
  without copying: those are `dlpack_exports`, not downloads.
* a program execution: one launch of a compiled executable (one per replica set for a
  replicated program).

The counters are plain integers bumped under the GIL (no lock on the hot path): exact for
one thread, and never lower than the truth by more than a racing increment otherwise.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class TransferStats:
    """A snapshot of the counters (see the module docstring for what each counts)."""

    uploads: int = 0
    upload_bytes: int = 0
    aliased_upload_bytes: int = 0
    downloads: int = 0
    download_bytes: int = 0
    dlpack_exports: int = 0
    programs_executed: int = 0

    def __sub__(self, earlier: TransferStats) -> TransferStats:
        """The traffic between two snapshots: `after - before`."""
        return TransferStats(**{name: getattr(self, name) - getattr(earlier, name)
                                for name in self.__dataclass_fields__})


class _Counters:
    __slots__ = ("uploads", "upload_bytes", "aliased_upload_bytes", "downloads", "download_bytes",
                 "dlpack_exports", "programs_executed", "_read")

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.uploads = self.upload_bytes = self.aliased_upload_bytes = 0
        self.downloads = self.download_bytes = self.dlpack_exports = self.programs_executed = 0
        # Arrays whose host copy was counted (jaxlib caches it on the array): weakly held.
        self._read: weakref.WeakSet = weakref.WeakSet()

    def snapshot(self) -> TransferStats:
        return TransferStats(self.uploads, self.upload_bytes, self.aliased_upload_bytes, self.downloads,
                             self.download_bytes, self.dlpack_exports, self.programs_executed)

    def download(self, array: Any, nbytes: int) -> None:
        try:
            if array in self._read:
                return
            self._read.add(array)
        except TypeError:  # an array that cannot be weakly referenced: count every read
            pass
        self.downloads += 1
        self.download_bytes += nbytes


COUNTERS = _Counters()


def transfer_stats() -> TransferStats:
    """The process's host <-> device transfers and program executions since the start (or
    the last `reset_transfer_stats`)."""
    return COUNTERS.snapshot()


def reset_transfer_stats() -> None:
    """Sets every counter back to zero."""
    COUNTERS.reset()
