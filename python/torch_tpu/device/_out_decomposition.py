"""The decomposition of an out= overload that the table's entry cannot run.

PyTorch's decomposition table registers an entry for every overload of a packet, out=
forms included, but only the entries wrapped to take the out tensors
(`torch._prims_common.wrappers.out_wrapper`) accept them: `reflection_pad1d_backward.
grad_input` maps to a function without a `grad_input` parameter. Compiled graphs never
hold out= forms (functionalization removes them); the eager device receives them
whenever PyTorch's functional kernel for every device allocates its result and calls the
out= form (`reflection_pad1d_backward`, the backward of `torch.stft`'s reflection padding).
Such an op runs its functional form's decomposition -- never the functional op itself,
whose kernel would call the out= form again -- and writes each result into its out=
tensor, resized first as PyTorch's `resize_output` does.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

import torch

from ._ops import _functional, _resize_outputs, _written


def out_names(op) -> list[str]:
    """The out= arguments of `op` (keyword-only and written); none for in-place ops."""
    if op._schema.name.endswith("_"):
        return []
    written = set(_written(op))
    return [a.name for a in op._schema.arguments if a.kwarg_only and a.name in written]


def takes_out_arguments(decomposition: Callable, names: list[str]) -> bool:
    try:
        parameters = inspect.signature(decomposition).parameters
    except (TypeError, ValueError):
        return True  # a builtin: it was registered for this overload, trust it
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return True
    return all(name in parameters for name in names)


def run_through_functional(op, names: list[str], table: dict, args: tuple, kwargs: dict):
    """The out= op (its out= arguments `names`, `out_names(op)`) computed by its functional
    form's decomposition, its results written into the out tensors (returned as the out=
    op returns them); NotImplemented when the functional form has no decomposition."""
    functional = _functional(op)
    decomposition = table.get(functional) if functional is not None else None
    if decomposition is None or not names:
        return NotImplemented
    bound = dict(zip((a.name for a in op._schema.arguments), args))
    bound.update(kwargs)
    f_args, f_kwargs = [], {}
    for arg in functional._schema.arguments:
        if arg.name not in bound:
            continue  # left to the decomposition's default
        if arg.kwarg_only:
            f_kwargs[arg.name] = bound[arg.name]
        else:
            f_args.append(bound[arg.name])
    result = decomposition(*f_args, **f_kwargs)
    if result is NotImplemented:
        return NotImplemented
    results = list(result) if isinstance(result, (tuple, list)) else [result]
    outs = [bound[name] for name in names]
    sizes = {name: tuple(r.shape) for name, out, r in zip(names, outs, results) if out.shape != r.shape}
    if sizes:
        _resize_outputs(op, args, kwargs, sizes)
    with torch.no_grad():
        for out, value in zip(outs, results):
            out.copy_(value)
    return outs[0] if len(outs) == 1 else tuple(outs)
