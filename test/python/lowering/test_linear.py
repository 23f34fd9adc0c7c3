"""Matrix-product lowerings (dot_general) against eager."""

import functools

import pytest
import torch
from harness import check, lower_and_run

aten = torch.ops.aten
torch.manual_seed(0)


def _r(*shape, dtype=torch.float32):
    if dtype.is_floating_point or dtype.is_complex:
        return torch.randn(*shape, dtype=dtype)
    return torch.randint(-4, 5, shape, dtype=dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64, torch.int32, torch.complex64])
def test_mm(dtype):
    check(aten.mm, _r(3, 5, dtype=dtype), _r(5, 4, dtype=dtype), ops=[aten.mm.default])


def test_mm_edge_shapes():
    check(aten.mm, _r(1, 1), _r(1, 7), ops=[aten.mm.default])
    check(aten.mm, _r(3, 0), _r(0, 4), ops=[aten.mm.default])  # empty contraction -> zeros
    check(aten.mm, _r(0, 3), _r(3, 4), ops=[aten.mm.default])


def test_mm_reduced_precision():
    check(aten.mm, _r(4, 8).half(), _r(8, 3).half(), atol=1e-2, rtol=1e-2, ops=[aten.mm.default])
    check(aten.mm, _r(4, 8).bfloat16(), _r(8, 3).bfloat16(), atol=5e-2, rtol=5e-2, ops=[aten.mm.default])


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
def test_bmm(dtype):
    check(aten.bmm, _r(2, 3, 5, dtype=dtype), _r(2, 5, 4, dtype=dtype), ops=[aten.bmm.default])
    check(aten.bmm, _r(1, 1, 5, dtype=dtype), _r(1, 5, 1, dtype=dtype), ops=[aten.bmm.default])


def test_matmul_reaches_mm():
    # matmul is CompositeImplicit: it arrives as view + mm / bmm / dot / mv.
    check(lambda a, b: a @ b, _r(4), _r(4), ops=[aten.dot.default])
    check(lambda a, b: a @ b, _r(3, 4), _r(4), ops=[aten.mv.default])


@pytest.mark.parametrize(
    "kw", [{}, {"beta": 0.5, "alpha": 2.0}, {"beta": 0}, {"alpha": 0.0}]
)
def test_addmm(kw):
    check(lambda c, a, b: aten.addmm(c, a, b, **kw), _r(3, 4), _r(3, 5), _r(5, 4), ops=[aten.addmm.default])
    # broadcast bias (as F.linear emits)
    check(lambda c, a, b: aten.addmm(c, a, b, **kw), _r(4), _r(3, 5), _r(5, 4), ops=[aten.addmm.default])


def test_addmm_beta_zero_ignores_nan():
    c = torch.full((3, 4), float("nan"))
    check(lambda c, a, b: aten.addmm(c, a, b, beta=0), c, _r(3, 5), _r(5, 4), ops=[aten.addmm.default])


def test_addmm_int():
    check(lambda c, a, b: aten.addmm(c, a, b, beta=2, alpha=3), _r(1, 4, dtype=torch.int64),
          _r(3, 5, dtype=torch.int64), _r(5, 4, dtype=torch.int64), ops=[aten.addmm.default])


def test_baddbmm_addbmm():
    check(lambda c, a, b: aten.baddbmm(c, a, b), _r(2, 3, 4), _r(2, 3, 5), _r(2, 5, 4), ops=[aten.baddbmm.default])
    check(lambda c, a, b: aten.baddbmm(c, a, b, beta=0.5, alpha=-1.5), _r(3, 4), _r(2, 3, 5), _r(2, 5, 4),
          ops=[aten.baddbmm.default])
    check(lambda c, a, b: aten.addbmm(c, a, b), _r(3, 4), _r(2, 3, 5), _r(2, 5, 4), ops=[aten.addbmm.default])
    check(lambda c, a, b: aten.addbmm(c, a, b, beta=0, alpha=2), _r(4), _r(2, 3, 5), _r(2, 5, 4),
          ops=[aten.addbmm.default])


