"""The `_foreach_*` overloads (compiler/lowering/foreach.py) against PyTorch eager on CPU,
through torch.compile(..., backend="tpu", fullgraph=True) under TORCH_TPU_STRICT=1.

The OpInfo sweep (test_opinfo.py) runs each foreach entry's first samples, which cover
its first overload only. Here every foreach entry whose overloads take operands of more
than one kind (a tensor list, a scalar, a scalar list, one tensor shared by every element)
runs one sample of each kind OpInfo has, in its out-of-place form and in its in-place form
(`_foreach_add_`: through aot_autograd's functionalization, and through the importer's
own non-functional mode, `functionalize="torchtpu"`). Lists are cut to their first few
tensors: the lowering treats every element alike, and each element is a compile."""

from __future__ import annotations

import pytest
import torch
from opinfo_cases import DEFAULT_ATOL, DEFAULT_RTOL, compare

ELEMENTS = 3  # tensors kept per list


def _kind(value) -> str:
    if isinstance(value, torch.Tensor):
        return "tensor"
    if isinstance(value, (list, tuple)):
        return "list of " + ",".join(sorted({_kind(v) for v in value}))
    return type(value).__name__


def _shorten(value, length: int):
    """`value` with each list (or 1-D tensor of per-element scalars) of the sample's list
    length cut to its first ELEMENTS entries."""
    if isinstance(value, (list, tuple)) and len(value) == length:
        return type(value)(value[:ELEMENTS])
    if isinstance(value, torch.Tensor) and value.dim() == 1 and value.numel() == length and length > ELEMENTS:
        return value[:ELEMENTS].clone()
    return value


def _cases():
    from torch.testing._internal.common_methods_invocations import (
        foreach_binary_op_db,
        foreach_other_op_db,
        foreach_pointwise_op_db,
        foreach_reduce_op_db,
    )

    for op in [*foreach_binary_op_db, *foreach_pointwise_op_db, *foreach_other_op_db, *foreach_reduce_op_db]:
        if op.name in ("_foreach_max", "_foreach_mm"):
            continue  # Dynamo does not trace these builtins (opinfo_xfail.FOREACH_BUILTIN)
        torch.manual_seed(0)
        seen = set()
        for sample in op.sample_inputs("cpu", torch.float32):
            signature = (tuple(_kind(a) for a in sample.args),
                         tuple(sorted((k, _kind(v)) for k, v in sample.kwargs.items())))
            if signature in seen:
                continue
            seen.add(signature)
            length = len(sample.input)
            inputs = _shorten(sample.input, length)
            args = tuple(_shorten(a, length) for a in sample.args)
            kwargs = {k: _shorten(v, length) for k, v in sample.kwargs.items()}
            name = f"{op.name}-{len(seen)}"
            yield pytest.param(op, inputs, args, kwargs, id=name)


CASES = list(_cases())


pytestmark = pytest.mark.usefixtures("strict_compile")  # test/python/conftest.py


def _compiled(fn, **options):
    return torch.compile(fn, backend="tpu", fullgraph=True, dynamic=False, options=options or None)


def _out_of_place(op):
    # OpInfo names the in-place _foreach_copy_/_foreach_zero_ as `op` (no functional form).
    return op.op if not op.op.__name__.endswith("_") else None


# PyTorch's fake kernel of `_foreach_add.Tensor` (out-of-place, and in place under
# aot_autograd) reads the shared tensor with `.item()` while tracing: the graph holds
# `_local_scalar_dense` + `_foreach_add.Scalar`, a data-dependent read strict mode refuses.
# The overload's lowering is checked on a hand-built graph (lowering/test_foreach.py).
ADD_TENSOR_TRACED_AS_ITEM = "PyTorch traces _foreach_add.Tensor as .item() + _foreach_add.Scalar (data-dependent)"


def _traced_as_item(op, args) -> bool:
    return op.name == "_foreach_add" and any(isinstance(a, torch.Tensor) for a in args)


def _eager(function, *args, **kwargs):
    try:
        return function(*args, **kwargs)
    except RuntimeError as err:  # e.g. subtracting a bool scalar: eager rejects the sample
        pytest.skip(f"eager rejects this sample: {err}")


@pytest.mark.parametrize("op,inputs,args,kwargs", CASES)
def test_out_of_place(op, inputs, args, kwargs, request):
    function = _out_of_place(op)
    if function is None:
        pytest.skip(f"{op.name}: OpInfo gives only the in-place form")

    def fn(inputs, args):
        return function(inputs, *args, **kwargs)

    expected = _eager(fn, inputs, args)
    if _traced_as_item(op, args):
        request.applymarker(pytest.mark.xfail(reason=ADD_TENSOR_TRACED_AS_ITEM, strict=True))
    compare(_compiled(fn)(inputs, args), expected, DEFAULT_ATOL, DEFAULT_RTOL)


@pytest.mark.parametrize("functionalize", ["aot_autograd", "torchtpu"])
@pytest.mark.parametrize("op,inputs,args,kwargs", CASES)
def test_in_place(op, inputs, args, kwargs, functionalize, request):
    if op.inplace_variant is None:
        pytest.skip(f"{op.name} has no in-place form")
    expected = [t.clone() for t in inputs]
    _eager(op.inplace_variant, expected, *args, **kwargs)
    if functionalize == "aot_autograd" and _traced_as_item(op, args):
        request.applymarker(pytest.mark.xfail(reason=ADD_TENSOR_TRACED_AS_ITEM, strict=True))

    def fn(tensors, args):
        op.inplace_variant(tensors, *args, **kwargs)
        return tensors

    options = {"functionalize": "torchtpu"} if functionalize == "torchtpu" else {}
    actual = [t.clone() for t in inputs]
    result = _compiled(fn, **options)(actual, args)
    compare(actual, expected, DEFAULT_ATOL, DEFAULT_RTOL)
    compare(list(result), expected, DEFAULT_ATOL, DEFAULT_RTOL)


def test_pow_scalar_base():
    """`_foreach_pow.ScalarAndTensor` (a Python base, a list of exponents; AdamW's bias
    corrections `beta ** step`), which OpInfo's samples do not reach."""
    exponents = [torch.arange(1.0, 5.0), torch.tensor(3.0), torch.arange(6, dtype=torch.int64).reshape(2, 3)]

    def fn(exponents):
        return torch._foreach_pow(0.9, exponents)

    compare(_compiled(fn)(exponents), fn(exponents), DEFAULT_ATOL, DEFAULT_RTOL)


def test_per_tensor_promotion_and_broadcast():
    """Each element promotes on its own (an int64 tensor in a float list, a complex scalar
    in a scalar list) and the Tensor overload's one tensor broadcasts against each."""
    tensors = [torch.arange(6, dtype=torch.int64).reshape(2, 3), torch.randn(3), torch.randn(2, 3, dtype=torch.float64)]

    def fn(tensors, shared):
        return (
            torch._foreach_add(tensors, [1.5, 2, 1j]),
            torch._foreach_mul(tensors, shared),
            torch._foreach_div(tensors, 2),
        )

    shared = torch.tensor(0.5)
    compare(_compiled(fn)(tensors, shared), fn(tensors, shared), DEFAULT_ATOL, DEFAULT_RTOL)
