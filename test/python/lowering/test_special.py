"""Special-function lowerings (compiler/lowering/special/) against eager, float32 and
float64, over inputs that reach every branch of PyTorch's CPU kernels."""

import math

import pytest
import torch
from harness import check

aten = torch.ops.aten
S = torch.special
torch.manual_seed(0)

INF, NAN = math.inf, math.nan
EDGES = torch.tensor(
    [-INF, -30.0, -8.5, -8.0, -5.5, -5.0, -2.09, -1.0, -1e-6, -0.0, 0.0, 1e-6, 0.3, 0.5, 1.0,
     2.0, 2.09, 5.0, 5.5, 8.0, 8.5, 30.0, 60.0, INF, NAN]
)  # fmt: skip
X = torch.cat([EDGES, torch.randn(40) * 6]).reshape(5, 13)
FLOATS = [torch.float32, torch.float64]

UNARY = [
    (S.airy_ai, aten.special_airy_ai.default),
    (S.bessel_j0, aten.special_bessel_j0.default),
    (S.bessel_j1, aten.special_bessel_j1.default),
    (S.bessel_y0, aten.special_bessel_y0.default),
    (S.bessel_y1, aten.special_bessel_y1.default),
    (S.spherical_bessel_j0, aten.special_spherical_bessel_j0.default),
    (torch.i0, aten.i0.default),
    (S.i0e, aten.special_i0e.default),
    (S.i1, aten.special_i1.default),
    (S.i1e, aten.special_i1e.default),
    (S.modified_bessel_i0, aten.special_modified_bessel_i0.default),
    (S.modified_bessel_i1, aten.special_modified_bessel_i1.default),
    (S.modified_bessel_k0, aten.special_modified_bessel_k0.default),
    (S.modified_bessel_k1, aten.special_modified_bessel_k1.default),
    (S.scaled_modified_bessel_k0, aten.special_scaled_modified_bessel_k0.default),
    (S.scaled_modified_bessel_k1, aten.special_scaled_modified_bessel_k1.default),
    (S.erfcx, aten.special_erfcx.default),
    (S.log_ndtr, aten.special_log_ndtr.default),
    (torch.erfc, aten.erfc.default),
]


@pytest.mark.parametrize("dt", FLOATS, ids=str)
@pytest.mark.parametrize("fn,op", UNARY, ids=lambda v: getattr(v, "__name__", None))
def test_unary(fn, op, dt):
    check(fn, X.to(dt), ops=[op])


@pytest.mark.parametrize("fn,op", UNARY[:4] + UNARY[6:8] + [UNARY[-1]], ids=lambda v: getattr(v, "__name__", None))
def test_unary_int_and_rank0(fn, op):
    check(fn, torch.arange(-6, 7), ops=[op])  # integers promote to float32
    check(fn, torch.tensor(1.5), ops=[op])
    check(fn, torch.empty(0, 3), ops=[op])


@pytest.mark.parametrize("dt", FLOATS, ids=str)
def test_ndtri(dt):
    y = torch.cat([torch.tensor([0.0, 1.0, -0.1, 1.1, NAN, 1e-30, 1e-10, 0.1, 0.5, 0.9, 0.99999]), torch.rand(30)])
    check(S.ndtri, y.to(dt), ops=[aten.special_ndtri.default])


@pytest.mark.parametrize("dt", FLOATS, ids=str)
def test_erfcx_branches(dt):
    # y100 lookup on both sides of 0, the continued fraction above 50, 1/(x sqrt(pi))
    # above 5e7, 2 exp(x^2) below -6.1 and inf below -26.7.
    x = torch.tensor([-30.0, -26.0, -7.0, -6.0, -0.01, 0.0, 0.01, 3.9, 4.0, 49.0, 51.0, 1e6, 1e8])
    check(S.erfcx, x.to(dt), ops=[aten.special_erfcx.default])


