"""Registers the eager `tpu` device with PyTorch, in Python: PrivateUse1 renamed `tpu`,
the `torch.tpu` module, hooks, a device guard, and the kernels:

* view kernels (`view`, `as_strided`, `set_`, ...) are PyTorch's CPU kernels run over
  our non-owning storages: they only touch metadata, so aliasing is PyTorch's own;
* allocation, copies and host reads, `.item()` and `torch.equal` (`_copy.py`);
* every overload of the lowering table, and their in-place / out= forms (`_ops.py`);
* a boxed fallback for every other op: its decomposition when the compiler's table
  has one, else `_ops.py` when a functional form is lowered, else the CPU (`_fallback.py`).
"""

from __future__ import annotations

import functools
import itertools
import threading

import torch

from . import (
    _accelerator_api, _attention, _autocast, _copy, _dynamo_skip, _fallback, _module_apply, _ops, _out_decomposition,
    _pinned, _program_adapter, _resize_storage, _serialization, _tracing_rules,
)
from ._buffers import StorageEntry

aten = torch.ops.aten
_lock = threading.Lock()
_libraries: list = []
_CPU = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)

_VIEW_KERNELS = (
    aten.view.default, aten.view.dtype, aten.as_strided.default, aten._reshape_alias.default,
    aten.unfold.default,
    # Views that reinterpret complex elements as (real, imaginary) pairs and back: dtype
    # views, which the device's ops read and write in place (`.real`, `.imag` and Adam on
    # complex parameters write through them).
    aten.view_as_real.default, aten.view_as_complex.default,
    aten.set_.source_Storage_storage_offset, aten.set_.source_Storage, aten.set_.source_Tensor,
)


# Ops that PyTorch's own kernel for every device computes as an alias of the input
# (CompositeExplicitAutograd, no dispatch below it): the device registers no kernel of its
# own for them. `_unsafe_view` is `view` without view tracking, which `linear`/`matmul`
# and `reshape` call on a result they just made (mm's output as (batch, seq, features));
# a lowered kernel copied the storage -- one recorded op and one storage per `nn.Linear`
# call in FUSED mode (177 of 2,077 ops of bench/tpu.py case 7's 16-layer step) -- where
# PyTorch's kernel, as on CPU and CUDA, only makes a tensor over the same storage.
_ALIASING_KERNELS = frozenset({aten._unsafe_view.default})


# CompositeImplicitAutograd ops that the device runs through their lowering rather than
# PyTorch's decomposition: a kernel registered for PrivateUse1 takes precedence over the
# composite one below autograd (the op keeps its own derivative formula). SiLU's backward
# decomposes into 8 small ops (sigmoid, a `1 - s` through empty_like/fill_/sub_, four
# products and sums): in FUSED mode each is a recorded op, 8 per MLP layer of a step.
_TAKEN_COMPOSITES = frozenset({aten.silu_backward.default})


class _Hooks(torch._C._acc.PrivateUse1Hooks):
    def is_available(self) -> bool:
        return True

    def has_primary_context(self, dev_id) -> bool:
        return True

    def is_built(self) -> bool:
        return True


class _Guard(torch._C._acc.DeviceGuard):
    # PyTorch's C++ asks the guard for its device type on every stream query, and with an
    # accelerator registered, Dynamo's compiled frames query the current stream on every
    # call (`torch.accelerator.current_stream`, to track streams): a builtin bound method
    # answers without running a Python frame (inside a compiled frame each Python frame also
    # passes Dynamo's frame hook). It returns the one constant, forever.
    type_ = staticmethod(itertools.repeat(torch._C._autograd.DeviceType.PrivateUse1).__next__)


def _cpu_redispatch(op):
    """The kernel of a view op: PyTorch's CPU kernel over the same (non-owning) storage.
    The operator handle's own `redispatch_boxed` bound to the CPU key, called by the
    dispatcher with no Python frame of ours or of `OpOverload.redispatch` on the way: a
    training step makes more views than ops (transposes and reshapes of every matmul,
    forward and backward: ~1,450 in a step of bench/tpu.py case 7), ~1 us each."""
    return functools.partial(op._handle.redispatch_boxed, _CPU)


def _set_storage(self, source, storage_offset, size, stride=()):
    _serialization.retype(source, self.dtype)
    return aten.set_.source_Storage_storage_offset.redispatch(_CPU, self, source, storage_offset, size, stride)