def test_mv_addmv_dot_vdot():
    check(aten.mv, _r(3, 5), _r(5), ops=[aten.mv.default])
    check(aten.mv, _r(3, 5, dtype=torch.int64), _r(5, dtype=torch.int64), ops=[aten.mv.default])
    check(lambda c, a, b: aten.addmv(c, a, b, beta=0.5, alpha=2), _r(3), _r(3, 5), _r(5), ops=[aten.addmv.default])
    check(lambda c, a, b: aten.addmv(c, a, b), _r(1), _r(3, 5), _r(5), ops=[aten.addmv.default])
    check(aten.dot, _r(7), _r(7), ops=[aten.dot.default])
    check(aten.dot, _r(7, dtype=torch.int32), _r(7, dtype=torch.int32), ops=[aten.dot.default])
    check(aten.dot, _r(0), _r(0), ops=[aten.dot.default])
    check(aten.vdot, _r(5), _r(5), ops=[aten.vdot.default])
    check(aten.vdot, _r(5, dtype=torch.complex64), _r(5, dtype=torch.complex64), ops=[aten.vdot.default])


def test_int_mm():
    a = torch.randint(-100, 100, (32, 16), dtype=torch.int8)
    b = torch.randint(-100, 100, (16, 8), dtype=torch.int8)
    check(aten._int_mm, a, b, ops=[aten._int_mm.default])


def test_mm_out_dtype():
    # mm.dtype / bmm.dtype / addmm.dtype have no CPU kernel: compare with an f32 reference.
    a, b = _r(3, 8).half(), _r(8, 4).half()
    (out,), _, _ = lower_and_run(lambda a, b: [aten.mm.dtype(a, b, torch.float32)], a, b)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, a.float() @ b.float(), rtol=1e-3, atol=1e-3)
    a3, b3 = _r(2, 3, 8).bfloat16(), _r(2, 8, 4).bfloat16()
    (out,), _, _ = lower_and_run(lambda a, b: [aten.bmm.dtype(a, b, torch.float32)], a3, b3)
    torch.testing.assert_close(out, a3.float() @ b3.float(), rtol=1e-3, atol=1e-3)
    c = _r(3, 4)
    (out,), _, _ = lower_and_run(lambda c, a, b: [aten.addmm.dtype(c, a, b, torch.float32, beta=2)], c, a, b)
    torch.testing.assert_close(out, 2 * c + a.float() @ b.float(), rtol=1e-3, atol=1e-3)



@pytest.mark.parametrize("gelu", [False, True])
def test_addmm_activation(gelu):
    check(lambda c, a, b: aten._addmm_activation(c, a, b, beta=0.5, use_gelu=gelu), _r(4), _r(3, 5), _r(5, 4),
          rtol=1e-5, atol=1e-5, ops=[aten._addmm_activation.default])


def test_trilinear():
    F = torch.nn.functional
    x1, x2, w, b = _r(4, 3), _r(4, 2), _r(5, 3, 2), _r(5)
    check(lambda a, c, w, b: F.bilinear(a, c, w, b), x1, x2, w, b, rtol=1e-5, atol=1e-5, ops=[aten._trilinear.default])
    check(lambda a, c, w: F.bilinear(a, c, w), _r(2, 4, 3), _r(2, 4, 2), w, rtol=1e-5, atol=1e-5,
          ops=[aten._trilinear.default])
    for sumdim in ([], [3], [0, 2]):
        fn = functools.partial(aten._trilinear, expand1=[1, 3], expand2=[0], expand3=[1, 2], sumdim=sumdim)
        check(fn, x1, w, x2, rtol=1e-5, atol=1e-5, ops=[aten._trilinear.default])
    # size-1 dims broadcast against the other operands
    check(lambda a, w, c: aten._trilinear(a, w, c, [1, 3], [0], [1, 2], [2, 3]), _r(1, 3), w, x2, rtol=1e-5,
          atol=1e-5, ops=[aten._trilinear.default])


