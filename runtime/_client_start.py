"""Creating the multi-process client so that a rank whose client fails takes the others
down with a Python error, not jaxlib's abort.

Creating the client is collective: XLA:CPU (and a PjRT plugin) exchanges every process's
topology through the coordination service, so a rank whose creation fails leaves the
others blocked in C++ until its heartbeat is missed, when jaxlib terminates them (a C++
fatal error: no Python error, no cause). So each rank creates its client on a helper
thread while its calling thread watches the coordination service's key-value store:

* a rank whose creation fails (or that times out, or is interrupted) writes the cause as the
  job's outcome (`start/outcome`, written once: the first failure wins) before it leaves;
* every rank whose creation succeeded publishes `start/ready/<rank>` and waits until every
  rank is ready; the first to see them all writes "ok" as the outcome -- so the job starts
  only once all clients exist, and a later failure of a peer is still seen here;
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

OUTCOME_KEY = "start/outcome"  # "ok", or the first failure: written once, obeyed by every rank
READY_PREFIX = "start/ready/"
_POLL_S = 0.05  # how often a rank waiting for its client looks for a peer's failure
_OK = "ok"
_SEP = "\x1f"

# What a failing rank did (StartFailure.kind): its wording in the error every rank raises.
CREATE_FAILED = "failed"  # its client could not be created (or made the process's)
TIMED_OUT = "timeout"  # it waited past the timeout for a peer's client
INTERRUPTED = "interrupted"  # its start-up was interrupted (KeyboardInterrupt, SystemExit)


class StartFailure(Exception):
    """The job cannot start: `rank` (this one when `own`, else a peer) failed with `cause`
    (`kind`: CREATE_FAILED, TIMED_OUT or INTERRUPTED). `secondary`: this rank's own failure
    when it came after the peer's that decided the job (most likely its knock-on), else None."""

    def __init__(self, rank: int, cause: str, own: bool, kind: str = CREATE_FAILED,
                 secondary: str | None = None) -> None:
        super().__init__(cause)
        self.rank = rank
        self.cause = cause
        self.own = own
        self.kind = kind
        self.secondary = secondary


class StartTimeout(Exception):
    """Not every rank had its client within the timeout; `waiting_for` are the ranks not ready."""

    def __init__(self, waiting_for: list[int], own_done: bool) -> None:
        super().__init__(waiting_for)
        self.waiting_for = waiting_for
        self.own_done = own_done