def execute(op, *args, **kwargs):
    """Every device op that is not a view or a copy."""
    try:
        return _ops.run(op, args, kwargs)
    except _ops.OverlappingWrite as err:
        return _fallback.run_on_cpu(op, args, kwargs, str(err))
    except _ops.Unlowerable as err:
        reason = str(err)
    table = _decompositions()
    decomposition = table.get(op)
    if decomposition is not None:
        outs = _out_decomposition.out_names(op)
        if _out_decomposition.takes_out_arguments(decomposition, outs):
            result = decomposition(*args, **kwargs)
        else:
            result = _out_decomposition.run_through_functional(op, outs, table, args, kwargs)
        if result is not NotImplemented:
            return result
    return _fallback.run_on_cpu(op, args, kwargs, reason)


def _execute_list_writer(op, *args, **kwargs):
    """An in-place op on tensor lists (`_foreach_mul_`): one plan computes every element
    from the values before the op, which is what PyTorch's kernel, element by element,
    computes -- unless a written tensor's storage is also read at another position of the
    lists or by a tensor shared by all (`_foreach_add_([a, b], [b, a])` reads the `b`
    that its first element wrote). Such a call, one with a host tensor of more than one
    element (`_foreach_addcdiv_.Tensor`'s scalars) and one no plan takes run PyTorch's
    own kernel, which runs each element's in-place op on the device.
    When every argument takes the plans' fast signature (every tensor a tpu tensor), the
    aliasing is read from its operands, the storages' entries in argument order, without
    a second pass over the tensors (an optimizer's lists hold every parameter)."""
    fast = _ops._fast_signature(op, args, kwargs)
    if fast is None:
        aliased = _needs_pytorchs_kernel(op, args, kwargs)
    else:
        aliased = _operands_aliased(op, args, kwargs, fast[1])
    if not aliased:
        try:
            return _ops.run(op, args, kwargs, fast=fast)
        except (_ops.Unlowerable, _ops.OverlappingWrite):
            pass
    # (`_op_dk`: the kernel registered for a dispatch key, here PyTorch's element-by-element one.)
    return op._op_dk(torch._C.DispatchKey.CompositeExplicitAutograd, *args, **kwargs)


def _needs_pytorchs_kernel(op, args, kwargs) -> bool:
    """Whether a list-writing op must run element by element (`_execute_list_writer`):
    a written tensor's storage is read or written at another position of the lists (or by
    a tensor shared by all), or a list holds a host tensor of more than one element. One
    pass over the tensors (an optimizer step's lists hold every parameter), each storage
    remembered at its first position or as seen at several."""
    seen = []
    n = len(args)
    for i, name, writes in _list_writer_arguments(op):
        for position, t in _tensor_elements(args[i] if i < n else kwargs.get(name)):
            if t.dim() > 0 and t.device.type != "tpu":
                return True  # host scalars in a tensor: PyTorch's kernel reads them
            seen.append((t.untyped_storage().data_ptr(), position, writes))
    return _written_elsewhere(seen)


def _tensor_elements(value):
    """(list position, tensor) of an argument's tensors: a list's by position, a lone
    tensor at -1 (it is at every position)."""
    if value.__class__ is list or value.__class__ is tuple:
        return [(p, t) for p, t in enumerate(value) if isinstance(t, torch.Tensor)]
    return ((-1, value),) if isinstance(value, torch.Tensor) else ()


def _written_elsewhere(seen) -> bool:
    """Whether a written storage of `seen` ((storage, list position, written) per tensor)
    is at more than one list position."""
    where: dict[int, int] = {}  # storage -> the one list position it is at (-1: all), or _SEVERAL
    written: list[int] = []
    for storage, position, writes in seen:
        if where.setdefault(storage, position) != position:
            where[storage] = _SEVERAL
        if writes:
            written.append(storage)
    return any(where[storage] == _SEVERAL for storage in written)


_SEVERAL = -2


def _operands_aliased(op, args, kwargs, operands) -> bool:
    """`_needs_pytorchs_kernel` for arguments that took the fast signature: `operands`
    holds each tensor's storage entry in argument order (positional, then by name; list
    elements in order) and the run-time numbers. Distinct storages (the common case: an
    optimizer's lists) alias nothing; otherwise each storage's list positions are compared
    as there (`_foreach_addcmul_(v, g, g)` reads each `g` at its own position only)."""
    entries = [id(v) for v in operands if v.__class__ is StorageEntry]
    if len(set(entries)) == len(entries):
        return False
    written_names = _written_names(op)
    slots = iter(entries)
    seen = []
    for name, value in itertools.chain(zip(_ops._positional_names(op), args), kwargs.items()):
        writes = name in written_names
        seen.extend((next(slots), position, writes) for position, _ in _tensor_elements(value))
    return _written_elsewhere(seen)


@functools.lru_cache(maxsize=None)
def _written_names(op) -> frozenset:
    return frozenset(name for _, name, writes in _list_writer_arguments(op) if writes)


