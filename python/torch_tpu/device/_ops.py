"""Single-op execution on the tpu device: every ATen op on tpu tensors is lowered
through the compiler's lowering table into a one-op StableHLO module
(`compiler/importer/single_op.py`), compiled once per signature through the compile
cache (a plan cache in front of it), and enqueued without waiting.

A plan is keyed by (overload, each tensor's dtype/sizes/strides/offset/storage size,
static arguments, precision mode). Python numbers passed as `Scalar` arguments (a
learning rate, `x * step`) are run-time operands of the module, not part of the key; an
op whose rule needs them as constants is planned again with them baked in.

Module arguments are whole storages (their buffers, in the storage's shape: `_buffers.py`);
the module takes a tensor that passes as is (`_storage.passes_as_is`) as the buffer itself,
reads any other view through the storage's flat order (`_stored.py`), and returns either
new storages (functional ops: each in its result's shape) or the new value of each written
storage, in the storage's shape (in-place and out= ops, which the runtime then *rebinds*:
every view of the storage sees the write; the written storages' old buffers are donated to
the op when nothing else can read them, `_donation_safe`). An op the table cannot lower
runs on CPU (`_fallback.py`)."""

from __future__ import annotations

import functools
import itertools
import math
import sys
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.utils._pytree as pytree

from torch_tpu.runtime.buffer import DeviceBuffer
from torch_tpu.runtime.errors import DeviceOutOfMemoryError, UnsupportedDtypeError

from ..program.precision import current_mode
from ._buffers import TABLE, StorageEntry, entry_of
from . import _fused  # (imports this module too: each reads the other's names at call time)
from . import _storage
from ._modes import EagerMode, check_alive, get_eager_mode
from ._modes import _global as _modes_global, _state as _modes_state
from ._storage import buffer_of, contiguous_stride



class Unlowerable(Exception):
    """The op cannot run through the lowering table (the CPU fallback runs it)."""


class ResizeOutputs(Exception):
    """An out= argument's size differs from the result's: PyTorch resizes it first
    (`at::native::resize_output`), then the op writes it. Carries {name: new size}."""

    def __init__(self, sizes: dict[str, tuple[int, ...]]):
        super().__init__(sizes)
        self.sizes = sizes


class OverlappingWrite(Unlowerable):
    """The op writes a view whose elements share memory (an expanded tensor): only the
    op's own CPU kernel knows whether it takes that (`fill_` does, `copy_`/`add_` raise),
    so it runs on CPU directly -- a decomposition (fill_ -> copy_) could decide otherwise."""


# -- argument description ---------------------------------------------------------------------
@dataclass(frozen=True)
class TensorArg:
    dtype: torch.dtype
    size: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int
    storage_dtype: torch.dtype
    storage_numel: int
    host: bool = False  # a 0-d CPU tensor (a run-time operand of its own)
    # PyTorch's lazy conjugation / negation bits (`x.conj()`, `x.conj().imag`): the storage
    # holds the plain values and the module applies the bit after reading the view.
    conj: bool = False
    neg: bool = False
    storage_shape: tuple[int, ...] | None = None  # the storage buffer's shape (None: flat)

    @property
    def stored_shape(self) -> tuple[int, ...]:
        """The shape of the storage's buffer, the module operand's shape."""
        return (self.storage_numel,) if self.storage_shape is None else self.storage_shape

    @property
    def as_is(self) -> bool:
        """Whether the tensor is its storage's buffer as it is (`_storage.layout_passes_as_is`)."""
        from ._storage import layout_passes_as_is

        return (not self.host and not self.conj and not self.neg
                and layout_passes_as_is(self.dtype, self.size, self.stride, self.offset, self.storage_dtype,
                                        self.stored_shape))


@dataclass(frozen=True)
class ScalarArg:
    kind: type  # float or int


@functools.lru_cache(maxsize=None)
def _scalar_names(op) -> frozenset[str]:
    """Arguments whose Python numbers are run-time operands: `Scalar`s, and `Tensor`s
    (a Python kernel receives the wrapped number of `x * 0.5` as the number)."""
    return frozenset(a.name for a in op._schema.arguments if _is_number_or_tensor(a.type))


def _is_number_or_tensor(kind) -> bool:
    # By type class, not by spelling: a `Scalar` argument prints as "number" (div_.Scalar's
    # `other`, addcdiv_'s `value`), and missing it baked every value into its own plan --
    # Adam's bias corrections made new plans and modules on every step. A `Scalar[]`
    # (the foreach ops' ScalarList: foreach Adam's per-parameter step sizes) likewise.
    if isinstance(kind, torch._C.OptionalType):
        kind = kind.getElementType()
    if isinstance(kind, torch._C.ListType) and isinstance(kind.getElementType(), torch._C.NumberType):
        return True
    return isinstance(kind, (torch._C.NumberType, torch._C.TensorType))


@functools.lru_cache(maxsize=None)
def _positional_names(op) -> tuple[str, ...]:
    return tuple(a.name for a in op._schema.arguments)


def describe(op, args, kwargs, index_box: list, bake: bool):
    """(signature, operands): the key-able description of the arguments (tensors and
    run-time scalars replaced by their descriptions) and the runtime operands in order."""
    names = _positional_names(op)
    scalars = frozenset() if bake else _scalar_names(op)
    written = _written(op)
    operands: list[Any] = []

    def leaf(value, top_name: str | None):
        if isinstance(value, torch.Tensor):
            if value.device.type == "tpu":
                conj, neg = value.is_conj(), value.is_neg()
                if (conj or neg) and top_name in written:
                    # Writing through a lazy bit stores the inverse of the value: the
                    # host path (PyTorch's CPU kernel on the host copy) applies it.
                    raise Unlowerable("it writes an argument with a lazy conjugation or negation bit")
                entry = entry_of(value)
                index = entry.device_index
                if index_box[0] is None:
                    index_box[0] = index
                elif index_box[0] != index:
                    raise _mismatch(f"tpu:{index_box[0]}", f"tpu:{index}")
                operands.append(entry)
                return TensorArg(value.dtype, tuple(value.shape), tuple(value.stride()), value.storage_offset(),
                                 entry.dtype, entry.numel, storage_shape=entry.shape, conj=conj, neg=neg)
            if value.dim() == 0 and value.device.type == "cpu":
                # A 0-d CPU tensor mixes with device tensors, as on CUDA: a run-time operand.
                operands.append(value)
                return TensorArg(value.dtype, (), (), 0, value.dtype, 1, True)
            raise _mismatch("tpu:0" if index_box[0] is None else f"tpu:{index_box[0]}", str(value.device))
        if isinstance(value, torch.device) and value.type == "tpu":
            # A factory's device: the plan's device index; the metadata runs on meta.
            if index_box[0] is None:
                index_box[0] = _storage.device_index(value)  # "tpu": the current device
            return torch.device("meta")
        if top_name in scalars and type(value) in (float, int):
            operands.append(value)
            return ScalarArg(type(value))
        if isinstance(value, (list, tuple)):
            # Elements of a written list are written; a Scalar[]'s numbers are operands.
            return tuple(leaf(v, top_name) for v in value)
        return value

    sig_args = tuple(leaf(a, names[i] if i < len(names) else None) for i, a in enumerate(args))
    sig_kwargs = tuple((k, leaf(v, k)) for k, v in kwargs.items())
    return (sig_args, sig_kwargs), operands


