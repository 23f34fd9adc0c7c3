"""Several processes, one device each: PjRT's distributed runtime.

`initialize(rank, world_size, address)` connects this process to the others: process 0
serves jaxlib's coordination service at `address`, every process connects to it, and the
process-wide client (`get_client()`) becomes a multi-process one whose only addressable
device is this process's own (`devices[0]`, so the eager device's `tpu:0`), while every
process's device has a global id the programs can name. On XLA:CPU the collectives go
over gloo/TCP; on TPU/GPU the same programs use the interconnect.

A collective program is compiled for the processes of a group (`compile_group_program`):
N replicas, replica i on the device of the group's i-th process, and run by each of them
with its own buffer. The coordination service's key-value store carries the handshake
that checks every process is about to run the same program (`handshake`).

torch-free, like the rest of the runtime: `torch_tpu.distributed` is the PyTorch side.
"""

from __future__ import annotations

import atexit
import hashlib
import logging
import os
import socket
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from torch_tpu.core import host_heap

from . import _client_start, _jaxlib
from .buffer import DeviceBuffer
from .client import Client, install_client, make_multiprocess_raw_client, require_no_client, uninstall_client
from .errors import CompileError, PlatformError, TorchTPURuntimeError, classify_jaxlib_error
from .executable import Signature

log = logging.getLogger("torch_tpu.runtime.distributed")

_KV_PREFIX = "torch_tpu/"


class DistributedError(TorchTPURuntimeError):
    """A failure of the multi-process runtime: connection, a peer that died, a divergence."""


class CollectiveRecord(NamedTuple):
    """What one process published before running a collective program: the program's
    `fingerprint` (its text and description), the user's `call` (the torch.distributed
    operation and its tensors' shapes: "all_reduce of [2, 3]"; "" for a compiled graph's
    stage), and `site`, the call site the ranks must share ("train.py:40": a file's
    base name, as paths differ between hosts; "" where the ranks may call from different
    lines -- a rooted collective's root and non-roots, a send and its receive). Ranks pair
    when all three are equal; `line` is where to look (the full path). A NamedTuple: one
    is made per collective call (a frozen dataclass cost 3 us more)."""

    rank: int
    sequence: int
    fingerprint: str
    description: str
    line: str
    call: str = ""
    site: str = ""

    def encode(self) -> str:
        return "\x1f".join((str(self.sequence), self.fingerprint, self.description, self.line, self.call, self.site))

    @classmethod
    def decode(cls, rank: int, text: str) -> CollectiveRecord:
        sequence, fingerprint, description, line, *rest = text.split("\x1f", 5)
        call, site = (rest + ["", ""])[:2]
        return cls(rank, int(sequence), fingerprint, description, line, call, site)

    @property
    def identity(self) -> tuple[str, str, str]:
        """What the ranks compare (`handshake`)."""
        return (self.fingerprint, self.call, self.site)

    def where(self) -> str:
        """"all_reduce(4 x float32, ...) over ranks [0, 1] at /job/train.py:40 (called as all_reduce of [4])"."""
        call = f" (called as {self.call})" if self.call else ""
        return f"{self.description} at {self.line}{call}"


@dataclass(frozen=True)
class _Finding:
    """A failed handshake's finding, stored once per group (`hs/<group>/diverged`): the
    collective number, the group's members (only they raise it) and the message."""

    sequence: int
    ranks: tuple[int, ...]
    message: str

    def encode(self) -> str:
        return "\x1f".join((str(self.sequence), ",".join(map(str, self.ranks)), self.message))

    @classmethod
    def decode(cls, text: str) -> _Finding:
        sequence, ranks, message = text.split("\x1f", 2)
        return cls(int(sequence), tuple(int(r) for r in ranks.split(",") if r), message)


