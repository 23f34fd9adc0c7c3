"""Issue #30: a lowering must accept every input PyTorch accepts. Each case is one class
of input that lowerings used to reject (and that only passed because the op fell back to
PyTorch eager or to the CPU): bounds that broadcast the input to a larger shape, 0-d
tensors, empty tensors, mixed dtypes that promote, lazy conjugation/negation bits,
running-stat ops in inference mode, out= forms (of the result's size, and of another
size, which PyTorch resizes).

Every case runs with TORCH_TPU_STRICT=1, so a fallback is an error, through both paths
(torch.compile(backend="tpu", fullgraph=True) and the eager tpu device), and is compared
with PyTorch eager on CPU: values at float32 tolerances (1e-5 absolute, 1.3e-6 relative,
torch.testing's), shapes and dtypes exactly."""

from __future__ import annotations

import pytest
import torch
import torch.utils._pytree as pytree

import torch_tpu.device  # noqa: F401 - registers the tpu device where autoload is off

aten = torch.ops.aten


def _g(*shape, dtype=torch.float32, seed=0):
    generator = torch.Generator().manual_seed(seed + len(shape))
    if dtype.is_floating_point or dtype.is_complex:
        return torch.randn(shape, generator=generator, dtype=dtype)
    if dtype is torch.bool:
        return torch.randint(0, 2, shape, generator=generator).bool()
    return torch.randint(-5, 6, shape, generator=generator, dtype=dtype)


