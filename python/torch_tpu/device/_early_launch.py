"""A repeating compiled training step launched at its first graph call (issue 28,
TORCH_TPU_EARLY_STEP_LAUNCH). (FUSED mode records a compiled training step the same way when
its training forward is the trace's first op, and launches it the same way.)

In Strict mode a compiled training step is deferred into one trace (`_fused.py`): its
forward, backward and optimizer graphs are recorded and the whole step runs as one program
after the optimizer step's end (at the next op or read). Meanwhile the device waits: on the chip the host records the
495 M-parameter step in ~17.7 ms (Dynamo's and AOTAutograd's wrappers, autograd's engine,
three recordings, the flush, PjRT's execute call), and a loop that syncs every few steps
(reading its loss) pays that once per block, before the device starts.

A step that repeats reads the same storages each time: the parameters, the optimizer's
states and step counters, and the forward's inputs. So when the first graph of a step whose
last run went as one program is recorded, that program is launched at once on the buffers
those storages hold now (`StepPlan`: where each argument of the last run came from -- an
operand of the first graph, the RNG key that graph drew when it was recorded (dropout), or
the storage an optimizer graph read). The host then records
the rest of the step as before, while the device runs it; at the flush, when the trace is
the same program (its key) reading the very same buffers and the same Python numbers, the
launched results are the trace's and nothing else runs (`take`). Otherwise -- the user
wrote a parameter between the forward and the step, read a result mid-step, changed the
learning rate -- the launched results are dropped and the trace runs as it would have.
A buffer never changes in place (a write rebinds its storage to a new buffer; a buffer
whose memory the host may write through, `_exported`, is never launched on), so the same
buffer objects are the same values: a hit computes what the flush's launch would have.

The early launch cannot donate (a step that turns out different still needs its inputs),
so it runs the step's program compiled a second time, without donation: its outputs take
new memory beside the inputs until the flush binds them. It is launched only where what the
device holds at the launch plus what that program allocates (its outputs and temporaries,
from XLA's memory analysis of it) stays under `ROOM` of the device's memory -- checked at
each launch against the memory in use then, not against the process's peak, which only ever
grows (a step run earlier, an evaluation at a larger batch, another model) and would stop
every later step's launches for good -- and two misses in a row stop the early launches of a
step.
Which program a step runs depends only on how often its trace was seen and on what it read
(a launch waits for the second compile, as a fused run waits for its first), so runs repeat
bit for bit, as `_fused.Trace._run` requires.
"""

from __future__ import annotations

import logging
import weakref
from concurrent.futures import Future

import numpy as np

from torch_tpu.core import config
from torch_tpu.runtime.buffer import DeviceBuffer

from . import _fused, _storage  # (_fused imports this module too: each reads the other's names at call time)

log = logging.getLogger("torch_tpu")
# Trace key -> Future of the program compiled without donation, then its `_fused._Launch`,
# or `_fused._INTERPRET` when it could not be built (that step is not launched early).
_PROGRAMS: dict = {}
# Keys whose undonated run could not fit beside what the device held at their last flush
# (logged once; checked again at each flush).
_NO_ROOM: set = set()
ROOM = 0.9  # of the device's memory (`bytes_limit`) an early launch may bring its use to
MAX_MISSES = 2  # misses in a row after which a step is no longer launched early
STATS = {"launches": 0, "hits": 0, "misses": 0}


class StepPlan:
    """Where each argument of a step's last fused run came from, kept on the step's first
    graph (`GraphPlan.step_plan`). `sources`: per @main argument of its own (`Trace.layout`),
    an int -- that operand of the first graph -- or a weak reference to the storage entry a
    later graph read it from; `floats`, `ints`: the packed Python numbers of that run."""

    __slots__ = ("key", "sources", "floats", "ints", "misses", "n_ops", "written_bytes", "told_no_room")

    def __init__(self, key: tuple, sources: list, floats: np.ndarray, ints: np.ndarray, n_ops: int,
                 written_bytes: int) -> None:
        self.key = key
        self.sources = sources
        self.floats = floats
        self.ints = ints
        self.misses = 0
        self.n_ops = n_ops
        self.written_bytes = written_bytes  # what the step writes in place (its new values' bytes)
        self.told_no_room = False  # the launch-time refusal is logged once per step