# -- orthogonal polynomials ------------------------------------------------------------------------
POLYNOMIALS = [
    "chebyshev_polynomial_t", "chebyshev_polynomial_u", "chebyshev_polynomial_v", "chebyshev_polynomial_w",
    "shifted_chebyshev_polynomial_t", "shifted_chebyshev_polynomial_u", "shifted_chebyshev_polynomial_v",
    "shifted_chebyshev_polynomial_w", "hermite_polynomial_h", "hermite_polynomial_he", "laguerre_polynomial_l",
    "legendre_polynomial_p",
]  # fmt: skip
PX = torch.tensor([-3.0, -1.0, -0.7, -0.2, 0.0, 0.3, 0.5, 0.8, 1.0, 1.5, 2.5])
# Negative, fractional (truncated), NaN/inf (-> 0) and past the trigonometric thresholds.
PN = torch.tensor([-2.0, -0.5, 0.0, 1.0, 1.9, 2.0, 3.0, 5.0, 6.0, 7.0, 8.0, 9.0, 12.0, NAN, INF])


@pytest.mark.parametrize("dt", FLOATS, ids=str)
@pytest.mark.parametrize("name", POLYNOMIALS)
def test_polynomial(name, dt):
    fn = getattr(S, name)
    packet = getattr(aten, f"special_{name}")
    check(fn, PX[:, None].to(dt), PN.to(dt), ops=[packet.default])


@pytest.mark.parametrize("name", POLYNOMIALS)
def test_polynomial_scalar_overloads(name):
    fn = getattr(S, name)
    packet = getattr(aten, f"special_{name}")
    check(lambda x: fn(x, 11), PX, ops=[packet.n_scalar])
    check(lambda n: fn(0.3, n), PN.double(), ops=[packet.x_scalar])


@pytest.mark.parametrize("name", ["chebyshev_polynomial_u", "hermite_polynomial_h", "legendre_polynomial_p"])
def test_polynomial_int_operands(name):
    fn = getattr(S, name)
    packet = getattr(aten, f"special_{name}")
    check(fn, torch.linspace(-2, 2, 9)[:, None], torch.arange(-1, 11), ops=[packet.default])  # int n
    check(lambda x: fn(x, 3), torch.arange(-3, 4), ops=[packet.n_scalar])  # int x -> float32


def test_hermite_degree_limit():
    # Past degree 128 (float) / 512 (double) the kernels return NaN.
    n = torch.tensor([127.0, 128.0, 129.0, 600.0])
    check(S.hermite_polynomial_h, torch.tensor([0.1]), n, ops=[aten.special_hermite_polynomial_h.default])
    check(S.hermite_polynomial_he, torch.tensor([0.1]).double(), n.double(), ops=[aten.special_hermite_polynomial_he.default])


# -- zeta, polygamma ---------------------------------------------------------------------------------
ZX = torch.tensor([-2.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.5, 7.0, 30.0, INF, NAN])
ZQ = torch.tensor([-8.5, -3.0, -2.5, -0.0, 0.5, 1.0, 2.0, 9.5, 100.0, INF, NAN])


@pytest.mark.parametrize("dt", FLOATS, ids=str)
def test_zeta(dt):
    check(S.zeta, ZX[:, None].to(dt), ZQ.to(dt), ops=[aten.special_zeta.default])
    check(lambda q: S.zeta(3.0, q), ZQ.to(dt), ops=[aten.special_zeta.self_scalar])
    check(lambda x: S.zeta(x, 2.5), ZX.to(dt), ops=[aten.special_zeta.other_scalar])


PG = torch.cat([torch.tensor([-3.0, -2.5, -1.0, -0.0, 0.0, 1e-8, 0.5, 1.0, 9.0, 10.0, 1e6, INF, -INF, NAN]), torch.rand(20) * 18 - 9])


@pytest.mark.parametrize("dt", FLOATS, ids=str)
@pytest.mark.parametrize("n", [0, 1, 2, 3, 4])
def test_polygamma(n, dt):
    check(lambda x: torch.polygamma(n, x), PG.to(dt), ops=[aten.polygamma.default])


def test_polygamma_int_input():
    check(lambda x: torch.polygamma(2, x), torch.arange(-3, 6), ops=[aten.polygamma.default])


