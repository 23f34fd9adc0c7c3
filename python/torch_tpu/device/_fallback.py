"""Ops the lowering table cannot run on the device run on CPU: tpu arguments are copied
to the host (views keep their sizes, strides and aliasing within one storage), the op
runs in PyTorch's CPU kernel, written arguments are copied back into their device
storages and results are moved to the device. Logged once per op;
`TORCH_TPU_STRICT=1` makes it an error naming the op and the user's Python line."""

from __future__ import annotations

import logging

import torch
import torch.utils._pytree as pytree

from torch_tpu.core import config
from torch_tpu.core.user_frames import innermost_user_frame

from . import _storage

log = logging.getLogger("torch_tpu")
_reported: set[str] = set()


def user_line() -> str:
    """`file:line` of the innermost user frame (`core/user_frames.py`): the user's line."""
    frame = innermost_user_frame()
    return f"{frame[0]}:{frame[1]}" if frame is not None else "<unknown>"


# Ops whose result shape depends on their values: they wait for the value and run on
# the host by design (exact shapes), so they are not fallbacks TORCH_TPU_STRICT forbids.
DATA_DEPENDENT = frozenset({
    "nonzero", "masked_select", "unique", "_unique", "_unique2", "unique_consecutive", "unique_dim",
    "index", "index_put", "index_put_", "_index_put_impl_", "argwhere", "masked_scatter", "masked_scatter_",
    "bincount", "histc", "repeat_interleave",
})


def is_data_dependent(op, args=()) -> bool:
    name = op._schema.name.split("::", 1)[-1]
    if name in ("index", "index_put", "index_put_", "_index_put_impl_"):
        # Only boolean masks make indexing data-dependent.
        indices = args[1] if len(args) > 1 else ()
        return any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in indices or ())
    return name in DATA_DEPENDENT


def report(op, reason: str, args=()) -> None:
    name = str(op)
    if is_data_dependent(op, args):
        log.debug("torch_tpu: %s has a data-dependent result shape: it runs on the host", name)
        return
    if config.get("TORCH_TPU_STRICT"):
        raise RuntimeError(
            f"torch_tpu: {name} at {user_line()} has no device implementation ({reason}); "
            "TORCH_TPU_STRICT=1 forbids running it on CPU — unset it to run the op on CPU, "
            "or report the op to torch_tpu"
        )
    if name not in _reported:
        _reported.add(name)
        log.warning("torch_tpu: %s runs on CPU on the tpu device (%s); logged once per op", name, reason)


