"""The records `first_call` publishes for collectives it does not compare
(`DistributedRuntime.publish`, docs/explanation/distributed.md): written in the background
under the keys a handshake reads, the group's last one under `last`, and deleted once
`RECORD_WINDOW` collectives old. A key-value store stands in for the coordination service."""

from __future__ import annotations

import threading

from torch_tpu.runtime import distributed
from torch_tpu.runtime.distributed import CollectiveRecord, DistributedRuntime


class _Store:
    """The three calls of jaxlib's distributed client the publisher makes."""

    def __init__(self) -> None:
        self.values: dict[str, str] = {}
        self.deleted: list[str] = []

    def key_value_set(self, key: str, value: str, allow_overwrite: bool) -> None:
        self.values[key] = value

    def key_value_delete(self, key: str) -> None:
        self.deleted.append(key)
        self.values.pop(key, None)

    def shutdown(self) -> None:
        pass


def _runtime(store: _Store) -> DistributedRuntime:
    runtime = object.__new__(DistributedRuntime)  # no job: only the publishing state
    runtime.rank, runtime._dclient, runtime._service = 1, store, None
    runtime._lock, runtime._closed = threading.Lock(), False
    runtime._published = runtime._publisher = None
    runtime._raised_divergence = {}
    return runtime


def test_published_records_are_readable_by_a_handshake_and_bounded(monkeypatch):
    monkeypatch.setattr(distributed, "RECORD_WINDOW", 3)
    store = _Store()
    runtime = _runtime(store)
    for sequence in range(1, 6):
        runtime.publish("g", CollectiveRecord(1, sequence, f"fp{sequence}", "all_reduce(4 x float32)", "a.py:7"))
    runtime.shutdown()  # flushes the queue before leaving
    prefix = "torch_tpu/hs/g/"
    kept = {k: CollectiveRecord.decode(1, v) for k, v in store.values.items() if not k.endswith("/last/1")}
    assert sorted(kept) == [f"{prefix}{s}/1" for s in (3, 4, 5)]
    assert kept[f"{prefix}4/1"].fingerprint == "fp4" and kept[f"{prefix}4/1"].line == "a.py:7"
    assert store.deleted == [f"{prefix}1/1", f"{prefix}2/1"]
    assert CollectiveRecord.decode(1, store.values[f"{prefix}last/1"]).sequence == 5


def test_nothing_is_published_after_shutdown():
    store = _Store()
    runtime = _runtime(store)
    runtime.shutdown()
    runtime.publish("g", CollectiveRecord(1, 1, "fp", "all_reduce", "a.py:1"))
    assert store.values == {}