@pytest.mark.parametrize("sumdim", [[], [1], [0, 1], [2]])
def test_trilinear_dim_every_operand_expands(sumdim):
    """A dim all three operands are unsqueezed at has size 0 in ATen's result: empty,
    or zeros where it is summed (issue #11)."""
    fn = functools.partial(aten._trilinear, expand1=[1], expand2=[1], expand3=[1], sumdim=sumdim)
    check(fn, _r(3, 4), _r(3, 4), _r(3, 4), ops=[aten._trilinear.default])


def test_trilinear_zero_size_operands():
    F = torch.nn.functional
    check(lambda a, c, w: F.bilinear(a, c, w), _r(0, 3), _r(0, 2), _r(5, 3, 2), ops=[aten._trilinear.default])
    check(lambda a, c, w: F.bilinear(a, c, w), _r(4, 3), _r(4, 2), _r(0, 3, 2), ops=[aten._trilinear.default])
    # a zero-size summed dim: zeros
    check(lambda a, b, c: aten._trilinear(a, b, c, [1], [0], [1], [2]), _r(3, 0), _r(2, 0), _r(3, 0),
          ops=[aten._trilinear.default])


# A product of exactly 1 + 2**-8 (half way between two bfloat16s: it rounds to 1.0 on its own)
# plus 2**-9 is 1 + 3 * 2**-9, which rounds up to 1 + 2**-7: the CPU kernels add in float32 and
# round once; rounding the product first gives 1.0. float16's half-way point is 1 + 2**-11.
_ROUND_ONCE_CASES = {torch.bfloat16: (2.0 ** -8, 2.0 ** -9), torch.float16: (2.0 ** -11, 2.0 ** -12)}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_sixteen_bit_products_with_an_addend_round_once(dtype):
    half_way, addend = _ROUND_ONCE_CASES[dtype]
    a = torch.tensor([[1.0, half_way]], dtype=dtype)
    b = torch.ones(2, 1, dtype=dtype)
    c = torch.tensor([[addend]], dtype=dtype)
    assert aten.addmm(c, a, b).item() != 1.0  # what a second rounding would give
    exact = dict(atol=0, rtol=0)
    check(lambda c, a, b: aten.addmm(c, a, b), c, a, b, ops=[aten.addmm.default], **exact)
    check(lambda c, a, b: aten.addmm(c, a, b, beta=0.5, alpha=1.0), c * 2, a, b, ops=[aten.addmm.default], **exact)
    check(lambda c, a, b: aten.baddbmm(c, a, b), c[None], a[None], b[None], ops=[aten.baddbmm.default], **exact)
    check(lambda c, a, b: aten.addbmm(c, a, b), c, a[None], b[None], ops=[aten.addbmm.default], **exact)
    check(lambda c, a, b: aten.addmv(c, a, b), c[0], a, b[:, 0], ops=[aten.addmv.default], **exact)
    # F.linear with a bias reaches addmm
    check(lambda x, w, bias: torch.nn.functional.linear(x, w, bias), a, b.T, c[0], **exact)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_sixteen_bit_addmm_gelu_rounds_once(dtype):
    # The CPU kernel applies GELU to addmm's rounded result, computing it in float32 (float16:
    # within an ulp, erf's approximation differing from the CPU's at a few inputs).
    x = torch.linspace(-4, 4, 64).to(dtype).reshape(8, 8)
    eye = torch.eye(8, dtype=dtype)
    tol = dict(atol=0, rtol=0) if dtype == torch.bfloat16 else dict(atol=1e-6, rtol=1e-3)
    check(lambda c, a, b: aten._addmm_activation(c, a, b, use_gelu=True), torch.zeros(8, dtype=dtype), x, eye,
          ops=[aten._addmm_activation.default], **tol)
