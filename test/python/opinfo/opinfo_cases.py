"""Helpers for running OpInfo samples through torch.compile(backend="tpu")."""

from __future__ import annotations

import inspect
import itertools
import types
import os

import torch
import torch.utils._pytree as pytree

pytest_plugins: list = []

DEFAULT_ATOL = 1e-5
DEFAULT_RTOL = 1.3e-6  # torch.testing's float32 defaults


def op_id(op) -> str:
    return f"{op.name}.{op.variant_test_name}" if op.variant_test_name else op.name


def float32_ops(foreach: bool = False):
    """OpInfo's entries that support float32 on CPU: `op_db`'s, and with `foreach` those of
    the `_foreach_*` lists too (their samples are lists of tensors: `as_function` makes
    each tensor a graph input)."""
    from torch.testing._internal import common_methods_invocations as opinfo

    foreach_ops = [op for name in FOREACH_DBS for op in getattr(opinfo, name)] if foreach else []
    return [op for op in [*opinfo.op_db, *foreach_ops] if torch.float32 in op.supported_dtypes("cpu")]


FOREACH_DBS = ("foreach_unary_op_db", "foreach_binary_op_db", "foreach_pointwise_op_db",
               "foreach_reduce_op_db", "foreach_other_op_db")


def tolerances(op) -> tuple[float, float]:
    """The loosest float32 tolerance any of the op's OpInfo decorators grants, else
    torch.testing's defaults."""
    from torch.testing._internal.common_device_type import toleranceOverride

    atol, rtol = DEFAULT_ATOL, DEFAULT_RTOL
    for info in op.decorators:
        for decorator in getattr(info, "decorators", ()) or ():
            if isinstance(decorator, toleranceOverride) and torch.float32 in decorator.d:
                tol = decorator.d[torch.float32]
                atol, rtol = max(atol, tol.atol), max(rtol, tol.rtol)
    return atol, rtol


def samples(op, requires_grad: bool = False, limit: int | None = None):
    limit = limit if limit is not None else int(os.environ.get("TORCH_TPU_OPINFO_SAMPLES", "2"))
    torch.manual_seed(0)
    return list(itertools.islice(op.sample_inputs("cpu", torch.float32, requires_grad=requires_grad), limit))


def as_function(op, sample):
    """(fn, tensors): fn(*tensors) calls the op on the sample with its tensors as
    graph inputs (not constants baked into the graph)."""
    leaves, spec = pytree.tree_flatten(((sample.input, *sample.args), sample.kwargs))
    positions = [i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor)]
    tensors = [leaves[i] for i in positions]
    function = _traceable(op.op)

    def fn(*inputs):
        rebuilt = list(leaves)
        for i, t in zip(positions, inputs):
            rebuilt[i] = t
        args, kwargs = pytree.tree_unflatten(rebuilt, spec)
        return function(*args, **kwargs)

    return fn, tensors


def _traceable(function):
    """OpInfo wraps many ops in lambdas defined under torch.testing, a folder Dynamo
    never traces (it would graph-break on them). Dynamo decides by the code object's file
    name, so give the wrapper's code a neutral one: the op inside reaches the backend."""
    if not inspect.isfunction(function) or "torch/testing" not in function.__code__.co_filename:
        return function
    code = function.__code__.replace(co_filename="<opinfo-wrapper>")
    clone = types.FunctionType(code, function.__globals__, function.__name__, function.__defaults__, function.__closure__)
    clone.__kwdefaults__ = function.__kwdefaults__
    return clone


def compare(actual, expected, atol: float, rtol: float) -> None:
    a_leaves, a_spec = pytree.tree_flatten(actual)
    e_leaves, e_spec = pytree.tree_flatten(expected)
    assert a_spec == e_spec, f"output structure differs: {a_spec} vs {e_spec}"
    for a, e in zip(a_leaves, e_leaves):
        if isinstance(e, torch.Tensor):
            torch.testing.assert_close(a, e, atol=atol, rtol=rtol, equal_nan=True, check_device=False)
        else:
            assert a == e or (a != a and e != e), (a, e)