class GroupProgram:
    """A compiled program of one group of processes; `run` takes this process's buffers."""

    def __init__(self, runtime: DistributedRuntime, raw: Any, name: str) -> None:
        self.name = name
        self._runtime = runtime
        signature = Signature.of(raw)
        self.signature = signature
        device = runtime.client.devices[0]
        self._device = device
        self._rows = [r.element_type for r in signature.results]
        self._shapes = [r.shape for r in signature.results]
        self._raw = raw
        # What the handshake compares and errors show (`label`): the same on every rank
        # that runs the same collective.
        self.description = ""
        self.fingerprint = ""

    def label(self, description: str, fingerprint: str) -> "GroupProgram":
        """Sets what the handshake compares (once: a program is cached per text and ranks,
        so a later compile of the same text finds it labelled)."""
        if not self.fingerprint:
            self.description, self.fingerprint = description, fingerprint
        return self

    def run(self, buffers: Sequence[DeviceBuffer], group: str, record: CollectiveRecord | None = None,
            ranks: Sequence[int] = ()) -> list[DeviceBuffer]:
        """Enqueues the program (asynchronous) as a collective of `group` (the handshake's
        name of the process group running it: one program, cached per ranks, can serve
        several groups) over `ranks`; the outputs' `synchronize()` waits and raises the
        program's error. `record`: what this rank is running (its collective number and
        source line), kept as the group's latest collective -- what this rank's peers are
        told when it leaves the job -- and named in the error when the program fails."""
        if record is not None:
            self._runtime.note_run(group, record)
        try:
            # Taken apart into single-device arrays (this process's replica): wrapped by
            # result handlers instead (~8 us cheaper), they would keep the program's
            # N-device placement, and PjRT refuses to copy such an array onto one device
            # (`DeviceBuffer.copy()`, which an in-place op on a still-held buffer needs:
            # "CopyArrays only supports destination device list of the same size").
            outs = [replicas[0] for replicas in _jaxlib.execute_replicated(self._raw, [b._array for b in buffers])]
        except _jaxlib.JaxRuntimeError as err:
            if record is None:
                self._runtime.raise_reported_divergence(group, getattr(self, "description", self.name))
                raise classify_jaxlib_error(err, f"running {self.name}", "see the error above") from None
            raise self._runtime.collective_failed(group, ranks, record, err) from None
        return [DeviceBuffer(o, self._shapes[k], self._rows[k], self._device) for k, o in enumerate(outs)]


