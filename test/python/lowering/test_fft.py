"""FFT and complex-helper lowerings against eager."""

import pytest
import torch
from harness import check

aten = torch.ops.aten
torch.manual_seed(0)
R = torch.randn(3, 4, 6)
C = torch.randn(3, 4, 6, dtype=torch.complex64)
TOL = {"rtol": 1e-4, "atol": 1e-4}


@pytest.mark.parametrize("norm", [None, "ortho", "forward", "backward"])
def test_fft_c2c(norm):
    check(lambda x: torch.fft.fft(x, norm=norm), C, ops=[aten._fft_c2c.default], **TOL)
    check(lambda x: torch.fft.ifft(x, dim=1, norm=norm), C, **TOL)
    check(lambda x: torch.fft.fftn(x, dim=(0, 2), norm=norm), C, **TOL)
    check(lambda x: torch.fft.ifft2(x, norm=norm), C, **TOL)


def test_fft_c2c_many_dims_and_real_input():
    x = torch.randn(2, 3, 2, 4, 5, dtype=torch.complex128)
    check(lambda x: torch.fft.fftn(x), x)  # 5 dims: two rounds
    check(lambda x: torch.fft.ifftn(x, dim=(4, 0, 2, 1)), x)
    check(lambda x: torch.fft.fft(x), R, **TOL)  # real input promoted to complex
    check(lambda x: aten._fft_c2c(x, [0, 2], 1, False), C, **TOL)


@pytest.mark.parametrize("norm", [None, "ortho", "forward"])
def test_fft_r2c(norm):
    check(lambda x: torch.fft.rfft(x, norm=norm), R, ops=[aten._fft_r2c.default], **TOL)
    check(lambda x: torch.fft.rfft(x, dim=0, norm=norm), R, **TOL)
    check(lambda x: torch.fft.rfftn(x, dim=(2, 0), norm=norm), R, **TOL)  # halves dim 0
    check(lambda x: torch.fft.rfft2(x, s=(5, 8), norm=norm), R, **TOL)  # padded
    check(lambda x: torch.fft.ihfft(x, norm=norm), R, **TOL)


def test_fft_r2c_two_sided_and_many_dims():
    check(lambda x: aten._fft_r2c(x, [1, 2], 0, False), R, **TOL)
    x = torch.randn(2, 3, 2, 4, 5, dtype=torch.float64)
    check(lambda x: torch.fft.rfftn(x), x)
    check(lambda x: torch.fft.rfft(x), torch.randn(7, dtype=torch.float64))


@pytest.mark.parametrize("norm", [None, "ortho", "forward"])
def test_fft_c2r(norm):
    check(lambda x: torch.fft.irfft(x, norm=norm), C, ops=[aten._fft_c2r.default], **TOL)
    check(lambda x: torch.fft.irfft(x, n=7, norm=norm), C, **TOL)
    check(lambda x: torch.fft.irfftn(x, dim=(0, 1), norm=norm), C, **TOL)
    check(lambda x: torch.fft.hfft(x, norm=norm), C, **TOL)


def test_fft_c2r_many_dims():
    x = torch.randn(2, 3, 2, 4, 5, dtype=torch.complex128)
    check(lambda x: torch.fft.irfftn(x), x)
    check(lambda x: torch.fft.irfftn(x, s=(2, 2, 2, 6), dim=(0, 1, 3, 4)), x)


def test_fft_roundtrip_and_empty():
    check(lambda x: torch.fft.irfft(torch.fft.rfft(x), n=6), R, **TOL)


# -- complex helpers ----------------------------------------------------------------------------
def test_real_imag_conj():
    check(lambda x: torch.real(x) * 2, C)
    check(lambda x: torch.imag(x) * 2, C)
    check(lambda x: aten.real(x) + 1, R)
    check(lambda x: aten.imag(x) + 1, C)
    check(lambda x: aten.conj(x).clone(), C)
    check(lambda x: aten._conj(x), C, ops=[aten._conj.default])
    check(lambda x: torch.conj_physical(x), C, ops=[aten._conj_physical.default])
    check(lambda x: aten.conj_physical(x), C)
    check(lambda x: aten.conj_physical(x), R)


def test_complex_polar_angle():
    a, b = torch.randn(3, 4), torch.randn(4)
    check(lambda a, b: torch.complex(a, b), a, b, ops=[aten.complex.default])
    check(lambda a, b: torch.complex(a, b), a.double(), b.double())
    check(lambda a, b: torch.polar(a, b), a.abs(), b, ops=[aten.polar.default], **TOL)
    check(lambda x: torch.angle(x), C, ops=[aten.angle.default], **TOL)
    check(lambda x: torch.angle(x), torch.tensor([-1.0, 0.0, -0.0, 2.0, float("nan"), -float("inf")]))
    check(lambda x: torch.angle(x), torch.tensor([-3, 0, 5]))