def _mismatch(a: str, b: str) -> RuntimeError:
    return RuntimeError(f"Expected all tensors to be on the same device, but found at least two devices, {a} and {b}!")


# -- plans --------------------------------------------------------------------------------------
@dataclass
class Plan:
    executable: Any
    # (size, stride, dtype, numel, row-major, buffer shape) per result (None: not a tensor);
    # empty for writes
    results: list
    multiple: bool  # the op returns a tuple
    written: list  # positions in `operands` of the written storages
    out_names: list
    returns_too: bool = False  # writes arguments and returns new tensors (results first)
    needs_rng: bool = False  # takes the device generator's next key last (_random.py)
    invoker: Any = None  # the shared `program.invoker.Invoker` that runs `executable` (FUSED traces)
    launch: Any = None  # the executable's launcher for the plan's own buffers (`run`'s hot path)
    module: Any = None  # the lowered module (a FUSED trace stitches it into its program)
    fingerprint: Any = None  # the compile cache's key of `module` (a FUSED trace's key holds it)
    n_results: int = 0  # result tensors (the first outputs; written storages follow)
    index: int = 0  # the device the plan runs on (part of its key)
    precision_sensitive: bool = True  # the module has matrix ops: its program depends on the mode
    # new_tensor's arguments after the buffer, for an op returning one new tensor and
    # writing nothing (`run`'s hot path); None otherwise.
    single: tuple | None = None
    # Schema positions of `out_names` and whether the op returns one value: an in-place or
    # out= op returns its written arguments (`_written_return`) without reading its schema.
    out_at: tuple = ()
    one_return: bool = True
    returns_nothing: bool = False  # an in-place foreach op (`_foreach_add_`) returns None

    def __post_init__(self) -> None:
        from ..program.invoker import Invoker

        self.invoker = Invoker(self.executable, self.executable.signature.args)
        # Every operand `run` passes is a live DeviceBuffer of the plan's device whose
        # shape and dtype the plan's key fixes: the launcher skips the invoker's argument
        # plan and the executable's per-argument checks (Executable.buffer_launcher).
        self.launch = self.executable.buffer_launcher()
        self.n_results = sum(layout is not None for layout in self.results)
        if not self.written and not self.multiple and self.results and self.results[0] is not None:
            size, stride, dtype, numel, contiguous, shape = self.results[0]
            self.single = (numel, size, stride, dtype, self.index, contiguous, shape)


_PLANS: dict = {}
FALLBACK = object()  # the signature runs on CPU
BAKE = object()  # the signature's rule needs its Python numbers as constants


def _meta(sig_leaf, numbers=None):
    """A meta stand-in for a signature leaf; `numbers` (an iterator) gives the value of
    each run-time number in turn (1 when None)."""
    if isinstance(sig_leaf, TensorArg) and sig_leaf.host:
        return torch.empty((), dtype=sig_leaf.dtype)
    if isinstance(sig_leaf, TensorArg):
        # A dtype view (`x.view(torch.int32)`) reads its storage's bytes as its own dtype's
        # elements (`_viewed_storage`): its sizes, strides and offset count those.
        numel = sig_leaf.storage_numel * sig_leaf.storage_dtype.itemsize // sig_leaf.dtype.itemsize
        base = torch.empty(numel, dtype=sig_leaf.dtype, device="meta")
        return base.as_strided(sig_leaf.size, sig_leaf.stride, sig_leaf.offset)
    if isinstance(sig_leaf, ScalarArg):
        return sig_leaf.kind(1 if numbers is None else next(numbers))
    if isinstance(sig_leaf, tuple):
        return [_meta(v, numbers) for v in sig_leaf]
    return sig_leaf


