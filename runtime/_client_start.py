"""Creating the multi-process client so that a rank whose client fails takes the others
down with a Python error, not jaxlib's abort.

Creating the client is collective: XLA:CPU (and a PjRT plugin) exchanges every process's
topology through the coordination service, so a rank whose creation fails leaves the
others blocked in C++ until its heartbeat is missed, when jaxlib terminates them (a C++
fatal error: no Python error, no cause). So each rank creates its client on a helper
thread while its calling thread watches the coordination service's key-value store:

* a rank whose creation fails publishes the cause (`start/failed`) before it leaves;
* every rank whose creation succeeded publishes `start/ready/<rank>` and waits until every
  rank is ready -- so the job starts only once all clients exist, and a later failure of a
  peer is still seen here;
* a watching rank that reads a failure raises it, naming the rank and its cause.

On a failure every rank leaves through the service's shutdown barrier (nobody leaves
before all have read the cause: under torchrun, the first process to exit gets the others
killed), and rank 0 stops the service only after that, so no peer is left connected to a
stopped service (which jaxlib also answers with an abort). A helper thread still blocked in
C++ is a daemon: it does not keep the process alive.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

FAILED_KEY = "start/failed"
READY_PREFIX = "start/ready/"
_POLL_S = 0.05  # how often a rank waiting for its client looks for a peer's failure


class StartFailure(Exception):
    """The job cannot start: `rank`'s client failed with `cause` (this rank's, or a peer's)."""

    def __init__(self, rank: int, cause: str, own: bool) -> None:
        super().__init__(cause)
        self.rank = rank
        self.cause = cause
        self.own = own


class StartTimeout(Exception):
    """Not every rank had its client within the timeout; `waiting_for` are the ranks not ready."""

    def __init__(self, waiting_for: list[int], own_done: bool) -> None:
        super().__init__(waiting_for)
        self.waiting_for = waiting_for
        self.own_done = own_done


class WatchedStart:
    """`create()` (this rank's part of the collective client creation) started on a helper
    thread; `result()` watches it and the store. `store` has the coordination client's
    key-value calls (`set(key, value)`, `try_get(key)`, `wait(key, seconds)` -- a blocking
    get, None when it times out -- and `dir_get(prefix)`)."""

    def __init__(self, create: Callable[[], Any], store: Any, rank: int, world_size: int) -> None:
        self._store = store
        self._rank = rank
        self._world_size = world_size
        self._outcome: dict[str, Any] = {}
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(create,), daemon=True,
                                        name=f"torch_tpu-client-start-{rank}")
        self._thread.start()

    def _run(self, create: Callable[[], Any]) -> None:
        try:
            self._outcome["client"] = create()
        except BaseException as err:  # noqa: BLE001 - whatever it is, the peers must hear of it
            self._outcome["error"] = err
        finally:
            self._done.set()

    def result(self, timeout_s: float) -> Any:
        """The created client once every rank's creation succeeded. Raises `StartFailure`
        when this rank's or a peer's creation failed, `StartTimeout` when not every rank was
        ready within `timeout_s`."""
        store, rank = self._store, self._rank
        deadline = time.monotonic() + timeout_s
        while not self._done.wait(_POLL_S):
            _raise_peer_failure(store)
            if time.monotonic() >= deadline:
                raise StartTimeout(_not_ready(store, rank, self._world_size), own_done=False)
        if "error" in self._outcome:
            cause = _describe(self._outcome["error"])
            store.set(FAILED_KEY, f"{rank}\x1f{cause}")
            raise StartFailure(rank, cause, own=True)
        store.set(f"{READY_PREFIX}{rank}", "1")
        while True:
            _raise_peer_failure(store)
            waiting_for = _not_ready(store, rank, self._world_size)
            if not waiting_for:
                return self._outcome["client"]
            if time.monotonic() >= deadline:
                raise StartTimeout(waiting_for, own_done=True)
            # Wakes as soon as that rank is ready: no polling delay on a successful start.
            store.wait(f"{READY_PREFIX}{waiting_for[0]}", _POLL_S)

    def settle(self, timeout_s: float) -> bool:
        """Waits (up to `timeout_s`) for the helper thread to return -- once this rank has
        left the job its blocked C++ call fails. A daemon thread that comes back from C++
        while the interpreter exits is killed by a forced unwind that jaxlib's C++ frames
        swallow ("FATAL: exception not rethrown", an abort), so the thread must be done
        before the error reaches the user. Whether it is."""
        return self._done.wait(timeout_s)


def _raise_peer_failure(store: Any) -> None:
    text = store.try_get(FAILED_KEY)
    if text is not None:
        failed, cause = text.split("\x1f", 1)
        raise StartFailure(int(failed), cause, own=False)


def _not_ready(store: Any, rank: int, world_size: int) -> list[int]:
    ready = {key.rsplit("/", 1)[-1] for key, _ in store.dir_get(READY_PREFIX)}
    return [r for r in range(world_size) if r != rank and str(r) not in ready]


def _describe(err: BaseException) -> str:
    text = str(err).strip()
    return text if text else type(err).__name__