class DistributedRuntime:
    """This process's place in a multi-process job (see the module docstring)."""

    record_type = CollectiveRecord  # what callers make a record with, without an import per call

    def __init__(self, rank: int, world_size: int, address: str, timeout_s: float,
                 service: Any, dclient: Any, client: Client) -> None:
        self.rank = rank
        self.world_size = world_size
        self.address = address
        self.timeout_s = timeout_s
        self.client = client
        self._service = service
        self._dclient = dclient
        by_process = {}
        for raw, device_id, process in _jaxlib.global_devices(client._raw):
            by_process.setdefault(process, (raw, device_id))
        missing = [r for r in range(world_size) if r not in by_process]
        if missing:
            raise DistributedError(f"the distributed runtime sees no device of process(es) {missing}")
        self._device_of_rank = [by_process[r] for r in range(world_size)]
        self._programs: dict[tuple[str, tuple[int, ...]], GroupProgram] = {}
        self._lock = threading.Lock()
        self._closed = False
        # Per group, the collective number of the last divergence this process raised:
        # an older finding is one it has reported already.
        self._raised_divergence: dict[str, int] = {}
        # Per (group name, ranks), how many groups of that name and ranks this process made.
        self._incarnations: dict[tuple[str, tuple[int, ...]], int] = {}
        self.world_incarnation = 1  # which making of PyTorch's world group is current
        # Per group, the last collective this process ran (`note_run`): published when it
        # leaves the job, so a peer still waiting in a collective learns where it stopped.
        self._latest: dict[str, CollectiveRecord] = {}

    def __repr__(self) -> str:
        return f"DistributedRuntime(rank {self.rank} of {self.world_size}, {self.address}, {self.client})"

    def device_id(self, rank: int) -> int:
        """The global device id of process `rank`'s device (not `rank`: PjRT numbers them)."""
        return self._device_of_rank[rank][1]

    # -- programs ----------------------------------------------------------------------------

    def compile_group_program(self, text: str, ranks: Sequence[int], name: str) -> GroupProgram:
        """`text` (StableHLO, replica groups over 0..len(ranks)-1) compiled as len(ranks)
        replicas, replica i on process ranks[i]'s device. Cached per (text, ranks)."""
        ranks = tuple(int(r) for r in ranks)
        if self.rank not in ranks:
            raise DistributedError(f"{name}: process {self.rank} is not in the group {list(ranks)}")
        key = (text, ranks)
        program = self._programs.get(key)
        if program is not None:
            return program
        devices = [self._device_of_rank[r][0] for r in ranks]
        options = _jaxlib.compile_options(len(ranks), [self._device_of_rank[r][1] for r in ranks], ())
        try:
            raw = _jaxlib.compile_and_load(self.client._raw, text, devices, options)
        except _jaxlib.JaxRuntimeError as err:
            raise CompileError(f"{name}: XLA cannot compile the collective program: {err}") from None
        program = GroupProgram(self, raw, name)
        with self._lock:
            self._programs.setdefault(key, program)
        return program

    # -- key-value store ----------------------------------------------------------------------

    # Every call to the coordination service goes through these: a failure (the service
    # is gone with rank 0, the network failed) is a DistributedError naming what this rank
    # was doing, never jaxlib's raw gRPC error.

    def _lost_service(self, doing: str, err: BaseException) -> DistributedError:
        return DistributedError(
            f"tpu_dist: rank {self.rank} lost the coordination service (served by rank 0 at "
            f"{self.address}) while {doing}: {_first_line(err)}. Rank 0 has probably exited or died "
            "(its script ended, raised, or was killed); see its log"
        )

    def kv_set(self, key: str, value: str) -> None:
        try:
            self._dclient.key_value_set(_KV_PREFIX + key, value, True)
        except _jaxlib.JaxRuntimeError as err:
            raise self._lost_service(f"publishing {key!r}", err) from None

    def kv_get(self, key: str, timeout_s: float) -> str | None:
        """The value of `key`, waiting up to `timeout_s` for it to be set; None on timeout."""
        try:
            return self._dclient.blocking_key_value_get(_KV_PREFIX + key, max(1, int(timeout_s * 1000)))
        except _jaxlib.JaxRuntimeError as err:
            if _is_timeout(err):
                return None
            raise self._lost_service(f"waiting for {key!r}", err) from None

    def kv_try_get(self, key: str) -> str | None:
        """The value of `key`, None when it is not set."""
        try:
            return self._dclient.key_value_try_get(_KV_PREFIX + key)
        except _jaxlib.JaxRuntimeError as err:
            if "NOT_FOUND" in str(err):
                return None
            raise self._lost_service(f"reading {key!r}", err) from None

    def kv_increment(self, key: str) -> int:
        try:
            return int(self._dclient.key_value_increment(_KV_PREFIX + key, 1))
        except _jaxlib.JaxRuntimeError as err:
            raise self._lost_service(f"counting {key!r}", err) from None

    # -- handshake -----------------------------------------------------------------------------

    def incarnation_name(self, name: str, ranks: Sequence[int], timeout_s: float) -> str:
        """The name a new process group `name` over `ranks` runs its handshakes under:
        `name` for the job's first group of that name, `name#<n>` for the n-th. A group
        destroyed and made again under its name (a second init_process_group after
        destroy_process_group, which restarts PyTorch's group names at 0) would otherwise
        meet the old group's records, findings and sequence numbers in the store: a peer's
        stale record of collective #1 compared with this group's #1.

        n is agreed through the store: the group's first rank takes the next number of the
        name (a counter in the store, so a group of the same name over other ranks gets
        another one) and publishes it for this (name, ranks)'s k-th making; the other
        members, which make the group together with it (PyTorch makes groups collectively),
        are at their k-th making too and read it, waiting at most `timeout_s`."""
        ranks = tuple(int(r) for r in ranks)
        with self._lock:
            making = self._incarnations[(name, ranks)] = self._incarnations.get((name, ranks), 0) + 1
        members = hashlib.sha256(",".join(map(str, ranks)).encode()).hexdigest()[:16]
        key = f"hs/incarnation/{name}/{members}/{making}"
        if self.rank == ranks[0]:
            number = self.kv_increment(f"hs/incarnations/{name}")
            self.kv_set(key, str(number))
        else:
            text = self.kv_get(key, timeout_s)
            if text is None:
                raise DistributedError(
                    f"tpu_dist: rank {self.rank} made process group {name} over ranks {list(ranks)}, but its "
                    f"first rank {ranks[0]} did not make it within {timeout_s:g} s. Every member must create "
                    "the group (init_process_group / new_group) in the same order"
                )
            number = int(text)
        if name == "0" and ranks == tuple(range(self.world_size)):
            # PyTorch's world group (named "0" again at each init_process_group after a
            # destroy_process_group): point-to-point channels, shared by every group of the
            # job, are named after its incarnation, so a re-initialised job's p2p handshakes
            # never meet the old job's records.
            self.world_incarnation = number
        return incarnation(name, number)

    def handshake(self, group: str, ranks: Sequence[int], record: CollectiveRecord, timeout_s: float) -> None:
        """Publishes this process's `record` for the group's collective number
        `record.sequence` and compares it with every other member's. Raises
        `DistributedError` naming the ranks, the first differing collective and each rank's
        source line when they differ (also when another member found the group diverged at
        an earlier collective while this one waited), or when a member has not published
        within `timeout_s` (it died, or it is running something else)."""
        self.kv_set(f"hs/{group}/{record.sequence}/{record.rank}", record.encode())
        self.kv_set(f"hs/{group}/last/{record.rank}", record.encode())
        deadline = time.monotonic() + timeout_s
        records = {record.rank: record}
        missing = []
        for rank in ranks:
            if rank == record.rank:
                continue
            text = self._await_record(group, ranks, record, rank, deadline)
            if text is None:
                missing.append(rank)
            else:
                records[rank] = CollectiveRecord.decode(rank, text)
        if missing:
            message = self._missing_message(group, ranks, record, missing, timeout_s)
            self._report(group, ranks, record.sequence, message)
            raise DistributedError(message)
        if len({r.identity for r in records.values()}) > 1:
            message = _mismatch_message(group, record.sequence, [records[r] for r in ranks])
            self._report(group, ranks, record.sequence, message)
            self._leave_together(group, ranks, record.rank, record.sequence, timeout_s)
            raise DistributedError(message)

    def _report(self, group: str, ranks: Sequence[int], sequence: int, message: str) -> None:
        """Leaves the finding where the other members look, under one key per group,
        `hs/<group>/diverged`, with the group's members: members waiting in a handshake of
        the group read it instead of waiting out their timeout; a member whose collective
        program fails -- it had no partner: the finding rank skipped it, and left -- raises
        it too (`raise_reported_divergence`). Only the group's members take it: a failure of
        a process outside the group, or of another group's program, is never explained by
        this finding, and a rank that diverged in two groups keeps both findings."""
        self._raised_divergence[group] = sequence
        try:
            self.kv_set(f"hs/{group}/diverged", _Finding(sequence, tuple(ranks), message).encode())
        except Exception as err:  # noqa: BLE001 - the service left with rank 0: raise the finding anyway
            log.info("tpu_dist: could not report collective #%d of group %s: %s", sequence, group, err)

    def _finding(self, group: str) -> _Finding | None:
        text = self.kv_try_get(f"hs/{group}/diverged")
        return None if text is None else _Finding.decode(text)

    def _await_record(self, group: str, ranks: Sequence[int], mine: CollectiveRecord, rank: int,
                      deadline: float) -> str | None:
        """Member `rank`'s record of collective `mine.sequence` by `deadline`, None if it
        never came (or the member left the job without it: `shutdown`). Raises what a member found at an earlier collective of the group (one
        this process ran unchecked) when it is reported meanwhile."""
        key = f"hs/{group}/{mine.sequence}/{rank}"
        while True:
            left = deadline - time.monotonic()
            text = self.kv_get(key, max(0.001, min(left, 0.5)))
            if text is not None:
                return text
            if self.kv_try_get(f"hs/left/{rank}") is not None:
                return None  # it left the job without reaching this collective: no use waiting
            finding = self._finding(group)
            if finding is not None and self._raised_divergence.get(group, 0) < finding.sequence < mine.sequence:
                self._raised_divergence[group] = finding.sequence
                self._leave_together(group, ranks, mine.rank, finding.sequence, left)
                raise DistributedError(finding.message)
            if time.monotonic() >= deadline:
                return None

    def raise_reported_divergence(self, group: str, running: str = "") -> None:
        """Raises the divergence a member's failed handshake of `group` reported
        (`hs/<group>/diverged`, see `_report`) when this process is one of the group's
        members, unless it has raised that finding -- or a later one of the same group --
        already. Called when a collective program fails: a collective whose peer skipped it
        has no partner, and fails only when the rank that found the problem leaves the job
        (its connections close); its error is then that finding, with what this rank was
        running (`running`), not the transport's.

        A finding's lifetime: it is raised at most once per process (per group, collective
        numbers only grow), and only on the members of the group it was found in, so a
        later failure -- another group's, or this group's after the user caught the
        error -- is reported as itself, never as an old divergence."""
        finding = self._finding(group)
        if finding is None or self.rank not in finding.ranks:
            return
        if finding.sequence > self._raised_divergence.get(group, 0):
            self._raised_divergence[group] = finding.sequence
            self.kv_set(f"hs/{group}/{finding.sequence}/seen/{self.rank}", "1")
            message = finding.message
            if running:
                message += f"\nRank {self.rank} was running {running}, which found no partner."
            raise DistributedError(message)

    def note_run(self, group: str, record: CollectiveRecord) -> None:
        self._latest[group] = record

    def collective_failed(self, group: str, ranks: Sequence[int], record: CollectiveRecord,
                          err: BaseException) -> Exception:
        """The error of this rank's collective `record` of `group` whose program failed
        (`err`, jaxlib's): the finding a member reported, when there is one; else, for a
        failure of the collective's transport -- no peer ran the collective within the
        collective timeout, or a peer's connection closed -- a DistributedError naming the
        collective, the group, its source line and where each peer is (it left the job
        after collective #n; its last checked collective); any other failure as itself."""
        try:
            self.raise_reported_divergence(group, record.where())
        except DistributedError as reported:
            return reported
        text = str(err)
        low = text.lower()
        if not any(word in low for word in ("gloo", "timed out", "connection", "deadline", "peer")):
            return classify_jaxlib_error(err, f"running collective #{record.sequence} of group "
                                         f"{group_label(group)} ({record.where()})", "see the error above")
        if "timed out" in low or "deadline" in low:
            reason = (f"no peer ran it with this rank within the collective timeout ({self.timeout_s:g} s, "
                      "init_process_group's timeout)")
        else:
            reason = "a peer's connection closed while this rank waited in it (the peer left the job or died)"
        lines = [f"tpu_dist: collective #{record.sequence} of group {group_label(group)} ({record.where()}) "
                 f"failed on rank {self.rank}: {reason}."]
        try:
            lines.extend(f"  rank {peer}: {self._peer_state(group, peer)}" for peer in ranks if peer != self.rank)
        except DistributedError as lost:
            lines.append(f"  (where the peers are is unknown: {lost})")
        lines.append(f"The transport said: {_first_line(err)}")
        lines.append(
            "Every rank must run the same collectives in the same order: a collective that only some ranks "
            "run (a rank-dependent branch) leaves the others waiting, or pairs with another call. "
            "TORCH_TPU_SPMD_HANDSHAKE_STAGE=every_call checks every call and names the first that differs."
        )
        return DistributedError("\n".join(lines))

    def _peer_state(self, group: str, rank: int) -> str:
        """Where member `rank` of `group` is, as far as the store knows: the collective
        after which it left the job, else its last checked collective."""
        left = self.kv_try_get(f"hs/left/{rank}")
        if left is not None:
            latest = _decode_latest(rank, left).get(group)
            if latest is None:
                return "it left the job (its script ended or raised) before any collective of this group"
            return (f"it left the job (its script ended or raised) after collective #{latest.sequence} of this "
                    f"group ({latest.where()})")
        last = self.kv_try_get(f"hs/{group}/last/{rank}")
        if last is None:
            return "still in the job; no collective of this group checked yet"
        rec = CollectiveRecord.decode(rank, last)
        return f"still in the job; its last checked collective was #{rec.sequence} ({rec.where()})"

    def _leave_together(self, group: str, ranks: Sequence[int], me: int, sequence: int, timeout_s: float) -> None:
        """Every member sees the mismatch; wait (briefly) until all have read it, so a
        member that raises and exits -- process 0 takes the service with it -- cannot leave
        another without its error message."""
        seen = f"hs/{group}/{sequence}/seen"
        self.kv_set(f"{seen}/{me}", "1")
        wait_until = time.monotonic() + min(max(timeout_s, 0.001), 5.0)
        for rank in ranks:
            if rank != me:
                try:
                    self.kv_get(f"{seen}/{rank}", max(0.001, wait_until - time.monotonic()))
                except DistributedError:
                    break  # process 0 already left: this rank has every record it needs

    def _missing_message(self, group: str, ranks: Sequence[int], mine: CollectiveRecord,
                         missing: list[int], timeout_s: float) -> str:
        gone = [rank for rank in missing if self.kv_try_get(f"hs/left/{rank}") is not None]
        late = [rank for rank in missing if rank not in gone]
        why = []
        if late:
            why.append(f"rank(s) {late} did not reach it within {timeout_s:g} s (the process died, or it runs "
                       "other collectives)")
        if gone:
            why.append(f"rank(s) {gone} left the job without reaching it")
        lines = [f"tpu_dist: collective #{mine.sequence} of group {group_label(group)} ({mine.where()}) "
                 f"on rank {mine.rank}: {'; '.join(why)}."]
        for rank in missing:
            lines.append(f"  rank {rank}: {self._peer_state(group, rank)}")
        lines.append(
            "Every rank must run the same collectives in the same order; a rank that died or is "
            "stuck elsewhere makes the others stop here instead of hanging."
        )
        return "\n".join(lines)

    # -- shutdown ------------------------------------------------------------------------------

    def shutdown(self) -> None:
        """Leaves the job, as a start-up that failed does (`_leave_unstarted`): says where
        this rank stopped (`hs/left/<rank>`), meets the other processes at an exit barrier
        -- bounded by the collective timeout plus a margin, so a peer still waiting in a
        collective gets its Python error and reaches the barrier before process 0 stops the
        service (a process left connected to a stopped service is aborted by jaxlib) --,
        leaves the service, then process 0 stops it."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        try:
            # Where this rank stopped, for a peer still waiting in a collective this rank
            # never ran: its collective fails (the collective timeout, or this process's
            # connections closing) and names this rank's last collective of the group.
            self.kv_set(f"hs/left/{self.rank}", _encode_latest(dict(self._latest)))
        except DistributedError as err:
            log.info("tpu_dist: could not say that rank %d leaves: %s", self.rank, err)
        try:
            # jaxlib's own shutdown does not wait for the others: without this barrier process
            # 0 would stop the service under a peer still running (which jaxlib aborts).
            self._dclient.wait_at_barrier(_KV_PREFIX + "exit", int((self.timeout_s + _SHUTDOWN_MARGIN_S) * 1000))
        except Exception as err:  # noqa: BLE001 - a peer that died, or one still busy past the timeout
            log.warning("tpu_dist: rank %d leaves without every other rank: %s", self.rank, _first_line(err))
        try:
            self._dclient.shutdown()
        except Exception as err:  # noqa: BLE001 - peers that died make the barrier fail
            log.info("tpu_dist: distributed client shutdown: %s", err)
        if self._service is not None:
            try:
                self._service.shutdown()
            except Exception as err:  # noqa: BLE001
                log.info("tpu_dist: coordination service shutdown: %s", err)


def incarnation(name: str, number: int) -> str:
    """The handshake name of the `number`-th making of a group or channel called `name`:
    the name itself the first time, "name#n" after (`group_label` reads it back)."""
    return name if number == 1 else f"{name}#{number}"


def group_label(handshake_name: str) -> str:
    """A group's handshake name (`DistributedRuntime.incarnation_name`: "0#2") as errors show
    it: PyTorch's group name, and which making of it only when it is not the first ("0
    (incarnation 2)") -- the "#" suffix is internal."""
    name, _, number = handshake_name.rpartition("#")
    return f"{name} (incarnation {number})" if name and number.isdigit() else handshake_name