def run_on_cpu(op, args, kwargs, reason: str):
    report(op, reason, args)
    index = None
    host_of: dict[int, torch.Tensor] = {}

    def to_cpu(x):
        nonlocal index
        if isinstance(x, torch.Tensor) and x.device.type == "tpu":
            if index is None:
                index = x.device.index or 0
            # One host copy per storage keeps aliasing between views of it.
            key = x.untyped_storage().data_ptr()
            if key not in host_of:
                entry = _storage.entry_of(x)
                host_of[key] = _storage.storage_to_host(entry)
            flat = host_of[key]
            if x.dtype != flat.dtype:
                flat = _storage.bytes_as(flat, x.dtype)
            view = flat.as_strided(x.shape, x.stride(), x.storage_offset())
            if x.is_conj():
                view = view.conj()
            if x.is_neg():
                view = torch._neg_view(view)
            return view
        if isinstance(x, torch.device) and x.type == "tpu":
            if index is None:
                index = _storage.device_index(x)  # "tpu": the current device
            return torch.device("cpu")
        return x

    cpu_args, cpu_kwargs = pytree.tree_map(to_cpu, _numbers_as_tensors(op, args, kwargs))
    result = op(*cpu_args, **cpu_kwargs)
    index = 0 if index is None else index
    # Written arguments: their host storages changed; write them back.
    schema = op._schema
    written = [a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write]
    names = [a.name for a in schema.arguments]
    bound = dict(zip(names, args))
    bound.update(kwargs)
    cpu_bound = dict(zip(names, cpu_args))
    cpu_bound.update(cpu_kwargs)
    rebound = set()
    for name in written:
        # A written argument is a tensor or (`Tensor(a!)[]`: `_foreach_*_`, `_fused_adam_`) a
        # list of them, each written in place.
        t, cpu_t = bound.get(name), cpu_bound.get(name)
        pairs = zip(t, cpu_t) if isinstance(t, (list, tuple)) else [(t, cpu_t)]
        for t, cpu_t in pairs:
            if not isinstance(t, torch.Tensor) or t.device.type != "tpu":
                continue
            key = t.untyped_storage().data_ptr()
            if key in rebound:
                continue
            rebound.add(key)
            entry = _storage.entry_of(t)
            host = host_of[key]
            if cpu_t.untyped_storage().data_ptr() != host.untyped_storage().data_ptr() or cpu_t.shape != t.shape:
                # The CPU kernel resized the output: give the tpu tensor the new storage.
                _resize_to(t, cpu_t)
                continue
            entry.buffer = _storage.upload(host, entry.device_index, shape=entry.shape)  # the storage keeps its shape
    def to_tpu(x):
        if isinstance(x, torch.Tensor) and x.device.type == "cpu":
            return _storage.from_host(x, index)
        return x

    # A return that aliases a written argument is that (tpu) argument; others move over.
    by_alias = {
        frozenset(a.alias_info.before_set): bound[a.name]
        for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write and a.name in bound
    }
    if not schema.returns:  # (an in-place op on lists: `_fused_adamw_(...) -> ()`)
        return None
    results = result if len(schema.returns) > 1 else (result,)
    outs = []
    for ret, value in zip(schema.returns, results):
        alias = ret.alias_info
        if alias is not None and frozenset(alias.before_set) in by_alias:
            outs.append(by_alias[frozenset(alias.before_set)])
        else:
            outs.append(pytree.tree_map(to_tpu, value))
    return tuple(outs) if len(schema.returns) > 1 else outs[0]


def _numbers_as_tensors(op, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """The arguments with each Python number in a `Tensor` slot made a 0-dim CPU tensor.
    PyTorch hands a Python kernel the wrapped number of `x >> 2` (a Scalar overload's
    argument, wrapped by its composite kernel) as the number, and calling the op with it
    fails ("Expected a value of type 'Tensor'") outside the few ops PyTorch's argument
    parser lets take numbers. The tensor's dtype is the one type promotion gives the
    number beside the op's first dimensioned tensor, so the result's dtype is unchanged."""
    numbers = {a.name for a in op._schema.arguments if _takes_tensor(a.type)}
    if not numbers:
        return args, kwargs
    tensors = [x for x in pytree.tree_leaves((args, kwargs)) if isinstance(x, torch.Tensor)]
    beside = next((t for t in tensors if t.dim() > 0), tensors[0] if tensors else None)

    def as_tensor(value):
        if not isinstance(value, (bool, int, float, complex)):
            return value
        dtype = torch.result_type(beside, value) if beside is not None else None
        return torch.tensor(value).to(dtype) if dtype is not None else torch.tensor(value)

    names = [a.name for a in op._schema.arguments]
    new_args = tuple(as_tensor(v) if i < len(names) and names[i] in numbers else v for i, v in enumerate(args))
    new_kwargs = {k: as_tensor(v) if k in numbers else v for k, v in kwargs.items()}
    return new_args, new_kwargs


def _takes_tensor(kind) -> bool:
    if isinstance(kind, torch._C.OptionalType):
        kind = kind.getElementType()
    return isinstance(kind, torch._C.TensorType)


def _resize_to(t: torch.Tensor, cpu_value: torch.Tensor) -> None:
    new = _storage.from_host(cpu_value, t.device.index or 0)
    torch.ops.aten.set_.source_Tensor(t, new)