def enabled() -> bool:
    return config.get("TORCH_TPU_EARLY_STEP_LAUNCH")


def note_source(trace, ref: int, entry) -> None:
    """Records (`_fused._record`) that external `ref` of a launchable step (`Trace.launchable`)
    was first read, after the step's first graph, from storage `entry`."""
    trace.sources[ref] = weakref.ref(entry)


def remember(trace, key: tuple, outputs: list) -> None:
    """After `trace` (a step opened by a compiled graph: `Trace.launchable`) ran its fused
    program: keeps where its arguments came from on its first graph, and starts the compile
    of its program without donation, so that the next step can be launched at that graph's
    call. A step whose plan is kept already (same key) changes nothing."""
    first = trace.plans[0]
    plan = first.step_plan
    if plan is not None and plan.key == key:
        return
    first.step_plan = None
    if not enabled():
        return
    own, floats, ints = trace.layout()
    kinds, values = trace.kinds, trace.values
    first_reads = {}
    for position, ref in enumerate(trace.refs[0]):
        if type(ref) is int:
            first_reads.setdefault(ref, position)
    sources: list = []
    for ref in own:
        source = first_reads.get(ref, trace.sources.get(ref))
        # A 0-d CPU tensor is read anew each step, and an RNG key drawn after the first graph
        # (at its own graph's recording) is not drawn yet at the launch: not predictable. The
        # first graph's own key (dropout in the forward) is drawn when it is recorded.
        if source is None or not (kinds[ref] == "buffer" or (kinds[ref] == "key" and source.__class__ is int)):
            return
        sources.append(source)
    written = sum(trace.values[ref].nbytes for ref in trace.written_externals())
    if not _may_fit(trace, key, written):
        return
    if key not in _PROGRAMS:
        if len(_PROGRAMS) >= _fused._MAX_PROGRAMS:
            del _PROGRAMS[next(iter(_PROGRAMS))]
        _PROGRAMS[key] = trace._compile(key, outputs, donate=False)
    first.step_plan = StepPlan(key, sources, *trace.packed_numbers(floats, ints), len(trace.plans), written)


def _may_fit(trace, key: tuple, written: int) -> bool:
    """At the flush, before the undonated program is compiled: whether its run could fit at
    all -- what the device holds now plus the new copies of what the step writes in place,
    under `ROOM` of its memory (the launch checks the program's own figures, `_fits`). Always
    where the platform reports no limit (XLA:CPU). Logged once per step; a step refused here
    is checked again at its next flush."""
    memory = _device_memory(trace.index)
    if memory is None or memory[0] + written <= ROOM * memory[1]:
        _NO_ROOM.discard(key)  # (memory freed since an earlier flush of this step)
        return True
    if key in _NO_ROOM:
        return False  # said already; checked again at the step's next flush
    if len(_NO_ROOM) >= 4 * _fused._MAX_PROGRAMS:
        _NO_ROOM.clear()  # keys of steps that never repeat: keep the set small
    _NO_ROOM.add(key)
    _tell_no_room(len(trace.plans), written, "", memory)
    return False


def _fits(plan: StepPlan, program, index: int) -> bool:
    """At the launch: whether the undonated program's run fits beside what the device holds
    now -- its outputs and temporaries (XLA's memory analysis; where there is none, the new
    copies of what the step writes) under `ROOM` of the device's memory. Checked at every
    launch: memory freed since (an evaluation model dropped) lets a refused step launch again."""
    memory = _device_memory(index)
    if memory is None:
        return True
    analysis = program.executable.memory_analysis()
    need = (analysis["output"] - analysis["alias"] + analysis["temp"]) if analysis else plan.written_bytes
    if memory[0] + need <= ROOM * memory[1]:
        return True
    if not plan.told_no_room:
        plan.told_no_room = True
        _tell_no_room(plan.n_ops, need, " (its outputs and temporaries)", memory)
    return False


def _device_memory(index: int) -> tuple[int, int] | None:
    """(bytes in use, bytes limit) of the device, None where the platform reports no limit
    (XLA:CPU: every step fits)."""
    stats = _storage.client().device(index).memory_stats()
    limit = stats.get("bytes_limit")
    return (stats.get("bytes_in_use", 0), limit) if limit else None