_LATEST_SEP = "\x1e"
_GROUP_SEP = "\x1d"


def _encode_latest(latest: dict[str, CollectiveRecord]) -> str:
    """A leaving rank's last collective of each group (`hs/left/<rank>`)."""
    return _LATEST_SEP.join(f"{group}{_GROUP_SEP}{record.encode()}" for group, record in latest.items())


def _decode_latest(rank: int, text: str) -> dict[str, CollectiveRecord]:
    latest = {}
    for item in filter(None, text.split(_LATEST_SEP)):
        group, _, record = item.partition(_GROUP_SEP)
        latest[group] = CollectiveRecord.decode(rank, record)
    return latest


def _is_timeout(err: BaseException) -> bool:
    return "DEADLINE_EXCEEDED" in str(err) or "timed out" in str(err).lower()


def _first_line(err: BaseException) -> str:
    return str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__


def _mismatch_message(group: str, sequence: int, records: list[CollectiveRecord]) -> str:
    lines = [f"tpu_dist: the ranks of group {group_label(group)} diverged at collective #{sequence}:"]
    for rec in records:
        lines.append(f"  rank {rec.rank}: {rec.where()}")
    differ = [what for what, values in (
        ("the collective (kind, element count, dtype, reduce op, root, group)", {r.fingerprint for r in records}),
        ("the torch.distributed call (operation, tensors' shapes)", {r.call for r in records}),
        ("the call site", {r.site for r in records}),
    ) if len(values) > 1]
    lines.append(f"They differ in {' and '.join(differ)}: run, these would pair different collectives "
                 "(a wrong result, or a rank left waiting).")
    lines.append(
        "Every rank must run the same collectives (same kind, shapes, dtypes, group) from the same line "
        "in the same order; fix the rank-dependent branch at the lines above (a collective only some "
        "ranks run, or one the ranks reach from different lines: call it from one line on every rank)."
    )
    return "\n".join(lines)


