"""Running a compiled program: one invoker for every program of the backend and the
device (compiled graphs, graphs compiled with torch_tpu's view passes, the eager device's
single-op plans and fused traces).

An argument plan decided once per program (which positions are module state held
resident on the device, which are effect tokens or Python scalars; all other positions
pass through untouched, with no per-call dispatch), then the executable, then an output
plan (torch tensors in the graph's structure, or DeviceBuffers). tpu tensors are reached
through the adapter the device installs (`program/tpu_tensors.py`), never by importing
the device.

Invoker API (what callers use):

    Invoker(executable, input_specs, *, needs_rng=False, resident=(), written=())
        input_specs: the program's graph inputs (`ImportedGraph.inputs` with role "input"),
        resident: indices of inputs that are module state (parameters, buffers): uploaded
        once and re-uploaded only when the tensor object, its storage or its `_version`
        changes; written: indices the program writes (donated: never resident).
    invoker.arguments(args) -> list
        the executable's arguments for the graph inputs `args` (torch tensors, Python
        scalars, None effect tokens, DeviceBuffers); an RNG seed is appended when needed.
    invoker(*args) -> list[torch.Tensor]
        runs and waits; results are torch tensors (zero-copy on CPU), one per module result.
        With eager tpu tensors as arguments (`torch_tpu.device`), their device buffers are
        passed and results are tpu tensors, enqueued without waiting (`device/_graph_io.py`).
    invoker.buffers(*args) -> list[DeviceBuffer]
        runs asynchronously; DeviceBuffer arguments go straight to the device program
        (no host round trip) and results stay on the device.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch

from .protocols import BufferLaunching
from .tpu_tensors import tpu_tensors


class ResidentParameters:
    """Module state stays on the device between calls: each tensor is uploaded once and
    again only when the object at that position or its `_state` changes (an optimizer
    step, `p.data = ...` -- which may keep the address and the version while changing the
    layout, as `p.data = p.data.t()` does -- an in-place update), so a stale value is
    never served. Entries hold weak references, so models can be freed. On XLA:CPU an
    aligned tensor's buffer aliases its memory (no copy at all). One change no tensor
    records is not seen: an in-place write through `p.data` (`p.data.add_(...)`) leaves
    `p._version` as it was -- the aliased buffer shows it on XLA:CPU, a copied one (an
    unaligned tensor, every TPU/GPU upload) keeps the old value; update module state with
    `torch.no_grad()` in-place ops on the parameter itself (as optimizers do)."""

    def __init__(self) -> None:
        self._entries: dict[int, tuple] = {}

    def get(self, tensor: torch.Tensor, client):
        key = id(tensor)
        entry = self._entries.get(key)
        state = _state(tensor)
        if entry is not None and entry[0]() is tensor and entry[1] == state:
            return entry[2]
        buffer = client.to_device(tensor.detach())
        ref = weakref.ref(tensor, lambda _, k=key: self._entries.pop(k, None))
        self._entries[key] = (ref, state, buffer)
        return buffer

    def __len__(self) -> int:
        return len(self._entries)


RESIDENT_PARAMETERS = ResidentParameters()


def _state(tensor: torch.Tensor) -> tuple:
    """What a module-state tensor's device copy depends on: its memory (`data_ptr`), the
    writes PyTorch counts (`_version`) and its layout (dtype, sizes, strides), which
    `p.data = ...` may change with the first two unchanged."""
    return tensor.data_ptr(), tensor._version, tensor.dtype, tensor.shape, tensor.stride()


class ArgumentPlan:
    """How a call's graph inputs become the executable's arguments, decided on the first
    call from the program's input specs and that call's argument kinds (Dynamo guards
    the kinds of a graph's inputs, so they hold for every later call):

    * module state (`resident` indices, and `nn.Parameter`s) -> the resident device
      buffer (`ResidentParameters`), unless the program writes it (donation);
    * None (aot_autograd's effect tokens) -> one empty tensor of the spec's shape;
    * a Python scalar -> a 0-d tensor of the spec's dtype;
    * anything else (tensors, DeviceBuffers) passes through; the executable's converter
      checks dtype and shape and moves it (zero-copy on CPU where allowed).

    Only the positions with a step are visited per call."""

    def __init__(self, specs: Sequence[Any], client, resident: Iterable[int] = (), written: Iterable[int] = (),
                 needs_rng: bool = False, device_index: int | None = None) -> None:
        self._specs = list(specs)
        self._client = client
        self._resident = set(resident) - set(written)
        self._written = set(written)
        self._needs_rng = needs_rng
        self._steps: list[tuple[int, Callable[[Any], Any]]] | None = None
        # Set by a device plan: every argument is a tpu tensor (the case
        # `Invoker.device_caller` reads in one loop; it decides itself whether a donated
        # position gets the storage's buffer or a copy).
        self.reads_tpu_tensors_only = False
        # The tpu device index when the graph's tensors are eager tpu tensors (decided on
        # the first call, like the steps; given by the compiler for a graph that only
        # creates tpu tensors): their device buffers are the arguments.
        self.device_index: int | None = device_index

    def _plan(self, args: Sequence[Any]) -> list[tuple[int, Callable[[Any], Any]]]:
        client = self._client
        steps: list[tuple[int, Callable[[Any], Any]]] = []
        found = tpu_tensors().device_of(args)
        if found is not None:
            self.device_index = found
        if self.device_index is not None:
            return self._device_plan(args)

        for index, (spec, arg) in enumerate(zip(self._specs, args)):
            if index in self._written:
                if isinstance(arg, torch.nn.Parameter):
                    steps.append((index, torch.Tensor.detach))  # a plain tensor: copied, never donated
            elif index in self._resident or isinstance(arg, torch.nn.Parameter):
                steps.append((index, _resident_step(client)))
            elif arg is None or isinstance(arg, (bool, int, float, complex)):
                steps.append((index, _non_tensor_step(spec, arg)))
        return steps

    def _device_plan(self, args: Sequence[Any]) -> list[tuple[int, Callable[[Any], Any]]]:
        """Steps for a graph on tpu tensors: each tpu tensor -> its DeviceBuffer read on
        the device (parameters included: they are device buffers already, so they never
        enter `RESIDENT_PARAMETERS`); written ones get a fresh buffer, so donating it
        leaves the storage intact until aot_autograd's epilogue `copy_`s the new value
        in (the device rebinds the storage, as for any in-place op)."""
        device = tpu_tensors()

        def argument(value: torch.Tensor):
            return device.argument(value, False)

        def shared_argument(value: torch.Tensor):
            return device.argument(value, True)

        steps: list[tuple[int, Callable[[Any], Any]]] = []
        for index, (spec, arg) in enumerate(zip(self._specs, args)):
            if isinstance(arg, torch.Tensor) and arg.device.type == "tpu":
                steps.append((index, argument if index in self._written else shared_argument))
            elif arg is None or isinstance(arg, (bool, int, float, complex)):
                steps.append((index, _non_tensor_step(spec, arg)))
        self.reads_tpu_tensors_only = (len(steps) == len(self._specs) == len(args)
                                       and all(step is shared_argument or step is argument for _, step in steps))
        return steps

    def passes_through(self, count: int) -> bool:
        """Whether `count` arguments go to the executable exactly as given (planned, no
        position with a step, no RNG seed): the caller may then skip the plan."""
        return self._steps == [] and not self._needs_rng and count == len(self._specs)

    def __call__(self, args: Sequence[Any]) -> list:
        steps = self._steps
        if steps is None:
            steps = self._steps = self._plan(args)
        inputs = list(args[: len(self._specs)])
        for index, step in steps:
            inputs[index] = step(inputs[index])
        if self._needs_rng:
            if self.device_index is not None:
                # A graph on tpu tensors draws from the device's generator, the one eager
                # tpu random ops use (torch.tpu.manual_seed).
                inputs.append(tpu_tensors().rng_key(self.device_index))
            else:
                # Seeded from PyTorch's generator, so torch.manual_seed makes runs repeatable.
                inputs.append(torch.randint(0, 2**62, (2,), dtype=torch.int64).to(torch.uint64))
        return inputs


class Invoker:
    """Runs one compiled program: `ArgumentPlan` -> executable -> results (see the module
    docstring for the API)."""

    def __init__(self, executable, input_specs: Sequence[Any], *, needs_rng: bool = False,
                 resident: Iterable[int] = (), written: Iterable[int] = (), host_results: Iterable[int] = (),
                 device_index: int | None = None) -> None:
        self.executable = executable
        self.plan = ArgumentPlan(input_specs, executable.client, resident, written, needs_rng, device_index)
        # Results that are CPU tensors in a graph on tpu tensors (`_compile.host_results`).
        self.host_results: frozenset[int] = frozenset(host_results)
        # Set after the first call when every argument passes through untouched (an eager
        # device op's DeviceBuffers, a graph of plain tensors): later calls with that many
        # arguments skip the plan (~3 us of the ~20 us of the smallest call).
        self._direct_count = -1

    def arguments(self, args: Sequence[Any]) -> list:
        return self.plan(args)

    def host_caller(self, result_type: type) -> Callable[..., Any] | None:
        """After the first call: `__call__` for host tensors as one closure returning the
        results in a `result_type` (`Executable.caller`), the plan's steps (module state
        held resident, tokens, scalars) applied first; None where that is not `__call__`:
        not planned yet, tpu tensors (results stay on the device), an RNG seed to draw.
        With steps, a call with another number of arguments goes through the plan as in
        `__call__`; without, it is the executable's arity error (naming the program),
        where `__call__` would drop arguments beyond the program's inputs."""
        plan = self.plan
        steps = plan._steps
        count = len(plan._specs)
        if steps is None or plan.device_index is not None or plan._needs_rng or self.executable.num_args != count:
            return None
        call = self.executable.caller(result_type)
        if not steps:
            return call
        steps = tuple(steps)

        def planned(*args: Any) -> Any:
            inputs = list(args)
            if len(inputs) == count:
                for index, step in steps:
                    inputs[index] = step(inputs[index])
            else:
                inputs = plan(args)
            return call(*inputs)

        return planned

    def device_caller(self, result_type: type, writes: dict[int, int] | None = None,
                      fusable: tuple[Any, Any] | None = None) -> Callable[..., Any] | None:
        """After the first call: `__call__` for tpu tensors as one closure returning the
        results in a `result_type`, when every argument is a tpu tensor read as it is
        (parameters, caches, activations: `ArgumentPlan.reads_tpu_tensors_only`), it donates
        only the plan's written positions and the executable launches DeviceBuffers
        (`buffer_launcher`); else None.
        The device reads the buffers, launches and makes the results in one step
        (`TpuTensors.graph_caller`: the plan's and the converters' checks in one loop,
        result sizes computed once); a call with tensors it does not take (a view, another
        dtype, a deleted buffer, another count) goes through `__call__`, which handles them
        or raises its errors. `writes`: results that are new values of inputs (result
        index -> input position) the device may write into those inputs itself, returning
        the input at that place; a donated one of those may be consumed by the call
        (`graph_caller` decides per call). `fusable`: (module, fingerprint, starts a training
        step) of the program, so that the device may record the call as one op of a trace
        (FUSED mode; a compiled training step in Strict mode)."""
        plan = self.plan
        executable = self.executable
        index = plan.device_index
        count = len(plan._specs)
        # A program with random ops takes its RNG key last (`ArgumentPlan.__call__`): the
        # device draws it from the generator eager random ops use, per call or per record.
        if (plan._steps is None or index is None or not plan.reads_tpu_tensors_only
                or not isinstance(executable, BufferLaunching) or executable.num_args != count + plan._needs_rng
                or not set(executable.donated_args) <= plan._written or len(executable.devices) != 1):
            return None
        from torch_tpu.runtime import dtypes

        def torch_dtype(spec: Any) -> Any:
            return dtypes.torch_dtype(spec.element_type)

        signature = executable.signature
        fast = tpu_tensors().graph_caller(
            [(tuple(a.shape), torch_dtype(a), a.element_type) for a in signature.args],
            [(tuple(r.shape), torch_dtype(r)) for r in signature.results],
            executable.devices[0], index, executable.buffer_launcher(), self.host_results, dict(writes or {}),
            tuple(executable.donated_args), None if fusable is None else (executable, *fusable), plan._needs_rng)
        slow = self.__call__

        def call(*args: Any) -> Any:
            results = fast(args) if len(args) == count else None
            return result_type(slow(*args) if results is None else results)

        return call

    def _arguments(self, args: tuple) -> Sequence[Any]:
        if len(args) == self._direct_count:
            return args
        inputs = self.plan(args)
        if self.plan.passes_through(len(args)):
            self._direct_count = len(args)
        return inputs

    def __call__(self, *args: Any) -> list[torch.Tensor]:
        if len(args) == self._direct_count and self.plan.device_index is None:
            # Host tensors passing through untouched: straight to the executable (two
            # Python frames fewer on the smallest call).
            return self.executable(*args)
        return self.run(self._arguments(args))

    def run(self, arguments: Sequence[Any]) -> list[torch.Tensor]:
        """Runs on the executable's arguments (`arguments(args)`, plus any a caller
        appends: a bounded graph's sizes); results as `invoker(*args)` returns them."""
        index = self.plan.device_index
        if index is not None:
            # tpu tensors in, tpu tensors out: the results stay on the device.
            result = tpu_tensors().result
            host = self.host_results
            return [buffer.to_torch() if k in host else result(buffer, index)
                    for k, buffer in enumerate(self.executable.execute(arguments))]
        return self.executable(*arguments)

    def buffers(self, *args: Any) -> list:
        return self.executable.execute(self._arguments(args))


class OutputPlan:
    """How a program's results become the graph's output structure: results picked by
    index (constants in between), eager's layouts applied where they differ, the pytree
    rebuilt. The common case (every output a result in order, a flat tuple or list, no
    layout to apply) is a single tuple()/list() call."""

    def __init__(self, outputs: Sequence[Any], tree: Any, layouts: list | None = None) -> None:
        import torch.utils._pytree as pytree

        self._outputs = list(outputs)
        self._tree = tree
        self._layouts = layouts
        in_order = all(o.kind == "tensor" and o.index == i for i, o in enumerate(self._outputs))
        flat = tree.type in (tuple, list) and all(c.is_leaf() for c in tree.children())
        self._direct = tree.type if (in_order and flat and layouts is None
                                      and tree.num_leaves == len(self._outputs)) else None
        self._unflatten = pytree.tree_unflatten

    def direct_type(self, result_count: int) -> type | None:
        """tuple or list when the graph's outputs are exactly the program's
        `result_count` results in that container (the plan is a single call), else None."""
        return self._direct if result_count == len(self._outputs) else None

    def __call__(self, results: Sequence[Any]) -> Any:
        if self._direct is not None:
            if len(results) == len(self._outputs):
                return self._direct(results)
            return self._direct(results[: len(self._outputs)])
        from .output_layout import apply_layout

        leaves = [results[o.index] if o.kind == "tensor" else o.value for o in self._outputs]
        if self._layouts is not None:
            leaves = [apply_layout(leaf, layout) if layout is not None else leaf
                      for leaf, layout in zip(leaves, self._layouts)]
        return self._unflatten(leaves, self._tree)


def _resident_step(client) -> Callable[[Any], Any]:
    """The step of one module-state position: `RESIDENT_PARAMETERS`, with the last answer
    kept at the position itself. The same parameter comes back at the same position on
    every call, so the common case is the object and its `_state` (the very checks
    `ResidentParameters.get` makes) instead of a lookup in the process-wide table. The
    tensor is held weakly and the buffer is let go with it, as the table lets its entry
    go: a freed model's memory is not kept alive here."""
    empty = (None, None, None)
    # One tuple (weakref to the tensor, _state, buffer), replaced whole, so a call on
    # another thread reads a consistent entry.
    last: list[tuple[Any, Any, Any]] = [empty]

    def forget(ref: Any) -> None:
        if last[0][0] is ref:
            last[0] = empty

    def resident(value: Any) -> Any:
        ref, state, buffer = last[0]
        if ref is not None and ref() is value and _state(value) == state:
            return buffer
        if not isinstance(value, torch.Tensor):
            return value
        buffer = RESIDENT_PARAMETERS.get(value, client)
        last[0] = (weakref.ref(value, forget), _state(value), buffer)
        return buffer

    return resident


def _non_tensor_step(spec, arg) -> Callable[[Any], Any]:
    """The step of a non-tensor argument, shared by the host and device plans: None (a
    token) becomes one preallocated empty tensor, a Python number a 0-d tensor of the
    parameter's dtype."""
    if arg is None:
        token = torch.empty(spec.shape, dtype=spec.dtype)
        return lambda _, t=token: t
    return lambda value, dtype=spec.dtype: torch.tensor(value, dtype=dtype)