# -- incomplete gamma --------------------------------------------------------------------------------
G = torch.tensor([0.0, 1e-3, 0.3, 0.5, 1.0, 1.05, 1.5, 5.0, 21.0, 25.0, 150.0, 250.0, 1e4, INF, NAN, -1.0])


@pytest.mark.parametrize("dt", FLOATS, ids=str)
@pytest.mark.parametrize("fn,op", [(torch.igamma, aten.igamma.default), (torch.igammac, aten.igammac.default)], ids=["igamma", "igammac"])
def test_incomplete_gamma(fn, op, dt):
    check(fn, G[:, None].to(dt), G.to(dt), ops=[op])
    # Random pairs, including a ~ x (the asymptotic series) for large a.
    a = torch.cat([torch.rand(40) * 10, torch.rand(40) * 300])
    x = torch.cat([torch.rand(40) * 20, a[40:] * (1 + (torch.rand(40) - 0.5) * 0.5)])
    check(fn, a.to(dt), x.to(dt), ops=[op])


# -- fmax, fmin, frexp, ldexp, signbit, nextafter --------------------------------------------------------
A = torch.tensor([[1.0, NAN, NAN, -0.0, 3.0, -INF], [2.0, 0.5, -7.0, 0.0, INF, 1e-3]])
B = torch.tensor([[NAN, 2.0, NAN, 0.0, -1.0, 5.0]])


@pytest.mark.parametrize("fn,op", [(torch.fmax, aten.fmax.default), (torch.fmin, aten.fmin.default)], ids=["fmax", "fmin"])
def test_fmax_fmin(fn, op):
    check(fn, A, B, ops=[op])
    check(fn, A.double(), B, ops=[op])  # promotes to float64
    check(fn, torch.tensor([3, -1, 4]), torch.tensor([[2], [5]]), ops=[op])  # int, broadcast
    check(fn, torch.tensor([3, -1, 4], dtype=torch.int32), torch.tensor([0.5, NAN, 9.0]), ops=[op])


FR = torch.tensor([0.0, -0.0, 1.0, -0.75, 0.5, 3.0, 1e-3, -1e30, 3e38, 1e-40, -1e-44, INF, -INF, NAN])


@pytest.mark.parametrize("dt", [torch.float32, torch.float64, torch.float16, torch.bfloat16], ids=str)
def test_frexp(dt):
    x = FR.to(dt)
    if dt is torch.float64:
        x = torch.cat([x, torch.tensor([1e-310, -5e-324, 1e300])])
    check(torch.frexp, x, ops=[aten.frexp.Tensor])


def test_ldexp():
    x = torch.randn(3, 4)
    e = torch.randint(-10, 10, (4,))
    check(torch.ldexp, x, e, ops=[aten.ldexp.Tensor])
    check(torch.ldexp, x.double(), e.to(torch.int32), ops=[aten.ldexp.Tensor])
    check(torch.ldexp, x, e.float(), ops=[aten.ldexp.Tensor])
    check(torch.ldexp, torch.arange(-3, 3), torch.arange(6), ops=[aten.ldexp.Tensor])  # -> float32


@pytest.mark.parametrize(
    "x",
    [FR, FR.double(), FR.half(), FR.bfloat16(), torch.arange(-3, 3), torch.arange(4, dtype=torch.uint8), torch.tensor([True, False])],
    ids=["f32", "f64", "f16", "bf16", "i64", "u8", "bool"],
)
def test_signbit(x):
    check(torch.signbit, x, ops=[aten.signbit.default])


@pytest.mark.parametrize("dt", FLOATS, ids=str)
def test_nextafter(dt):
    x = torch.tensor([0.0, -0.0, 1.0, -1.0, 1e-38, INF, -INF, NAN, 3.0]).to(dt)
    y = torch.tensor([[1.0], [-INF], [INF], [NAN], [0.0]]).to(dt)
    check(torch.nextafter, x, y, ops=[aten.nextafter.default])


def test_digamma_signed_zero_and_poles():
    x = torch.tensor([0.0, -0.0, -1.0, -2.5, 0.5, 3.0, 1e-8])
    check(lambda a: torch.digamma(a), x, ops=[torch.ops.aten.digamma.default])