def fingerprint_of(text: str, description: str) -> str:
    return hashlib.sha256((description + "\n" + text).encode()).hexdigest()[:16]


def _port_in_use(address: str) -> str | None:
    """Why `address` cannot be listened on, or None. Checked before jaxlib tries: its
    failed server start sometimes crashes the process (SIGSEGV) instead of raising."""
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    try:
        infos = socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM)
    except (OSError, ValueError) as err:
        return f"cannot resolve it ({err})"
    family, kind, proto, _, sockaddr = infos[0]
    with socket.socket(family, kind, proto) as probe:
        # As gRPC binds: a port in TIME_WAIT (a job that just ended) is free; a listener is not.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(sockaddr)
        except OSError as err:
            return f"the port is in use ({err.strerror})"
    return None


def local_address(address: str) -> str:
    """The address the other processes reach this one at (gloo's listening host on
    XLA:CPU): the local end of the route to the coordinator at `address` -- loopback when
    it runs on this machine, this host's interface towards it on another (a fixed
    127.0.0.1 would send every other host to itself)."""
    host, _, port = address.rpartition(":")
    try:
        family, kind, proto, _, sockaddr = socket.getaddrinfo(host.strip("[]"), int(port), type=socket.SOCK_DGRAM)[0]
        with socket.socket(family, kind, proto) as probe:
            probe.connect(sockaddr)  # UDP: sends nothing, only picks the route
            return probe.getsockname()[0]
    except (OSError, ValueError):
        return "127.0.0.1"  # no route: joining the coordinator reports the real problem