@functools.lru_cache(maxsize=None)
def _list_writer_arguments(op) -> tuple:
    """(position, name, written) of each of the op's schema arguments."""
    return tuple((i, a.name, a.alias_info is not None and a.alias_info.is_write)
                 for i, a in enumerate(op._schema.arguments))


@functools.lru_cache(maxsize=1)
def _decompositions() -> dict:
    from torch_tpu.compiler.lowering.decompositions import decomposition_table

    return decomposition_table()


def _no_nested_tensors(*args, **kwargs):
    """Nested tensors do not exist on the device: `nn.TransformerEncoder` makes one in eval
    mode with a padding mask unless its nested path is off (a move to the device turns it
    off, `_module_apply`; an encoder built from layers already there keeps it on)."""
    from ._fallback import user_line

    raise RuntimeError(
        f"torch_tpu: aten._nested_tensor_from_mask at {user_line()}: nested tensors do not exist on the tpu "
        "device. nn.TransformerEncoder makes one in eval mode with a src_key_padding_mask: build it with "
        "enable_nested_tensor=False, set `encoder.use_nested_tensor = False`, or move it with .to('tpu') "
        "after building it (the move turns the nested path off)")


def _record_stream(self, stream):
    """`tensor.record_stream(stream)` (`torch.Stream("tpu")`, `torch.accelerator.current_stream()`):
    nothing to record. The device runs one in-order queue, and a freed storage's buffer
    stays alive in PjRT until the work enqueued on it is done -- what CUDA's caching
    allocator needs the call for. (It reached the CPU fallback, which has no kernel.)"""
    return None


def _boxed_fallback(op, *args, **kwargs):
    return execute(op, *args, **kwargs)


def _lowered_targets(ops):
    """The overloads to register a kernel for, of the lowered overloads `ops`: each one
    and its in-place and out= forms, minus views, CompositeImplicitAutograd ones (PyTorch
    decomposes them first) and, outside aten, overloads that have a tpu kernel already
    (a jax_op's, a user's `register_kernel("tpu")`)."""
    from torch_tpu.compiler.importer.mutation import is_view

    seen = set()
    for op in ops:
        if not isinstance(op, torch._ops.OpOverload):
            continue
        name = op._schema.name.split("::", 1)[1]
        namespace = getattr(torch.ops, op.namespace)
        forms = [op]
        inplace = getattr(getattr(namespace, name + "_", None), op._overloadname, None)
        if inplace is not None:
            forms.append(inplace)
        packet = getattr(namespace, name)
        for overload in packet.overloads():
            if "out" in overload:
                forms.append(getattr(packet, overload))
        for form in forms:
            if form in seen:
                continue
            seen.add(form)
            if is_view(form) or form in _ALIASING_KERNELS:
                # Views keep PyTorch's own (composite) kernels: a lowered view would copy.
                continue
            if _writes_a_list(form) and not form._schema.name.endswith("_"):
                # The foreach out= forms keep PyTorch's own kernel, which runs each
                # tensor's op on the device. In-place ones (`_foreach_add_`) are one plan
                # writing the whole list (`_execute_list_writer`): an optimizer step is a
                # few ops, not a few per parameter.
                continue
            try:
                if form not in _TAKEN_COMPOSITES and \
                        torch._C._dispatch_has_kernel_for_dispatch_key(form.name(), "CompositeImplicitAutograd"):
                    continue
                if op.namespace != "aten" and torch._C._dispatch_has_kernel_for_dispatch_key(form.name(), "PrivateUse1"):
                    continue
            except RuntimeError:  # an overload the dispatcher does not know by that name
                continue
            yield form


def _writes_a_list(op) -> bool:
    return any(a.alias_info is not None and a.alias_info.is_write and isinstance(a.type, torch._C.ListType)
               for a in op._schema.arguments)


