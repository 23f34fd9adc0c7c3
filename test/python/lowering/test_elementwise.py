"""Elementwise lowerings against eager, including PyTorch's type promotion."""

import pytest
import torch
from direct_graph import check_direct
from harness import check

aten = torch.ops.aten
torch.manual_seed(0)
X = torch.randn(3, 5)
Y = torch.randn(3, 5)
POS = torch.rand(3, 5) + 0.1
I = torch.randint(-7, 7, (3, 5))
J = torch.randint(1, 5, (3, 5))


@pytest.mark.parametrize(
    "fn",
    [torch.exp, torch.expm1, torch.sin, torch.cos, torch.tan, torch.tanh, torch.sigmoid, torch.atan,
     torch.asinh, torch.erf, torch.neg, torch.abs, torch.sign, torch.floor, torch.ceil, torch.round,
     torch.trunc, torch.relu, torch.nn.functional.gelu, torch.nn.functional.silu,
     torch.nn.functional.elu, torch.nn.functional.leaky_relu, torch.isnan, torch.isinf],
    ids=lambda f: f.__name__,
)
def test_unary_float(fn):
    check(lambda x: fn(x), X)


@pytest.mark.parametrize("fn", [torch.log, torch.log1p, torch.sqrt, torch.rsqrt, torch.log2, torch.log10, torch.reciprocal])
def test_unary_positive(fn):
    check(fn, POS)


def test_unary_int_promotes_to_float():
    check(torch.sin, I)
    check(torch.abs, I)
    check(torch.neg, I)


@pytest.mark.parametrize(
    "fn",
    [torch.add, torch.sub, torch.mul, torch.div, torch.maximum, torch.minimum, torch.atan2,
     torch.remainder, torch.fmod, lambda a, b: torch.add(a, b, alpha=2.5),
     lambda a, b: torch.div(a, b, rounding_mode="floor"), lambda a, b: torch.div(a, b, rounding_mode="trunc")],
)
def test_binary_float(fn):
    check(fn, X, Y)


@pytest.mark.parametrize(
    "fn",
    [torch.add, torch.mul, torch.remainder, torch.fmod, torch.floor_divide, torch.bitwise_and,
     torch.bitwise_xor, lambda a, b: torch.div(a, b, rounding_mode="trunc")],
)
def test_binary_int(fn):
    check(fn, I, J)
    check(fn, -I, J)


def test_promotion_int_tensor_float_scalar():
    check(lambda a: a * 2.5 + 1, I)
    check(lambda a: a / 2, I)
    check(lambda a, b: a + b, I, X)
    check(lambda a, b: a + b, X.half(), torch.tensor(3.0, dtype=torch.float64))


@pytest.mark.parametrize("fn", [torch.eq, torch.ne, torch.lt, torch.le, torch.gt, torch.ge])
def test_comparisons(fn):
    check(fn, X, Y)
    check(lambda a: fn(a, 0.5), X)
    check(fn, I, J)


def test_logical_and_where():
    check(lambda a, b: torch.logical_and(a > 0, b), X, I)
    check(lambda a, b: torch.logical_xor(a, b), X, Y)
    check(torch.logical_not, I)
    check(lambda a, b: torch.where(a > 0, a, b), X, Y)
    check(lambda a, b: torch.where(a > 0, a, 2), X, Y)


def test_clamp_and_pow():
    check(lambda a: torch.clamp(a, -0.5, 0.5), X)
    check(lambda a: torch.clamp(a, min=0.1), X)
    check(lambda a, b: torch.clamp(a, min=b), X, Y)
    check(lambda a: torch.pow(a, 2), X)
    check(lambda a: torch.pow(a, 3.5), POS)
    check(lambda a: torch.pow(2, a), X)
    check(lambda a, b: torch.pow(a, b), POS, Y)
    check(lambda a: torch.nn.functional.hardtanh(a, -0.3, 0.2), X)
    check(lambda a: torch.nn.functional.gelu(a, approximate="tanh"), X)


def test_bool_constants_keep_their_values():
    # Boolean tensor constants baked into the module (e.g. causal masks).
    for mask in (torch.tensor([True, False, True]), torch.tensor(True),
                 torch.rand(3, 5) > 0.5, torch.zeros(0, dtype=torch.bool)):
        def select_by_constant_mask(a, mask=mask):
            return torch.where(mask, a, -a)

        check(lambda a: select_by_constant_mask(a), torch.randn(mask.shape))


# Overloads that tracing rewrites (CompositeImplicit) but PyTorch's own graph passes emit:
# Dynamo's tensorify pass writes float arithmetic on sizes through TensorReferenceAnalysis
# (`true_divide`, `square`), after decomposition (#30 item 9, GPT-2's GELU, dynamic=True).
@pytest.mark.parametrize("op, args", [
    (aten.true_divide.Tensor, (X, POS)),
    (aten.true_divide.Tensor, (I, J)),  # integers divide truly: a float result
    (aten.true_divide.Scalar, (X, 4)),
    (aten.square.default, (X,)),
    (aten.square.default, (I,)),
], ids=["true_divide_float", "true_divide_int", "true_divide_scalar", "square_float", "square_int"])
def test_ops_emitted_by_the_tensorify_pass(op, args):
    check_direct(op, *args)