class _StartStore:
    """The coordination service's key-value store as `_client_start` uses it."""

    def __init__(self, dclient: Any) -> None:
        self._dclient = dclient

    def set(self, key: str, value: str) -> None:
        try:
            self._dclient.key_value_set(_KV_PREFIX + key, value, True)
        except _jaxlib.JaxRuntimeError as err:  # the service is gone: this rank's own error still counts
            log.info("tpu_dist: could not publish %s: %s", key, err)

    def set_once(self, key: str, value: str) -> str:
        """Writes `value` unless `key` holds one already; the value `key` holds after."""
        try:
            self._dclient.key_value_set(_KV_PREFIX + key, value, False)
            return value
        except _jaxlib.JaxRuntimeError as err:
            held = self.try_get(key)
            if held is None:  # not written, and not readable: the service is gone
                log.info("tpu_dist: could not publish %s: %s", key, err)
                return value
            return held

    def try_get(self, key: str) -> str | None:
        try:
            return self._dclient.key_value_try_get(_KV_PREFIX + key)
        except _jaxlib.JaxRuntimeError:
            return None  # not set yet (or the service is gone: the start times out)

    def wait(self, key: str, timeout_s: float) -> str | None:
        try:
            return self._dclient.blocking_key_value_get(_KV_PREFIX + key, max(1, int(timeout_s * 1000)))
        except _jaxlib.JaxRuntimeError:
            return None  # not set within timeout_s (or the service is gone: the start times out)

    def dir_get(self, prefix: str) -> list[tuple[str, str]]:
        try:
            return list(self._dclient.key_value_dir_get(_KV_PREFIX + prefix))
        except _jaxlib.JaxRuntimeError:
            return []