def _metadata_without_meta_kernel(target, meta_args, meta_kwargs):
    """The result metadata of an op without a meta kernel (`geqrf` in PyTorch 2.13), as
    torch.compile gets it: FakeTensorMode runs its CPU kernel on zero-filled stand-ins
    of the argument sizes. Returned as meta tensors of the same sizes and strides."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    def fake(x):
        if isinstance(x, torch.Tensor):
            return torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device="cpu")
        return x

    def meta(x):
        if isinstance(x, torch.Tensor):
            return torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device="meta")
        return x

    with FakeTensorMode():
        args, kwargs = pytree.tree_map(fake, (list(meta_args), dict(meta_kwargs)))
        result = target(*args, **kwargs)
    return pytree.tree_map(meta, result)


def _metadata(val) -> list:
    vals = list(val) if isinstance(val, (tuple, list)) else [val]
    return [(v.shape, v.dtype, v.stride()) if isinstance(v, torch.Tensor) else type(v) for v in vals]


def _numbers_shape_result(target, f_args, f_kwargs, val) -> bool:
    """Whether the run-time numbers decide the result's metadata (arange's `end`): the
    plan's metadata came from stand-ins, so such an op must bake its numbers in. Checked
    by running the meta kernel again with other, distinct stand-ins."""
    if not any(isinstance(leaf, ScalarArg) for leaf in pytree.tree_leaves((list(f_args), dict(f_kwargs)))):
        return False  # no run-time numbers: nothing to decide
    numbers = itertools.count(20, 7)  # as many as there are (a foreach op's Scalar[] has one per tensor)
    try:
        other = target(*[_meta(a, numbers) for a in f_args], **{k: _meta(v, numbers) for k, v in f_kwargs.items()})
    except Exception:  # noqa: BLE001 - the stand-ins are invalid for it: values matter
        return True
    return _metadata(other) != _metadata(val)


def _written(op) -> list[str]:
    from torch_tpu.compiler.importer.mutation import METADATA_INPLACE

    if op in METADATA_INPLACE:
        return []
    return [a.name for a in op._schema.arguments if a.alias_info is not None and a.alias_info.is_write]


def _check_out_sizes(op, sig_args, sig_kwargs, written, val) -> None:
    """Raises ResizeOutputs when an out= argument must be resized to hold the result."""
    names = _positional_names(op)
    bound = dict(zip(names, sig_args))
    bound.update(dict(sig_kwargs))
    vals = list(val) if isinstance(val, (tuple, list)) else [val]
    sizes = {}
    for name, result in zip(written, vals):
        arg = bound.get(name)
        if isinstance(arg, TensorArg) and isinstance(result, torch.Tensor) and arg.size != tuple(result.shape):
            sizes[name] = tuple(int(s) for s in result.shape)
    if sizes:
        raise ResizeOutputs(sizes)


def _resize_outputs(op, args, kwargs, sizes: dict[str, tuple[int, ...]]) -> None:
    """PyTorch's `resize_output`: an out= tensor of another size takes the result's size
    (with PyTorch's warning when it held elements), on the device."""
    import warnings

    bound = dict(zip(_positional_names(op), args))
    bound.update(kwargs)
    for name, size in sizes.items():
        out = bound[name]
        if out.numel() != 0:
            warnings.warn(
                f"An output with one or more elements was resized since it had shape {list(out.shape)}, which "
                f"does not match the required output shape {list(size)}. This behavior is deprecated, and in a "
                "future PyTorch release outputs will not be resized unless they have zero elements. You can "
                "explicitly reuse an out tensor t by resizing it, inplace, to zero elements with t.resize_(0).",
                UserWarning, stacklevel=4,
            )
        out.resize_(size)


# Options of a factory's functional form that its out= form takes from the out tensor.
_FACTORY_OPTIONS = ("dtype", "layout", "device", "pin_memory")


def _functional(op):
    from torch_tpu.compiler.importer.mutation import functional_counterpart

    return functional_counterpart(op) or _factory_counterpart(op)


@functools.lru_cache(maxsize=None)
def _factory_counterpart(op):
    """A factory's functional overload for its out= form (`arange.start_out` ->
    `arange.start_step`): the same arguments plus the factory options, which the out
    tensor decides (`_factory_options`). None for other ops."""
    from torch_tpu.compiler.importer.mutation import written_args

    written = _written(op)
    if not written or op._schema.name.endswith("_"):
        return None
    wanted = [(a.name, str(a.type)) for a in op._schema.arguments if a.name not in written]
    packet = getattr(torch.ops.aten, op._schema.name.split("::", 1)[-1], None)
    for candidate in (packet.overloads() if packet is not None else ()):
        other = getattr(packet, candidate)
        args = [(a.name, str(a.type)) for a in other._schema.arguments]
        extra = [a for a in other._schema.arguments[len(wanted):]]
        if args[: len(wanted)] == wanted and extra and not written_args(other) and all(
                a.name in _FACTORY_OPTIONS and a.kwarg_only for a in extra):
            return other
    return None


def _factory_options(op, target, sig_args, sig_kwargs, written) -> list:
    """What a factory's out= form computes in: the out tensor's dtype (on the plan's
    device, `meta` in signatures), as PyTorch's functional factories call the out= kernel
    on a tensor of those options."""
    if target is not _factory_counterpart(op):
        return []
    bound = dict(zip(_positional_names(op), sig_args))
    bound.update(dict(sig_kwargs))
    out = bound.get(written[0])
    return [("dtype", out.dtype), ("device", torch.device("meta"))] if isinstance(out, TensorArg) else []


def _with_schema_defaults(op, target, sig_args, sig_kwargs) -> tuple[tuple, tuple]:
    """(sig_args, sig_kwargs) with the op's defaults for the arguments not given that
    `target` (its functional form) takes at the same place: its form may require one the
    op defaults (`bernoulli_.float`'s p=0.5, required by `bernoulli.p`). Positional ones
    stay positional (rules take their arguments by position), kwarg-only ones by name."""
    given = {k for k, _ in sig_kwargs}
    theirs = target._schema.arguments
    args, kwargs = list(sig_args), list(sig_kwargs)
    for i, a in enumerate(op._schema.arguments):
        if i < len(sig_args) or a.name in given or not a.has_default_value() or a.default_value is None:
            continue
        if not a.kwarg_only and i == len(args) and i < len(theirs) and theirs[i].name == a.name:
            args.append(a.default_value)
        elif a.kwarg_only and any(t.name == a.name and t.kwarg_only for t in theirs):
            kwargs.append((a.name, a.default_value))
    return tuple(args), tuple(kwargs)


def _storage_view(arg: TensorArg):
    """`arg` as the compiler's description of a window of a flat storage (the device's
    storage IR is built by `compiler/lowering/storage_layout.py`, shared with the
    `as_strided` lowerings)."""
    from torch_tpu.compiler.lowering.storage_layout import StorageView

    return StorageView(arg.dtype, arg.size, arg.stride, arg.offset, arg.storage_dtype, arg.storage_numel)


def _apply_lazy_bits(value, arg: TensorArg):
    """The value PyTorch means by a view with a lazy negation / conjugation bit."""
    from torch_tpu.compiler.lowering.storage_layout import apply_lazy_bits

    return apply_lazy_bits(value, conj=arg.conj, neg=arg.neg)


def _read_view(storage, arg: TensorArg):
    """The value of a tensor described by `arg` from its flat storage value."""
    from torch_tpu.compiler.lowering.storage_layout import read_view

    return read_view(storage, _storage_view(arg))


def _write_into(storage, value, arg: TensorArg):
    """The storage after writing `value` into the view `arg` of it."""
    from torch_tpu.compiler.lowering.storage_layout import write_view

    return write_view(storage, value, _storage_view(arg))


def _as_storage(value, size, stride):
    """`value` laid out as the flat storage of a dense tensor with `stride`."""
    from torch_tpu.compiler.lowering.storage_layout import as_storage

    return as_storage(value, size, stride)


def _result_layout(val: torch.Tensor):
    from torch_tpu.compiler.lowering.storage_layout import dense_order

    size = tuple(int(s) for s in val.shape)
    stride = tuple(int(s) for s in val.stride())
    if dense_order(size, stride) is None or val.storage_offset() != 0:
        stride = contiguous_stride(size)
    return size, stride, val.dtype


def _build_plan(op, sig, operands, index: int, bake: bool) -> Plan:
    from torch_tpu.compiler.importer.single_op import lower_op, takes_rng_state
    from torch_tpu.compiler.lowering import LOWERINGS, LoweringError
    from torch_tpu.compiler.lowering.helpers import convert
    from torch_tpu.compiler.lowering.registry import METADATA_RULES, OpRecord, lowering_identity
    from torch_tpu.compiler.passes.set_precision import precision_dependent
    from torch_tpu.runtime import CompileSpec

    from ..program import Lowered, ProgramKey, compile_module, shared_context
    from ..program.pipelines import compile_pipeline
    from ._stored import read_stored, store_result, write_stored

    sig_args, sig_kwargs = sig
    written = _written(op)
    target = op
    names = _positional_names(op)
    returning_writer = None
    if written or op in _FUNCTIONAL_VARIANTS:
        returning_writer = _returning_writer(op, sig_args, sig_kwargs)
        if returning_writer is None and op in _FUNCTIONAL_VARIANTS:
            written = []  # batch norm normalizing with its running stats reads them only
    if returning_writer is not None:
        # Writes some arguments and returns new tensors (batch norm's running stats): its
        # functional variant returns the op's results, then the written arguments' values.
        target, written = returning_writer
    elif written and not (
        op._schema.name.endswith("_")
        or all(a.kwarg_only for a in op._schema.arguments if a.name in written)
    ):
        raise Unlowerable(f"{op} writes arguments and returns new tensors, and no lowered functional "
                          "variant applies to these arguments")
    elif written:
        target = _functional(op)
        if target is None or target not in LOWERINGS:
            raise Unlowerable(f"no lowered out-of-place form of {op}")
        sig_args, sig_kwargs = _with_schema_defaults(op, target, sig_args, sig_kwargs)
        sig_kwargs += tuple(_factory_options(op, target, sig_args, sig_kwargs, written))
    elif op not in LOWERINGS:
        raise Unlowerable(f"no lowering registered for {op}")
    is_out = bool(written) and returning_writer is None and not op._schema.name.endswith("_")
    # The functional op's arguments: out= arguments dropped.
    f_args = tuple(a for i, a in enumerate(sig_args) if not (is_out and i < len(names) and names[i] in written))
    f_kwargs = {k: v for k, v in sig_kwargs if not (is_out and k in written)}
    # The op's meta kernel, or the lowering's own rule where that kernel takes less.
    metadata_of = METADATA_RULES.get(target, target)
    try:
        meta_args, meta_kwargs = [_meta(a) for a in f_args], {k: _meta(v) for k, v in f_kwargs.items()}
        try:
            val = metadata_of(*meta_args, **meta_kwargs)
        except NotImplementedError:
            val = _metadata_without_meta_kernel(metadata_of, meta_args, meta_kwargs)
    except Unlowerable:
        raise
    except Exception as err:  # noqa: BLE001 - data-dependent or meta-less: CPU runs it
        raise Unlowerable(f"no metadata: {type(err).__name__}: {err}") from None
    if not bake and _numbers_shape_result(metadata_of, f_args, f_kwargs, val):
        raise Unlowerable("its result's metadata depends on the values of its numbers")
    if is_out:
        _check_out_sizes(op, sig_args, sig_kwargs, written, val)

    # Positions in `operands` of each tensor / scalar leaf, in describe()'s order.
    flat_sig: list = []

    def collect(x):
        if isinstance(x, (TensorArg, ScalarArg)):
            flat_sig.append(x)
        elif isinstance(x, tuple):
            for v in x:
                collect(v)

    for a in sig_args:
        collect(a)
    for _, v in sig_kwargs:
        collect(v)
    operand_types = []
    for leaf in flat_sig:
        if isinstance(leaf, TensorArg):
            operand_types.append(((), leaf.dtype) if leaf.host else (leaf.stored_shape, leaf.storage_dtype))
        else:
            operand_types.append(((), torch.float64 if leaf.kind is float else torch.int64))
    # The written arguments' leaves (top-level tensors).
    write_positions: list[int] = []
    write_args: list[TensorArg] = []
    pos = 0
    by_name: dict[str, range] = {}  # an argument's leaves: one tensor, or a list's (`_foreach_add_`)
    for i, a in enumerate(sig_args):
        if isinstance(a, (TensorArg, ScalarArg, tuple)) and i < len(names):
            by_name[names[i]] = range(pos, pos + _count(a))
        pos += _count(a)
    for k, v in sig_kwargs:
        if isinstance(v, (TensorArg, ScalarArg, tuple)):
            by_name[k] = range(pos, pos + _count(v))
        pos += _count(v)
    written_leaves = [(name, leaf) for name in written for leaf in by_name.get(name, [None])]
    writes_a_list = len(written_leaves) > len(written)
    for name, position in written_leaves:
        if position is None or not isinstance(flat_sig[position], TensorArg):
            raise Unlowerable(f"written argument {name} is not a tpu tensor")
        write_positions.append(position)
        write_args.append(flat_sig[position])
        if returning_writer is None and torch._debug_has_internal_overlap(_meta(flat_sig[position])) == 1:
            # An in-place or out= write into a view whose elements share memory (an
            # expanded tensor): most PyTorch kernels refuse it (the value would depend on
            # the order of the writes), a few take it (`fill_`). The CPU kernel decides, on
            # the host copy -- never a silent last-writer-wins value from a lowering.
            raise OverlappingWrite("it writes a view whose elements share memory (PyTorch's kernel decides)")

    def read(block_args):
        it = iter(range(len(flat_sig)))

        def rebuild(x):
            if isinstance(x, TensorArg):
                k = next(it)
                return block_args[k] if x.host else _apply_lazy_bits(read_stored(block_args[k], x), x)
            if isinstance(x, ScalarArg):
                return block_args[next(it)]
            if isinstance(x, tuple):
                return [rebuild(v) for v in x]
            return x

        all_args = [rebuild(a) for a in sig_args]
        all_kwargs = {k: rebuild(v) for k, v in sig_kwargs}
        args = [a for i, a in enumerate(all_args) if not (is_out and i < len(names) and names[i] in written)]
        kwargs = {k: v for k, v in all_kwargs.items() if not (is_out and k in written)}
        return tuple(args), kwargs

    vals = list(val) if isinstance(val, (tuple, list)) else [val]
    n_returned = len(op._schema.returns) if returning_writer is not None else len(vals)
    layouts = [_result_layout(v) if isinstance(v, torch.Tensor) else None for v in vals[:n_returned]]

    def write(result, block_args):
        values = list(result) if isinstance(result, (tuple, list)) else [result]
        if returning_writer is not None:
            outs = []
            for value, layout in zip(values, layouts):
                if layout is not None:
                    size, stride, dtype = layout
                    outs.append(store_result(convert(value, dtype), size, stride))
            for k, (position, arg) in enumerate(zip(write_positions, write_args)):
                outs.append(write_stored(block_args[position], values[n_returned + k], arg))
            return outs
        if written:
            outs = []
            for k, (position, arg) in enumerate(zip(write_positions, write_args)):
                source = values[k if is_out or writes_a_list else 0]
                outs.append(write_stored(block_args[position], source, arg))
            return outs
        outs = []
        for value, layout in zip(values, layouts):
            if layout is None:
                continue
            size, stride, dtype = layout
            outs.append(store_result(convert(value, dtype), size, stride))
        return outs

    record = OpRecord(target, tuple(meta_args), meta_kwargs, val, str(op))
    built = []  # set once the module is built: a later failure is XLA's

    def build() -> Lowered:
        try:
            module = lower_op(record, operand_types, read, write, context=shared_context())
        except LoweringError as err:
            raise Unlowerable(str(err)) from None
        built.append(True)
        return Lowered(module, takes_rng_state(module, len(operand_types)))

    def rejected(engine) -> Exception:
        return Unlowerable(f"the pass pipeline rejected the module: {engine.format()}")

    mode = current_mode()
    identity = lowering_identity(record)  # a jax_op's StableHLO: not in the compiler's code
    try:
        # The written storages are donated: XLA writes the new value over the old buffer
        # (`x.add_(1)` in a loop allocates nothing); `run` passes a copy where the old
        # buffer is still referenced elsewhere (`_donation_safe`).
        program = compile_module(
            # (The leaf kinds as in `_PLANS`' key: `1`, `1.0` and `True` baked into a
            # signature compare equal, yet make programs of different result dtypes.)
            build, key=ProgramKey("eager_op", (str(op), sig, _leaf_kinds(sig), bake, identity), mode),
            name=str(op),
            pipeline=compile_pipeline(mode), rejected=rejected,
            options=CompileSpec(device_indices=(index,), donate_argnums=tuple(write_positions)),
        )
    except (Unlowerable, DeviceOutOfMemoryError, UnsupportedDtypeError):
        # Not the op's fault but the device's (its memory, an element type the chip lacks):
        # running it on the CPU would hide that, or allocate the same bytes on the host.
        raise
    except Exception as err:  # noqa: BLE001 - XLA rejected the module: the CPU runs the op
        if not built:
            raise  # building it failed: not XLA's rejection
        raise Unlowerable(f"XLA rejected the module: {err}") from None
    module, needs_rng, executable, fingerprint = program.module, program.lowered, program.executable, \
        program.key.fingerprint()
    with module.context:
        precision_sensitive = precision_dependent(module.operation)
    # (sizes, strides, dtype, storage numel, row-major, buffer shape) of each result tensor,
    # ready for new_tensor.
    results = [] if written and returning_writer is None else [
        None if layout is None else (list(layout[0]), list(layout[1]), layout[2], math.prod(layout[0]),
                                     tuple(layout[1]) == contiguous_stride(layout[0]),
                                     _storage.stored_shape(layout[0], layout[1]))
        for layout in layouts
    ]
    multiple = len(op._schema.returns) > 1 if returning_writer is not None else isinstance(val, (tuple, list))
    return Plan(executable, results, multiple, write_positions, written, returning_writer is not None,
                needs_rng, module=module, fingerprint=fingerprint, index=index,
                precision_sensitive=precision_sensitive, out_at=tuple(names.index(n) for n in written),
                one_return=len(op._schema.returns) == 1, returns_nothing=not op._schema.returns)


# Functional variants PyTorch does not name `<op>_functional`. native_batch_norm's schema
# does not even mark the running stats it writes in training mode.
_FUNCTIONAL_VARIANTS = {
    torch.ops.aten.native_batch_norm.default: torch.ops.aten._native_batch_norm_legit_functional.default,
    torch.ops.aten._native_batch_norm_legit.default: torch.ops.aten._native_batch_norm_legit_functional.default,
}


def _returning_writer(op, sig_args, sig_kwargs):
    """(functional variant, written argument names) of an op that writes some arguments
    and returns new tensors, or None. The variant takes the same arguments and returns
    the op's results followed by the new value of each written argument (PyTorch's
    functionalization convention: `<op>_functional`)."""
    from torch_tpu.compiler.lowering import LOWERINGS

    names = _positional_names(op)
    bound = dict(zip(names, sig_args))
    bound.update(dict(sig_kwargs))
    if op in _FUNCTIONAL_VARIANTS:
        # Batch norm writes its running stats only when training with them (in eval mode
        # its CPU kernel returns empty save_mean/save_invstd, which its meta kernel does
        # not: the op keeps its own path there).
        if not (bound.get("training") and isinstance(bound.get("running_mean"), TensorArg)
                and isinstance(bound.get("running_var"), TensorArg)):
            return None
        written = ["running_mean", "running_var"]
    else:
        written = _written(op)
        if op._schema.name.endswith("_") or all(
                a.kwarg_only for a in op._schema.arguments if a.name in written):
            return None  # in-place / out= forms: their own path
    variant = _FUNCTIONAL_VARIANTS.get(op)
    if variant is None:
        packet = getattr(torch.ops.aten, op._schema.name.split("::", 1)[1] + "_functional", None)
        variant = getattr(packet, op._overloadname, None) if packet is not None else None
    if variant is None or variant not in LOWERINGS:
        return None
    if [a.name for a in variant._schema.arguments] != list(names) or \
            len(variant._schema.returns) != len(op._schema.returns) + len(written):
        return None
    return variant, written


def _count(x) -> int:
    if isinstance(x, (TensorArg, ScalarArg)):
        return 1
    if isinstance(x, tuple):
        return sum(_count(v) for v in x)
    return 0


class _DeferredOperand(Exception):
    """An operand of a Strict-mode op is the pending result of a deferred compiled training
    step (`_fused.deferring`): `run` records the op on that trace instead of flushing it."""


def _operand_buffer(value, index: int):
    if type(value) is StorageEntry:
        pending = value._buffer
        if (pending.__class__ is _fused.Pending and pending.trace.strict_graphs and not pending.trace.flushed
                and not pending.trace.ended and get_eager_mode() is EagerMode.STRICT):
            raise _DeferredOperand
        buffer = value.buffer
        if buffer is None:
            return buffer_of(value)
        if buffer.is_deleted:
            check_alive(value, name_line=False)  # raises; the op's error names the line
        return buffer
    if isinstance(value, torch.Tensor):  # a 0-d CPU tensor
        return _storage.client().to_device(value.detach().reshape(()).clone(), index, copy=True)
    return _scalar_buffer(value, index)


# Device buffers of recent Python numbers: a learning rate or `x * 0.5` is uploaded once,
# not on every op (a host -> device transfer is the costliest part of a small op). The
# buffers are only read (never written storages, so never donated). Floats are keyed by
# their bits: 0.0 and -0.0 are equal keys in a dict but different operands.
_SCALARS: dict = {}
_SCALARS_MAX = 1024


def _scalar_buffer(value, index: int):
    key = (value.hex() if type(value) is float else value, type(value), index)
    buffer = _SCALARS.get(key)
    if buffer is None:
        if len(_SCALARS) >= _SCALARS_MAX:
            _SCALARS.clear()  # values that never repeat (`x * step`): keep the cache small
        dtype = np.float64 if isinstance(value, float) else np.int64
        buffer = _SCALARS[key] = _storage.client().to_device(np.asarray(value, dtype=dtype), index, copy=True)
    return buffer


# References to the DeviceBuffer of a written storage when nothing but the op reads it:
# its storage entry, the op's list of operand buffers, `_donation_safe`'s parameter and
# `sys.getrefcount`'s argument (CPython's counts; test_device_donation checks both sides).
_SOLE_REFERENCES = 4


def _donation_safe(buffer) -> bool:
    """Whether a written storage's buffer may be donated to the op (its memory reused
    for the new value): only when nothing else can read the old value -- no other
    reference to the DeviceBuffer (another storage or operand of this op, a compiled
    graph's argument list, a caller holding it; the runtime wraps each array in one
    DeviceBuffer) and no host view of its memory (`to_torch` / `to_numpy` export it).
    Programs already enqueued that read the buffer are ordered before the donating one
    by PjRT (the buffer's usage events)."""
    return sys.getrefcount(buffer) <= _SOLE_REFERENCES + hook_references() and not buffer._exported


def hook_references() -> int:
    """References a frame-evaluation hook adds to each call's arguments: 0 normally, 1 while
    Dynamo's hook stays installed (seen after a compiled call that raised). Measured on a
    probe held as an unshared buffer is held when it is counted -- a local and a list, then
    a parameter -- so the donation checks count only real holders."""
    probe = object()
    holder = [probe]
    return _references(holder[0]) - _SOLE_REFERENCES


def _references(value) -> int:
    return sys.getrefcount(value)


# The hot path: a signature built from what PyTorch hands the kernel, without dataclasses
# or recursion, mapped straight to the plan `plan_for` made for it. It is at least as fine
# as `describe`'s (every field of a TensorArg, the type of each number), so two calls with
# the same fast signature have the same plan. Arguments it does not cover (tensor lists,
# 0-d CPU tensors, devices, conjugate views) take `plan_for`; so do signatures whose plan
# bakes Python numbers in (one plan per value).
_FAST: dict = {}
_NUMBERS = (int, float, bool)
_TENSOR = torch.Tensor  # (a module constant: `torch.Tensor` is two lookups per argument)
_HASHABLE = (type(None), bool, int, float, str, torch.dtype, torch.memory_format, torch.layout)


@functools.lru_cache(maxsize=None)
def _names_and_scalars(op) -> tuple[tuple[str, ...], frozenset[str]]:
    return _positional_names(op), _scalar_names(op)


# id(op) -> (op, argument names, run-time scalar names). Keys hold id(op), not op: an
# OpOverload hashes in Python (~0.4 us, twice per op: this table and `_FAST`). The entry
# holds the op itself, so its id is never reused for another object.
_OP_NAMES: dict[int, tuple] = {}


def _fast_entry(t, entries):
    """The storage entry of tpu tensor `t` as the hot path reads it, or None (not a tpu
    storage -- only those are in the table; `is_cpu` rules out a CPU tensor at a
    coincident address -- or a conjugate or negative view, which `describe` handles)."""
    entry = entries.get(t.untyped_storage().data_ptr())
    if entry is None or t.is_cpu or t.is_conj() or t.is_neg():
        return None
    return entry


def _fast_layout(t, entry) -> tuple:
    return entry.dtype, entry.shape, t.dtype, t.shape, t.stride(), t.storage_offset()


def _fast_signature(op, args, kwargs):
    """(key, operands, device index) for the plan cache's hot path, or None when an
    argument needs the full description (`describe`). The key holds no precision mode:
    `_FAST` keys by it only the plans whose module depends on it (`_remember`)."""
    op_id = id(op)
    known = _OP_NAMES.get(op_id)
    if known is None:
        known = _OP_NAMES[op_id] = (op, *_names_and_scalars(op))
    _, names, scalars = known
    entries = TABLE._entries
    key: list = [op_id]
    operands: list = []
    index = None
    n = len(names)
    if kwargs:
        if len(args) > n:
            return None
        key.append(tuple(kwargs))  # which arguments came by name
        names = (*names[: len(args)], *kwargs)
        args = (*args, *kwargs.values())
        n = len(names)
    position = 0
    for value in args:
        kind = type(value)
        if kind is _TENSOR or isinstance(value, _TENSOR):
            entry = _fast_entry(value, entries)
            if entry is None:
                return None
            if index is None:
                index = entry.device_index
            elif index != entry.device_index:
                return None
            operands.append(entry)
            key.append(_fast_layout(value, entry))
        elif (kind is float or kind is int) and position < n and names[position] in scalars:
            operands.append(value)
            key.append(kind)
        elif kind in _HASHABLE:
            key.append((kind, value))
        elif kind is list or kind is tuple:
            if value and isinstance(value[0], _TENSOR):
                # A Tensor[] (`cat`'s inputs, a foreach op's lists): each element as a tensor
                # argument above, in order (`describe`'s operands are in the same order).
                layouts = []
                for t in value:
                    entry = _fast_entry(t, entries) if isinstance(t, _TENSOR) else None
                    if entry is None or (index is not None and index != entry.device_index):
                        return None
                    index = entry.device_index
                    operands.append(entry)
                    layouts.append(_fast_layout(t, entry))
                key.append(tuple(layouts))
            elif position < n and names[position] in scalars:
                # A Scalar[] of run-time operands (foreach Adam's per-parameter step sizes).
                kinds = tuple(map(type, value))
                if not all(k is float or k is int for k in kinds):
                    return None
                operands.extend(value)
                key.append(("numbers", kinds))
            elif all(type(v) in _NUMBERS for v in value):
                key.append((tuple(value), tuple(map(type, value))))
            else:
                return None
        else:
            return None
        position += 1
    if index is None:
        return None
    key.append(index)
    return tuple(key), operands, index


def _leaf_kinds(value):
    """The types of a signature's leaves, part of the plan key: Python numbers that stay
    in the signature (baked ones, list elements) compare equal across types -- `2`, `2.0`
    and `True` -- yet give different results (`torch.full((2,), 2)` is int64, with `2.0`
    float32). -0.0 has a kind of its own: it equals 0.0 and hashes alike, yet
    `fill_(-0.0)` must not run the program baked with 0.0."""
    if value.__class__ is tuple:
        return tuple(_leaf_kinds(v) for v in value)
    if value.__class__ is float and value == 0.0 and math.copysign(1.0, value) < 0:
        return _NEGATIVE_ZERO
    return value.__class__


_NEGATIVE_ZERO = (float, "-0.0")


def plan_for(op, args, kwargs):
    """(plan, operands, device index) of the op, planning it on first use; raises
    `Unlowerable` when it must run elsewhere."""
    plan, operands, index, _ = _plan_for(op, args, kwargs)
    return plan, operands, index


def _plan_for(op, args, kwargs):
    """plan_for, and whether the plan holds for every value of the Python numbers: True,
    BAKE (for these values only: their plan's operands leave the numbers out) or False
    (for neither: the op resized its out= arguments first)."""
    index_box: list = [None]
    sig, operands = describe(op, args, kwargs, index_box, False)
    index = index_box[0] if index_box[0] is not None else 0
    mode = current_mode()
    key = (op, sig, _leaf_kinds(sig), mode, index)
    plan = _PLANS.get(key)
    baked = plan is BAKE
    if baked:
        # This signature's rule needs its Python numbers as constants: one plan per value.
        sig, operands = describe(op, args, kwargs, [None], True)
        key = (op, sig, _leaf_kinds(sig), mode, index)
        plan = _PLANS.get(key)
    if plan is None:
        try:
            plan = _build_plan(op, sig, operands, index, baked)
        except OverlappingWrite:
            raise  # not remembered as FALLBACK: that would lose the reason (the CPU kernel decides)
        except ResizeOutputs as resize:
            # Not remembered: the signature holds the out= sizes before the resize. The
            # caller must not remember the plan under that signature either.
            _resize_outputs(op, args, kwargs, resize.sizes)
            plan, operands, index, _ = _plan_for(op, args, kwargs)
            return plan, operands, index, False
        except Unlowerable:
            if baked or not any(isinstance(v, (int, float)) and not isinstance(v, bool) for v in operands):
                _PLANS[key] = FALLBACK
                raise
            # Retry with the numbers as constants (a rule that branches on their value,
            # or whose result dtype differs with a 0-d operand).
            _PLANS[key] = BAKE
            return _plan_for(op, args, kwargs)
        _PLANS[key] = plan
    elif plan is FALLBACK:
        raise Unlowerable(f"{op} runs on CPU")
    return plan, operands, index, BAKE if baked else True


def lowering_changed(changed) -> None:
    """The lowering table's entry for `changed` was added, replaced or removed (a
    `torch_tpu.register_lowering`, a jax_op's first trace): the plans that went through
    it and every "runs on CPU" answer are dropped, so the op's next call plans again
    with the table as it is now. (Subscribed to `LOWERINGS` by `_registration`.)"""
    for key, plan in list(_PLANS.items()):
        if plan is FALLBACK or changed in _plan_targets(key[0]):
            _PLANS.pop(key, None)
    for key in list(_FAST):
        known = _OP_NAMES.get(key[0])
        if known is not None and changed in _plan_targets(known[0]):
            _FAST.pop(key, None)


@functools.lru_cache(maxsize=None)
def _plan_targets(op) -> frozenset:
    """The overloads whose lowering a plan of `op` may use: itself, its out-of-place form
    (in-place and out= ops) and its functional variant (ops that write and return)."""
    targets = {op, _FUNCTIONAL_VARIANTS.get(op)}
    if isinstance(op, torch._ops.OpOverload):
        targets.add(_functional(op))
        packet = getattr(torch.ops.aten, op._schema.name.split("::", 1)[1] + "_functional", None)
        if packet is not None:
            targets.add(getattr(packet, op._overloadname, None))
    return frozenset(targets - {None})


def _remember(key, plan) -> None:
    """Files `plan` under its fast signature. A plan whose module has matrix ops depends
    on the precision mode (`torch.set_float32_matmul_precision`, `torch_tpu.precision`):
    it is filed in a dict by mode, read under the mode in force at each call; every other
    plan serves every mode, so most ops never read the mode."""
    if plan.precision_sensitive:
        by_mode = _FAST.get(key)
        if by_mode.__class__ is not dict:
            by_mode = _FAST[key] = {}
        by_mode[current_mode()] = plan
    else:
        _FAST[key] = plan


def _baked_numbers(operands) -> tuple | None:
    """The Python numbers among a fast signature's operands, as a key (with their types:
    `2 == 2.0`), or None when one is NaN (no key finds it again)."""
    numbers = tuple([(_leaf_kinds(v), v) for v in operands if v.__class__ is float or v.__class__ is int])
    return None if any(v != v for _, v in numbers) else numbers


def _baked_plan(fast):
    """(plan, operands) of a fast signature whose rule needs its numbers as constants
    (`_FAST` holds BAKE for it): the plan made for these values, its operands the
    signature's without the numbers (`describe(bake=True)`'s); (None, None) when none
    was made for them yet. Such ops (`fill_.Scalar`: 16 of a step of bench/tpu.py case 7)
    took `describe` and the plan key of the full description on every call."""
    numbers = _baked_numbers(fast[1])
    if numbers is None:
        return None, None
    plan = _FAST.get((*fast[0], ("baked", numbers)))
    if plan.__class__ is dict:
        plan = plan.get(current_mode())
    if plan is None:
        return None, None
    return plan, [v for v in fast[1] if v.__class__ is not float and v.__class__ is not int]


def _remember_baked(fast, plan) -> None:
    """Files a plan made for the values of its numbers (`_baked_plan` finds it): BAKE under
    the fast signature, the plan under the signature and the values. The key keeps the op's
    id first (`lowering_changed` drops both with the op's plans)."""
    numbers = _baked_numbers(fast[1])
    if numbers is None:
        return
    _FAST[fast[0]] = BAKE
    _remember((*fast[0], ("baked", numbers)), plan)


# Launches retried when PjRT refused a buffer that another thread's in-place op had
# donated and rebound between this op's read of the storage and its launch.
_REBOUND_RETRIES = 20


_UNSET = object()


def run(op, args, kwargs, _retry=0, fast=_UNSET):
    """Runs `op` on tpu tensors through its plan; returns what PyTorch's op returns.
    `fast`: the arguments' `_fast_signature`, when the caller made it already."""
    if fast is _UNSET:
        fast = _fast_signature(op, args, kwargs)
    plan = None
    if fast is not None:
        plan = _FAST.get(fast[0])
        if plan.__class__ is dict:
            plan = plan.get(current_mode())
        if plan is BAKE:
            plan, operands = _baked_plan(fast)
        else:
            operands = fast[1]
    if plan is not None:
        index = fast[2]
    else:
        plan, operands, index, reusable = _plan_for(op, args, kwargs)
        if fast is not None:
            if reusable is True:
                _remember(fast[0], plan)
            elif reusable is BAKE:
                _remember_baked(fast, plan)
    mode = _modes_state.mode or _modes_global[0] or get_eager_mode()  # (no call once the mode is set)
    outs = None
    try:
        if mode is EagerMode.FUSED:
            # Recorded, not run: the results are pending values of the trace.
            return _fused.record(op, args, kwargs, plan, operands, index)
        # A storage's buffer as it is (the common case), a Python number's cached buffer,
        # else `_operand_buffer` (a 0-d CPU tensor, a storage never written, a FUSED value). A deleted buffer is
        # not looked for here: PjRT refuses it, and `_deleted_operand` names it.
        buffers = [
            v._buffer if v.__class__ is StorageEntry and v._buffer.__class__ is DeviceBuffer
            else _scalar_buffer(v, index) if v.__class__ is float or v.__class__ is int
            else _operand_buffer(v, index)
            for v in operands
        ]
        for position in plan.written:
            if not _donation_safe(buffers[position]):
                buffers[position] = buffers[position].copy()
        if plan.needs_rng:
            from ._random import key_buffer

            buffers.append(key_buffer(index))
        outs = plan.launch(buffers)
        if mode is EagerMode.DEBUG:
            for out in outs:
                out.synchronize()
    except _DeferredOperand:
        # It reads a result of a compiled training step deferred in Strict mode (the
        # backward's gradient seed, a gradient accumulated or clipped): it joins the step's
        # trace, so the step stays one program; only a read of a value runs it.
        return _fused.record(op, args, kwargs, plan, operands, index)
    except RuntimeError as err:
        from ._errors import is_runtime_error, op_failed

        if not is_runtime_error(err):
            raise
        if outs is None and _retry < _REBOUND_RETRIES and _refused_deleted(err):
            # Another thread's in-place op may have donated a storage's buffer between this
            # op's read and its launch, and rebinds the storage right after: read again (as
            # on CPU, this op then sees one of the two values, never an error). A storage
            # that stays deleted fails every try and is named below.
            time.sleep(0)
            return run(op, args, kwargs, _retry + 1)
        # A deleted operand explains a refused launch only: once launched, the written
        # storages' old buffers are the program's (donated), and a failure seen while
        # waiting (Debug mode) is the program's own error.
        deleted = _deleted_operand(operands) if outs is None else None
        raise op_failed(op, args, kwargs, deleted or err) from err
    layout = plan.single
    if layout is not None:
        # One new tensor, nothing written (most ops): straight to the storage constructor.
        return _storage.new_tensor(outs[0], *layout)
    return bind_results(op, args, kwargs, plan, operands, index, outs)


def _refused_deleted(err) -> bool:
    """Whether PjRT refused the launch for a deleted (freed or donated) buffer."""
    return "deleted or donated" in str(err)


def _deleted_operand(operands):
    """The error for an operand storage whose buffer was deleted (freed or donated), or
    None: PjRT's own refusal of it names neither the tensor nor what to do."""
    from torch_tpu.runtime.errors import BufferDeletedError

    for value in operands:
        if value.__class__ is StorageEntry:
            try:
                check_alive(value, name_line=False)
            except BufferDeletedError as err:
                return err
    return None


def bind_results(op, args, kwargs, plan, operands, index, outs):
    """What the op returns, its written storages rebound: `outs` are the plan's results
    (DeviceBuffers, or a FUSED trace's pending values), new storages first."""
    n_results = plan.n_results
    if plan.written:
        for position, buffer in zip(plan.written, outs[n_results:]):
            operands[position].buffer = buffer
        if not plan.returns_too:
            return _written_return(op, args, kwargs, plan)
    if not plan.multiple:
        layout = plan.results[0]
        if layout is None:
            return None
        size, stride, dtype, numel, contiguous, shape = layout
        return _storage.new_tensor(outs[0], numel, size, stride, dtype, index, contiguous, shape)
    buffers = iter(outs[:n_results])
    results = [
        None if layout is None else _storage.new_tensor(next(buffers), layout[3], *layout[:3], index, layout[4],
                                                        layout[5])
        for layout in plan.results
    ]
    return tuple(results)


def _written_return(op, args, kwargs, plan):
    """An in-place / out= op returns its written arguments (each passed by position or
    by name)."""
    if plan.returns_nothing:
        return None
    n = len(args)
    outs = [args[i] if i < n else kwargs[name] for i, name in zip(plan.out_at, plan.out_names)]
    return outs[0] if plan.one_return else tuple(outs)