def _tell_no_room(n_ops: int, need: int, what: str, memory: tuple[int, int]) -> None:
    in_use, limit = memory
    log.info("torch_tpu: a compiled training step of %d ops is not launched early: without donation it would "
             "need %.2f GB%s beside the %.2f GB the device holds, over %d%% of its %.2f GB; it is checked again "
             "at each step (TORCH_TPU_EARLY_STEP_LAUNCH)", n_ops, need / 1e9, what, in_use / 1e9, int(ROOM * 100),
             limit / 1e9)


def launch(trace) -> None:
    """At the first graph of `trace` (just recorded): launches the program of the step that
    graph started last time, on the buffers its sources hold now, when it has a plan."""
    plan = trace.plans[0].step_plan
    if plan is None or plan.misses >= MAX_MISSES or not enabled():
        return
    program = _PROGRAMS.get(plan.key)
    if program is None:
        return
    if isinstance(program, Future):
        # Waited for, as a fused run waits for its program: whether a step is launched early
        # must not depend on how fast its compile was.
        program = _PROGRAMS[plan.key] = _fused._loaded(program, plan.n_ops)
    if program is _fused._INTERPRET or not _fits(plan, program, trace.index):
        return
    first_refs, values, kinds = trace.refs[0], trace.values, trace.kinds
    args = []
    read = []  # what the trace holds for each argument: a buffer, or the first graph's RNG key
    for source in plan.sources:
        if source.__class__ is int:
            ref = first_refs[source]
            buffer = values[ref]
            if kinds[ref] == "key":
                read.append(buffer)
                args.append(trace._external_argument(ref))  # uploaded, as the flush would
                continue
        else:
            entry = source()
            if entry is None:
                return  # the storage is gone: the step will read another one
            buffer = entry._buffer
        if buffer.__class__ is not DeviceBuffer or buffer._exported or buffer.is_deleted:
            return  # pending in another trace, or memory the host may write through
        read.append(buffer)
        args.append(buffer)
    for packed in (plan.floats, plan.ints):
        if packed.size:
            args.append(_fused._packed_numbers(packed, trace.index))
    try:
        outs = program.buffers(*args)
    except Exception as err:  # noqa: BLE001 - the step still runs at its flush, as without the launch
        plan.misses = MAX_MISSES
        # The text only: a log record holding the exception would hold its traceback's frames,
        # and through them the step's tensors (a handler keeping records, such as pytest's).
        log.warning("torch_tpu: launching a compiled training step early failed (%s); it runs after the "
                    "optimizer step's end from now on (TORCH_TPU_EARLY_STEP_LAUNCH=0 says so too)",
                    f"{type(err).__name__}: {err}")
        return
    trace.launched = (plan, read, outs)
    STATS["launches"] += 1


def take(trace, key: tuple) -> list | None:
    """At `trace`'s flush: the results of its early launch when the trace is that program
    reading those very buffers and numbers, else None (the launched results are dropped)."""
    plan, read, outs = trace.launched
    trace.launched = None
    if plan.key == key and _read_as_launched(trace, plan, read):
        plan.misses = 0
        STATS["hits"] += 1
        return outs
    plan.misses += 1
    STATS["misses"] += 1
    if plan.misses == MAX_MISSES:
        log.info("torch_tpu: a compiled training step launched early turned out different %d times in a row "
                 "(another program, or other inputs); it runs after the optimizer step's end from now on",
                 MAX_MISSES)
    return None


def _read_as_launched(trace, plan: StepPlan, read: list) -> bool:
    """Whether the trace's own arguments are the very objects the launch read (buffers, the
    first graph's RNG key) and its numbers the launch's."""
    own, floats, ints = trace.layout()
    values = trace.values
    if len(own) != len(plan.sources) or any(values[ref] is not value for ref, value in zip(own, read)):
        return False
    packed_floats, packed_ints = trace.packed_numbers(floats, ints)
    return packed_floats.tobytes() == plan.floats.tobytes() and packed_ints.tobytes() == plan.ints.tobytes()


def compiling() -> list[Future]:
    """The compiles under way (`_fused.wait_for_compiles`)."""
    return [program for program in list(_PROGRAMS.values()) if isinstance(program, Future)]