def _leave_unstarted(dclient: Any, service: Any, timeout_s: int) -> None:
    """Leaves a job that could not start, the way that aborts no one: every rank meets the
    others at a barrier (so every rank has read the cause before any exits: under
    torchrun, the first process to exit gets the others killed), then leaves the service
    (its shutdown barrier), then rank 0 stops the service -- no peer is connected to it any
    more (a peer left connected to a stopped service is aborted by jaxlib)."""
    try:
        dclient.wait_at_barrier(_KV_PREFIX + "start/abandoned", timeout_s * 1000)
    except Exception as err:  # noqa: BLE001 - a rank stuck in C++ never reaches the barrier
        log.info("tpu_dist: leaving the job that could not start: %s", err)
    try:
        dclient.shutdown()
    except Exception as err:  # noqa: BLE001
        log.info("tpu_dist: leaving the job that could not start: %s", err)
    if service is not None:
        try:
            service.shutdown()
        except Exception as err:  # noqa: BLE001
            log.info("tpu_dist: coordination service shutdown: %s", err)


def _start_error(failure: Exception, rank: int, world_size: int, timeout_s: int) -> Exception:
    """The error a rank raises when the job's clients could not all be created."""
    if isinstance(failure, _client_start.StartTimeout):
        return DistributedError(
            f"tpu_dist: rank {rank} of {world_size} "
            f"{_client_start.describe_wait(timeout_s, failure.waiting_for, failure.own_done)} (stuck in the PjRT "
            "plugin's start, or the process died: see its log). If the platform starts slowly, raise "
            "init_process_group's timeout"
        )
    if failure.own:
        return PlatformError(
            f"tpu_dist: rank {rank} of {world_size} could not create its client: {failure.cause}. The "
            "other ranks stop with an error naming this rank; fix the cause and relaunch"
        )
    if failure.kind == _client_start.TIMED_OUT:
        what, fix = (f"{failure.cause} (stuck in the PjRT plugin's start, or the process died: see its "
                     "log)", "If the platform starts slowly, raise init_process_group's timeout")
    elif failure.kind == _client_start.INTERRUPTED:
        what, fix = f"was interrupted during start-up ({failure.cause})", "Relaunch every rank"
    else:
        what, fix = (f"could not create its client: {failure.cause}",
                     f"Fix the cause on rank {failure.rank} (its log has the details) and relaunch every rank")
    own = (f" (this rank's own client then failed too, most likely as a consequence: {failure.secondary})"
           if failure.secondary else "")
    return DistributedError(f"tpu_dist: rank {rank} of {world_size} cannot start: rank {failure.rank} {what}."
                            f"{own} {fix}")


# How much longer than the collective timeout a process waits for the others at exit: a
# peer whose collective timed out still raises, unwinds and reaches the barrier.
_SHUTDOWN_MARGIN_S = 30
_COLLECTIVE_TIMEOUT_FLAG = "--xla_cpu_collective_timeout_seconds"


def _bound_cpu_collectives(seconds: int) -> None:
    """XLA:CPU's collectives (gloo) time out after `seconds` instead of XLA's 30 minutes,
    unless XLA_FLAGS sets the timeout already. Read from XLA_FLAGS when jaxlib first
    parses its flags -- at the first client -- which is this job's client: the runtime
    starts before any other (`require_no_client`). TPU/GPU ignore the flag."""
    flags = os.environ.get("XLA_FLAGS", "")
    if _COLLECTIVE_TIMEOUT_FLAG not in flags:
        os.environ["XLA_FLAGS"] = f"{flags} {_COLLECTIVE_TIMEOUT_FLAG}={seconds}".strip()


_current: DistributedRuntime | None = None
_current_lock = threading.Lock()


def current() -> DistributedRuntime | None:
    """The runtime of `initialize`, or None in a single-process program."""
    return _current