# (id, function, inputs). Grouped by the class of input each one exercises.
BROADCAST_BOUND = [
    ("clamp_min_wider_bound", torch.clamp_min, lambda: (_g(5, 1), _g(1, 5))),
    ("clamp_max_wider_bound", torch.clamp_max, lambda: (_g(5, 1), _g(4, 5, 5))),
    ("clamp_both_bounds_broadcast", lambda x, lo, hi: torch.clamp(x, lo, hi), lambda: (_g(3, 1), _g(1, 4) - 1, _g(4) + 1)),
    ("clamp_only_max_tensor", lambda x, hi: torch.clamp(x, max=hi), lambda: (_g(2, 1, 3), _g(4, 1))),
    ("clip_wider_bound", lambda x, lo: torch.clip(x, min=lo), lambda: (_g(6), _g(2, 6))),
    ("inplace_clamp_same_shape_bound", lambda x, lo: x.clone().clamp_(min=lo), lambda: (_g(2, 3), _g(3))),
]
ZERO_DIM = [
    ("clamp_zero_dim_input_tensor_bound", torch.clamp_min, lambda: (_g(), _g(3))),
    ("clamp_zero_dim_bounds", lambda x, lo, hi: torch.clamp(x, lo, hi), lambda: (_g(2, 3), _g() - 1, _g() + 1)),
    ("add_zero_dim_operands", torch.add, lambda: (_g(), _g())),
    ("where_zero_dim_condition", torch.where, lambda: (_g(dtype=torch.bool), _g(2, 2), _g())),
]
EMPTY = [
    ("clamp_empty_input", lambda x, lo: torch.clamp(x, min=lo), lambda: (_g(0, 3), _g(3))),
    ("clamp_min_empty_bound_broadcast", torch.clamp_min, lambda: (_g(0, 1), _g(1, 4))),
    ("sum_of_empty", lambda x: x.sum(0), lambda: (_g(0, 4),)),
    ("layer_norm_empty_batch", lambda x, w, b: torch.nn.functional.layer_norm(x, (4,), w, b), lambda: (_g(0, 4), _g(4), _g(4))),
]
PROMOTION = [
    ("clamp_int_input_float_bound", lambda x, lo: torch.clamp(x, min=lo), lambda: (_g(2, 3, dtype=torch.int64), _g(3))),
    ("clamp_int_input_python_float", lambda x: torch.clamp(x, min=0.5, max=2.5), lambda: (_g(4, dtype=torch.int32),)),
    ("clamp_float_input_int_bound", lambda x, lo: torch.clamp_min(x, lo), lambda: (_g(2, 3), _g(1, 3, dtype=torch.int64))),
    ("clamp_bool_bound", lambda x, hi: torch.clamp_max(x, hi), lambda: (_g(2, 2, dtype=torch.int64), _g(2, dtype=torch.bool))),
    ("clamp_zero_dim_double_bound_keeps_float32", lambda x, lo: torch.clamp_min(x, lo), lambda: (_g(3), _g(dtype=torch.float64))),
]
LAZY_BITS = [
    ("clone_of_conj_view", lambda x: x.conj().clone(), lambda: (_g(3, 4, dtype=torch.complex64),)),
    ("add_of_conj_view", lambda x: x.conj() + 1, lambda: (_g(3, dtype=torch.complex64),)),
    ("imag_of_conj_view_is_negated", lambda x: x.conj().imag * 2, lambda: (_g(3, dtype=torch.complex64),)),
    ("ifft", torch.fft.ifft, lambda: (_g(8, dtype=torch.complex64),)),
    ("hfft", torch.fft.hfft, lambda: (_g(5, dtype=torch.complex64),)),
]
INFERENCE_STATS = [
    ("native_batch_norm_legit_eval", lambda x, w, b, m, v: aten._native_batch_norm_legit(x, w, b, m, v, False, 0.1, 1e-5),
     lambda: (_g(2, 3, 4), _g(3), _g(3), _g(3), _g(3).abs() + 0.5)),
    ("native_batch_norm_eval", lambda x, w, b, m, v: aten.native_batch_norm(x, w, b, m, v, False, 0.1, 1e-5),
     lambda: (_g(2, 3, 4), _g(3), _g(3), _g(3), _g(3).abs() + 0.5)),
]
# Ops that ran only through the fallback for want of a lowering.
UNLOWERED = [
    ("hash_tensor_float_all_dims", torch.hash_tensor, lambda: (_g(3, 4),)),
    ("hash_tensor_int8_dim_keepdim", lambda x: torch.hash_tensor(x, 1, keepdim=True), lambda: (_g(3, 4, dtype=torch.int8),)),
    ("hash_tensor_bool", torch.hash_tensor, lambda: (_g(5, dtype=torch.bool),)),
    ("mode_ties_smallest_value_last_index", lambda x: torch.mode(x, 1),
     lambda: (torch.tensor([[1.0, 2.0, 2.0, 1.0, 3.0], [5.0, 5.0, 4.0, 4.0, 4.0]]),)),
    ("mode_int_dim0_keepdim", lambda x: torch.mode(x, 0, keepdim=True), lambda: (_g(6, 3, dtype=torch.int64) % 3,)),
    ("mode_zero_dim", torch.mode, lambda: (_g(),)),
    # No meta kernel in PyTorch (the device plans it through FakeTensorMode, as torch.compile does).
    ("geqrf_without_meta_kernel", torch.geqrf, lambda: (_g(2, 5, 3),)),
]
OUT_FORMS = [
    ("clamp_out_broadcast", lambda x, lo: torch.clamp(x, min=lo, out=torch.empty(3, 2, device=x.device)),
     lambda: (_g(3, 1), _g(1, 2))),
    ("clamp_out_resized_from_empty", lambda x, lo: torch.clamp(x, min=lo, out=torch.empty(0, device=x.device)),
     lambda: (_g(3, 1), _g(1, 2))),
    ("max_dim_out_resized", lambda x: torch.max(x, 1, out=(torch.empty(0, device=x.device),
                                                            torch.empty(0, dtype=torch.long, device=x.device))),
     lambda: (_g(3, 4),)),
    # A factory's out= form computes in the out tensor's dtype (mvlgamma calls it).
    ("arange_out_int64", lambda x: x + torch.arange(1, 7, 2, out=torch.empty(0, dtype=torch.long, device=x.device)),
     lambda: (_g(3, dtype=torch.int64),)),
    ("arange_out_float64", lambda x: x + torch.arange(0.5, 3, out=torch.empty(0, dtype=torch.float64, device=x.device)),
     lambda: (_g(3, dtype=torch.float64),)),
    ("mvlgamma", lambda x: torch.mvlgamma(x, 3), lambda: (_g(4).abs() + 3,)),
]