class WatchedStart:
    """`create()` (this rank's part of the collective client creation) started on a helper
    thread; `result()` watches it and the store. `store` has the coordination client's
    key-value calls (`set(key, value)`, `set_once(key, value)` -- writes unless the key
    exists, returns the value the key holds -- `try_get(key)`, `wait(key, seconds)` -- a
    blocking get, None when it times out -- and `dir_get(prefix)`).

    The job's outcome is ONE key, written once (`set_once`): "ok" by a rank that saw every
    rank ready, or the first failure (a rank whose creation failed, that timed out, or that
    was interrupted). Every rank obeys what that key holds, never its own view: so no rank
    starts while another gives up, and a knock-on failure never hides the first cause."""

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

    def result(self, timeout_s: float, finish: Callable[[Any], Any] | None = None) -> Any:
        """The created client (or `finish(client)`, run on the calling thread before this rank
        declares itself ready, so that whatever fails there fails through this protocol as
        this rank's own failure) once every rank's creation succeeded. Raises `StartFailure`
        when this rank's or a peer's start failed (or a peer timed out), `StartTimeout` when
        this rank timed out first."""
        store, rank = self._store, self._rank
        deadline = time.monotonic() + timeout_s
        while not self._done.wait(_POLL_S):
            _raise_peer_failure(store.try_get(OUTCOME_KEY))
            if time.monotonic() >= deadline:
                waiting_for = _not_ready(store, rank, self._world_size)
                self._decide(_failure(rank, TIMED_OUT, describe_wait(timeout_s, waiting_for, own_done=False)))
                raise StartTimeout(waiting_for, own_done=False)
        try:
            if "error" in self._outcome:
                raise self._outcome["error"]
            value = self._outcome["client"] if finish is None else finish(self._outcome["client"])
        except Exception as err:  # noqa: BLE001 - this rank's own failure, whatever it is
            cause = _describe(err)
            self._decide(_failure(rank, CREATE_FAILED, cause), own_cause=cause)
            raise StartFailure(rank, cause, own=True) from None
        store.set(f"{READY_PREFIX}{rank}", "1")
        while True:
            outcome = store.try_get(OUTCOME_KEY)
            if outcome == _OK:
                return value
            _raise_peer_failure(outcome)
            waiting_for = _not_ready(store, rank, self._world_size)
            if not waiting_for:
                self._decide(_OK)
                return value
            if time.monotonic() >= deadline:
                if self._decide(_failure(rank, TIMED_OUT, describe_wait(timeout_s, waiting_for, True))) == _OK:
                    return value  # the last rank became ready, and a peer saw it, just in time
                raise StartTimeout(waiting_for, own_done=True)
            # Wakes as soon as that rank is ready: no polling delay on a successful start.
            store.wait(f"{READY_PREFIX}{waiting_for[0]}", _POLL_S)

    def abandon(self, err: BaseException) -> bool:
        """Declares this rank's start-up failed because of `err` (raised on the calling thread,
        e.g. KeyboardInterrupt) -- unless the outcome was already decided -- so the peers stop
        with an error naming this rank instead of waiting for it. Whether the job started
        anyway (every rank was ready and a peer wrote "ok" first): this rank is part of it."""
        detail = str(err).strip()
        cause = f"{type(err).__name__}: {detail}" if detail else type(err).__name__
        return self._store.set_once(OUTCOME_KEY, _failure(self._rank, INTERRUPTED, cause)) == _OK

    def _decide(self, proposal: str, own_cause: str | None = None) -> str:
        """Writes `proposal` as the job's outcome unless a rank did first; the outcome.
        Raises the peer's failure when a peer's failure decided it."""
        outcome = self._store.set_once(OUTCOME_KEY, proposal)
        if outcome != proposal:
            _raise_peer_failure(outcome, secondary=own_cause)
        return outcome

    def settle(self, timeout_s: float) -> bool:
        """Waits (up to `timeout_s`) for the helper thread to return -- once this rank has
        left the job its blocked C++ call fails. A daemon thread that comes back from C++
        while the interpreter exits is killed by a forced unwind that jaxlib's C++ frames
        swallow ("FATAL: exception not rethrown", an abort), so the thread must be done
        before the error reaches the user. Whether it is."""
        return self._done.wait(timeout_s)


def _failure(rank: int, kind: str, cause: str) -> str:
    return _SEP.join((str(rank), kind, cause))


def _raise_peer_failure(outcome: str | None, secondary: str | None = None) -> None:
    if outcome is not None and outcome != _OK:
        failed, kind, cause = outcome.split(_SEP, 2)
        raise StartFailure(int(failed), cause, own=False, kind=kind, secondary=secondary)


def describe_wait(timeout_s: float, waiting_for: list[int], own_done: bool) -> str:
    """What a rank that timed out waited for (the error's words after "rank r of n")."""
    waited = ([] if own_done else ["its own client"]) + (
        [f"the client of rank(s) {waiting_for}"] if waiting_for else [])
    return f"waited {timeout_s:g} s for {' and '.join(waited)}, which neither started nor reported a failure"


def _not_ready(store: Any, rank: int, world_size: int) -> list[int]:
    ready = {key.rsplit("/", 1)[-1] for key, _ in store.dir_get(READY_PREFIX)}
    return [r for r in range(world_size) if r != rank and str(r) not in ready]


def _describe(err: BaseException) -> str:
    text = str(err).strip()
    return text if text else type(err).__name__