# 16-bit floats: PyTorch's kernels compute these in float32 and round once; a lowering that
# computed the formula in bfloat16 rounded after each op (and its constants): bfloat16
# GELU, ELU, leaky ReLU and SiLU differed by an ulp at up to 1,514 of 2,001 inputs.
SIXTEEN_BIT_EXACT = {
    "sigmoid": torch.sigmoid, "silu": lambda t: torch.nn.functional.silu(t), "elu": lambda t: torch.nn.functional.elu(t),
    "selu": lambda t: torch.nn.functional.selu(t), "celu": lambda t: torch.nn.functional.celu(t, 0.7),
    "leaky_relu": lambda t: torch.nn.functional.leaky_relu(t, 0.1), "exp": torch.exp, "tanh": torch.tanh,
    "log1p": lambda t: torch.log1p(t.abs()), "expm1": torch.expm1,
}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("name", list(SIXTEEN_BIT_EXACT))
def test_sixteen_bit_activations_round_once(name, dtype):
    x = torch.linspace(-6, 6, 2001).to(dtype)
    fn = SIXTEEN_BIT_EXACT[name]
    check(fn, x, rtol=0, atol=0)


# PyTorch's CPU kernels compute 16-bit floats in float32 and round once; mul and div keep a
# Python scalar (or a 0-dim tensor of another dtype) in float32, add and sub round it (and
# alpha) to the tensor's dtype first. Each case differed from CPU's at hundreds of 4,096 inputs.
SIXTEEN_BIT_SCALAR_ARITHMETIC = {
    "mul scalar": lambda a, b: a * 0.1,
    "mul 0-dim float32": lambda a, b: a * torch.tensor(0.1),
    "div scalar": lambda a, b: a / 3,
    "add scalar": lambda a, b: a + 0.3,
    "add 0-dim float32": lambda a, b: a + torch.tensor(0.3),
    "sub scalar": lambda a, b: a - 0.3,
    "rsub scalar": lambda a, b: 1.7 - a,
    "add alpha": lambda a, b: torch.add(a, b, alpha=0.3),
    "sub alpha": lambda a, b: torch.sub(a, b, alpha=0.7),
    "foreach mul scalar": lambda a, b: torch._foreach_mul([a, b], 0.1),
    "foreach add alpha": lambda a, b: torch._foreach_add([a], [b], alpha=0.3),
}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("name", list(SIXTEEN_BIT_SCALAR_ARITHMETIC))
def test_sixteen_bit_scalar_arithmetic_rounds_as_the_cpu_kernels(name, dtype):
    gen = torch.Generator().manual_seed(3)
    a = (torch.randn(4096, generator=gen) * 3).to(dtype)
    b = torch.randn(4096, generator=gen).to(dtype)
    check(SIXTEEN_BIT_SCALAR_ARITHMETIC[name], a, b, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
def test_threshold_compares_at_the_kernels_precision(dtype):
    # bfloat16(0.2) = 0.2001953125 is above a threshold of 0.2: kept, as the CPU kernel keeps it.
    x = torch.tensor([0.1, 0.2, 0.3, 1 / 3, 0.7, -0.2], dtype=dtype)
    check(lambda a: torch.nn.functional.threshold(a, 0.2, 0.05), x, rtol=0, atol=0)
    check(lambda a: torch.nn.functional.threshold(a, 1 / 3, -1.0), x, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
def test_shrink_bands_at_the_kernels_precision(dtype):
    # hardshrink and both shrink backward kernels round lambd to the dtype (bfloat16(0.2) is in
    # the band of 0.2); softshrink's forward keeps it in float32 (x - 0.2 is not 0).
    x = torch.tensor([0.1, 0.2, -0.2, 0.3, 1 / 3, -0.7], dtype=dtype)
    g = torch.linspace(1, 2, 6).to(dtype)
    check(lambda a: torch.nn.functional.hardshrink(a, 0.2), x, rtol=0, atol=0)
    check(lambda a: torch.nn.functional.softshrink(a, 0.2), x, rtol=0, atol=0)
    check(lambda gr, a: aten.hardshrink_backward(gr, a, 0.2), g, x, rtol=0, atol=0)
    check(lambda gr, a: aten.softshrink_backward(gr, a, 0.2), g, x, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.int16, torch.uint8], ids=str)
def test_gcd_lcm(dtype):
    # Euclid's loop for every element at once: zeros, signs, a broadcast operand, one element
    # needing many more steps than the others (Fibonacci neighbours).
    lo = 0 if dtype == torch.uint8 else -60
    a = torch.cat([torch.tensor([0, 0, 12, 89, 7], dtype=dtype), torch.randint(lo, 60, (3, 5), dtype=dtype).flatten()])
    b = torch.cat([torch.tensor([0, 5, 18, 55, 0], dtype=dtype), torch.randint(lo, 60, (15,), dtype=dtype)])
    check(torch.gcd, a, b, ops=[aten.gcd.default], rtol=0, atol=0)
    check(torch.lcm, a, b, ops=[aten.lcm.default], rtol=0, atol=0)
    check(torch.gcd, a.reshape(4, 5), b[:5], ops=[aten.gcd.default], rtol=0, atol=0)
    check(torch.gcd, a[2], b[2], ops=[aten.gcd.default], rtol=0, atol=0)  # 0-dim