def initialize(rank: int, world_size: int, address: str, *, timeout_s: float = 300.0,
               hostname: str | None = None, local_device: int | None = None) -> DistributedRuntime:
    """Joins the job of `world_size` processes whose coordination service is at
    `address` ("host:port"; process 0 serves it). Makes the multi-process client the
    process-wide one, of the platform the single-process client would use
    (`client.make_multiprocess_raw_client`; `local_device`: this process's GPU among its
    host's, torchrun's LOCAL_RANK): call it before anything else uses the runtime.
    When a rank's client cannot be created, every rank raises, the others naming that rank
    and its cause (`_client_start`), instead of being aborted by jaxlib."""
    global _current
    with _current_lock:
        if _current is not None:
            if (_current.rank, _current.world_size, _current.address) != (rank, world_size, address):
                raise DistributedError(
                    f"the distributed runtime is already initialized as {_current}; it cannot be "
                    f"re-initialized as rank {rank} of {world_size} at {address} in the same process"
                )
            return _current
        if not 0 <= rank < world_size:
            raise DistributedError(f"rank {rank} is outside 0..{world_size - 1} (world size {world_size})")
        seconds = max(1, int(timeout_s))
        # A process that stops heartbeating makes the service abort every other process
        # (a C++ LOG(FATAL): jaxlib's callback hook cannot be given a Python function).
        # Longer than the group timeout, so a handshake waiting for a dead process raises
        # its Python error, naming it, first; capped so a job still ends when one dies.
        heartbeat = max(10, min(2 * seconds + 5, 120))
        # A rank waiting in a collective its peers never run must get an error, not wait
        # forever: XLA:CPU's gloo collectives fail after the job's timeout (a process-wide
        # flag, read when the client is made). Leaving, every process waits at the exit
        # barrier longer than that (`DistributedRuntime.shutdown`), so such a peer raises,
        # and leaves, before process 0 stops the service (a stopped service aborts the
        # processes still connected to it).
        _bound_cpu_collectives(seconds)
        service = None
        if rank == 0:
            busy = _port_in_use(address)
            if busy:
                raise DistributedError(
                    f"tpu_dist: rank 0 cannot serve the coordination service at {address}: {busy}. The "
                    "port (MASTER_PORT + 1) is in use: pick another MASTER_PORT"
                )
            try:
                service = _jaxlib.distributed_service(address, world_size, heartbeat, min(seconds, 30))
            except Exception as err:  # noqa: BLE001 - a busy port is a plain RuntimeError
                raise DistributedError(
                    f"tpu_dist: rank 0 cannot serve the coordination service at {address}: {err}. The port "
                    "(MASTER_PORT + 1) may be in use: pick another MASTER_PORT"
                ) from None
        dclient = _jaxlib.distributed_client(address, rank, seconds, heartbeat, min(seconds, 30))
        try:
            dclient.connect()
        except Exception as err:  # noqa: BLE001
            if service is not None:
                service.shutdown()
            raise DistributedError(
                f"tpu_dist: rank {rank} could not join the {world_size}-process job at {address} within "
                f"{seconds} s: {err}. Check that every rank runs with the same MASTER_ADDR, "
                "MASTER_PORT and WORLD_SIZE and that all of them started"
            ) from None
        # Each collective's output is a new buffer of its operand's size: reuse freed ones
        # (docs/explanation/distributed.md, "Performance").
        host_heap.keep_freed_memory()
        def create() -> tuple[str, Any]:
            # Fails before this rank takes part in the collective creation, not after its
            # peers counted on its client.
            require_no_client()
            return make_multiprocess_raw_client(
                dclient, rank, world_size, hostname or local_address(address), local_device)

        installed: list[Client] = []
        made: list[DistributedRuntime] = []

        def finish(created: tuple[str, Any]) -> DistributedRuntime:
            # Everything that can fail runs before this rank declares itself ready, so it fails
            # through the start protocol (peers name this rank) rather than after the job started.
            installed.append(install_client(*created))
            made.append(DistributedRuntime(rank, world_size, address, float(timeout_s), service, dclient,
                                           installed[0]))
            return made[0]

        start = _client_start.WatchedStart(create, _StartStore(dclient), rank, world_size)
        try:
            runtime = start.result(seconds, finish)
        except BaseException as failure:
            if not isinstance(failure, (_client_start.StartFailure, _client_start.StartTimeout)):
                # Interrupted (Ctrl-C) or an internal error: the peers must hear of it, and this
                # rank must leave as for a failure, or jaxlib aborts every process.
                if start.abandon(failure):
                    # Too late: a peer saw every rank ready and started the job. This rank is
                    # part of it and leaves it at exit, as a started rank does.
                    _current = made[0]
                    atexit.register(shutdown)
                    raise
            if installed:
                uninstall_client(installed[0])
            _leave_unstarted(dclient, service, min(seconds, 10))
            if not start.settle(10.0):
                log.warning("tpu_dist: rank %d's client creation is still running in jaxlib", rank)
            if isinstance(failure, (_client_start.StartFailure, _client_start.StartTimeout)):
                raise _start_error(failure, rank, world_size, seconds) from None
            raise
        _current = runtime
        atexit.register(shutdown)
        log.info("tpu_dist: %s", runtime)
        return runtime


def shutdown() -> None:
    """Leaves the job (also run at exit)."""
    global _current
    with _current_lock:
        runtime, _current = _current, None
    if runtime is not None:
        runtime.shutdown()