def register() -> None:
    """Idempotent: the autoload entry point and `import torch_tpu.device` both call it."""
    with _lock:
        if _libraries:
            return
        from torch.utils.backend_registration import _setup_privateuseone_for_python_backend

        from . import module

        _setup_privateuseone_for_python_backend("tpu", backend_module=module, hook=_Hooks(), device_guard=_Guard())
        impl = torch.library.Library("aten", "IMPL")
        fallback = torch.library.Library("_", "IMPL")
        _libraries.extend([impl, fallback])
        skip = set(_VIEW_KERNELS)
        for op in _VIEW_KERNELS:
            if op is not aten.set_.source_Storage_storage_offset:
                impl.impl(op, _cpu_redispatch(op), "PrivateUse1")
        # torch.load views untyped storages with the saved dtype: retype them first.
        impl.impl(aten.set_.source_Storage_storage_offset, _set_storage, "PrivateUse1")
        _serialization.install()
        _program_adapter.install()  # compiled programs reach tpu tensors through it
        _resize_storage.install()
        _module_apply.install()
        _pinned.install(impl)  # pin_memory() for the tpu device, on CPU tensors
        _accelerator_api.install()
        own = {
            aten.empty.memory_format: _copy.empty_memory_format,
            aten.empty_strided.default: _copy.empty_strided,
            aten.copy_.default: _copy.copy_,
            aten._to_copy.default: _copy._to_copy,
            aten._copy_from_and_resize.default: _copy._copy_from_and_resize,
            aten._local_scalar_dense.default: _copy._local_scalar_dense,
            aten.equal.default: _copy.equal,
            aten.resize_.default: _copy.resize_,
            aten._nested_tensor_from_mask.default: _no_nested_tensors,
            aten.record_stream.default: _record_stream,
        }
        for op, kernel in own.items():
            impl.impl(op, kernel, "PrivateUse1")
            skip.add(op)
        skip |= _attention.install(impl, execute)
        _skip.update(skip)
        fallback.fallback(_boxed_fallback, "PrivateUse1")
        _autocast.register(fallback, impl)
        _dynamo_skip.keep_dynamo_out()


_skip: set = set()
_op_kernels: list = []


def ensure_op_kernels() -> None:
    """Registers a kernel for every lowered overload, on the first tpu tensor: importing
    the lowering table costs seconds, which `import torch` (autoload) must not pay.
    Until then nothing reaches those kernels (no tpu tensor exists). From then on the
    table's changes reach the device (`_lowering_changed`)."""
    if _op_kernels:
        return
    with _lock:
        if _op_kernels:
            return
        from torch_tpu.compiler.lowering import LOWERINGS

        _libraries_by_namespace["aten"] = torch.library.Library("aten", "IMPL")
        # Subscribed before the table is read: a lowering registered meanwhile is seen.
        LOWERINGS.subscribe(_lowering_changed)
        _register_kernels(list(LOWERINGS))
        _register_missing_meta_kernels(_libraries_by_namespace["aten"])
        _tracing_rules.install()
        _op_kernels.append(_libraries_by_namespace["aten"])
        _dynamo_skip.keep_dynamo_out()  # modules the lowering table and the runtime brought in


def _register_missing_meta_kernels(library) -> None:
    """Shape kernels (the Meta key) for the accelerator-only ops the device decomposes
    that PyTorch has none for (`_thnn_fused_gru_cell` and its backward: CUDA kernels
    without a meta function). Tracing a graph on tpu tensors (Dynamo's fake tensors) runs
    them; their decomposition on meta tensors gives the shapes and dtypes."""
    from torch_tpu.compiler.lowering.rnn_cells import DECOMPOSITIONS

    for op, decomposition in DECOMPOSITIONS.items():
        if not torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "Meta"):
            library.impl(op, decomposition, "Meta")


def _register_kernels(ops) -> None:
    """A PrivateUse1 kernel (`execute`) for each of `ops`' targets (`_lowered_targets`)
    that has none of ours yet. A custom op (`torch.library.custom_op`) has a kernel for
    every device (CompositeExplicitAutograd) that runs its Python body: on tpu tensors the
    registered lowering must run instead, so the op gets a tpu kernel of its own."""
    from torch_tpu.compiler.lowering import LOWERINGS

    # Outside aten, only rules from outside the compiler (a user's, a jax_op's: they carry
    # an `identity`); the compiler's own (collectives, prims) keep the boxed fallback.
    ops = [op for op in ops if getattr(op, "namespace", None) == "aten"
           or (op in LOWERINGS and LOWERINGS[op].identity is not None)]
    with _kernel_lock:
        for op in _lowered_targets(ops):
            if op in _skip or op in _registered:
                continue
            library = _libraries_by_namespace.get(op.namespace)
            if library is None:
                library = _libraries_by_namespace[op.namespace] = torch.library.Library(op.namespace, "IMPL")  # noqa: TOR901
            kernel = _execute_list_writer if _writes_a_list(op) else execute
            library.impl(op, functools.partial(kernel, op), "PrivateUse1")
            _registered.add(op)


def _lowering_changed(op) -> None:
    """A lowering was added, replaced or removed after the device started: the plan
    caches forget what they knew of the op, and a newly lowered op gets its kernel."""
    _ops.lowering_changed(op)
    from torch_tpu.compiler.lowering import LOWERINGS

    if op in LOWERINGS and op not in _registered and "aten" in _libraries_by_namespace:
        _register_kernels([op])


_registered: set = set()  # overloads with an `execute` kernel of ours
_libraries_by_namespace: dict = {}  # namespace -> the IMPL library of our kernels there
_kernel_lock = threading.RLock()