CASES = BROADCAST_BOUND + ZERO_DIM + EMPTY + PROMOTION + LAZY_BITS + INFERENCE_STATS + UNLOWERED + OUT_FORMS
# Dynamo itself refuses an out= tensor of another size under fullgraph ("Shape mismatch
# with out= tensor variant"): the resize is the eager device's to do.
DEVICE_ONLY = {"clamp_out_resized_from_empty", "max_dim_out_resized", "arange_out_int64", "arange_out_float64"}


@pytest.fixture(autouse=True)
def _strict(monkeypatch):
    monkeypatch.setenv("TORCH_TPU_STRICT", "1")


def _compare(actual, expected) -> None:
    a_leaves, e_leaves = pytree.tree_leaves(actual), pytree.tree_leaves(expected)
    assert len(a_leaves) == len(e_leaves)
    for a, e in zip(a_leaves, e_leaves):
        assert (a.shape, a.dtype) == (e.shape, e.dtype)
        torch.testing.assert_close(a.cpu(), e, atol=1e-5, rtol=1.3e-6, equal_nan=True)


@pytest.mark.parametrize("case", [pytest.param(c, id=c[0]) for c in CASES if c[0] not in DEVICE_ONLY])
def test_compiled(case):
    name, fn, make = case
    inputs = make()
    expected = fn(*inputs)
    torch._dynamo.reset()
    actual = torch.compile(fn, backend="tpu", fullgraph=True, dynamic=False)(*inputs)
    _compare(actual, expected)


@pytest.mark.parametrize("case", [pytest.param(c, id=c[0]) for c in CASES])
def test_device(case):
    name, fn, make = case
    inputs = make()
    expected = fn(*inputs)
    actual = fn(*(t.to("tpu") for t in inputs))
    for leaf in pytree.tree_leaves(actual):
        assert leaf.device.type == "tpu"
    _compare(actual, expected)


def test_device_inplace_form_gets_the_defaults_its_functional_form_requires():
    """`bernoulli_()` defaults p=0.5; its functional form `bernoulli.p` requires p: the
    device passes the in-place form's default (it used to fail planning, then ran on CPU)."""
    x = torch.full((64,), 7.0, device="tpu")
    x.bernoulli_()
    values = x.cpu()
    assert set(values.unique().tolist()) <= {0.0, 1.0} and 0 < values.sum() < 64


@pytest.mark.parametrize("fn, op, hint", [
    (torch.unique, "aten._unique2", "torch.compiler.disable"),
    (torch.unique_consecutive, "aten.unique_consecutive", "torch.compiler.disable"),
    (torch.nonzero, "aten.nonzero", "nonzero_static"),
], ids=["unique", "unique_consecutive", "nonzero"])
def test_compiled_data_dependent_op_is_refused_by_name(fn, op, hint):
    """What cannot be lowered (a result shape that depends on the values) is, under
    STRICT, an error naming the op, the reason, the user's line and what to do."""
    import torch._dynamo.config as dynamo_config

    from torch_tpu.program.errors import TorchTpuCompileError

    torch._dynamo.reset()
    compiled = torch.compile(lambda x: fn(x), backend="tpu", fullgraph=True)
    with dynamo_config.patch(capture_dynamic_output_shape_ops=True), pytest.raises(Exception) as caught:
        compiled(torch.tensor([1.0, 2.0, 2.0, 0.0]))
    err = getattr(caught.value, "inner_exception", caught.value)  # Dynamo's BackendCompilerFailed wraps ours
    assert isinstance(err, TorchTpuCompileError), caught.value
    message = str(err)
    assert op in message and "data-dependent" in message and hint in message
    assert f"{__file__}:" in message  # the user's source line
