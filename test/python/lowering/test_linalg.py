"""Dense linear algebra lowerings (compiler/lowering/linalg/) against eager.

Factorizations that are unique (Cholesky, LU with LAPACK's pivoting, Householder QR,
solves, determinants, eigen/singular values) are compared with eager directly;
eigen- and singular vectors, unique only up to sign/phase, are checked by
reconstruction and orthonormality.
"""

import functools

import pytest
import torch
from harness import check, lower_and_run

aten = torch.ops.aten
torch.manual_seed(0)

F64 = torch.float64
C128 = torch.complex128
TOL32 = {"rtol": 1e-4, "atol": 1e-5}


def _r(*shape, dtype=F64):
    return torch.randn(*shape, dtype=dtype)


def _spd(*shape, dtype=F64):
    a = torch.randn(*shape, dtype=dtype)
    return a @ a.mH + shape[-1] * torch.eye(shape[-1], dtype=dtype)


# -- Cholesky and triangular solves -------------------------------------------------------------
@pytest.mark.parametrize("dtype,upper", [(F64, False), (F64, True), (C128, True), (torch.float32, False)])
def test_cholesky_ex(dtype, upper):
    tol = TOL32 if dtype is torch.float32 else {}
    check(lambda a: torch.linalg.cholesky_ex(a, upper=upper), _spd(2, 4, 4, dtype=dtype),
          ops=[aten.linalg_cholesky_ex.default], **tol)
    check(lambda a: aten.cholesky(a, upper), _spd(5, 5, dtype=dtype), ops=[aten.cholesky.default], **tol)


def test_cholesky_info_and_edge_shapes():
    a = _spd(3, 4, 4)
    a[1, 2, 2] = -100.0  # leading minor 3 not positive definite
    a[2, 0, 0] = float("nan")
    _, info = lower_and_run(lambda a: torch.linalg.cholesky_ex(a), a)[0]
    assert info.tolist() == torch.linalg.cholesky_ex(a).info.tolist() == [0, 3, 1]
    check(lambda a: torch.linalg.cholesky_ex(a), torch.ones(1, 1, dtype=F64))
    check(lambda a: torch.linalg.cholesky_ex(a), torch.ones(0, 0, dtype=F64))
    check(lambda a: torch.linalg.cholesky_ex(a), torch.ones(0, 3, 3, dtype=F64))


@pytest.mark.parametrize(
    "dtype,upper,left,unit",
    [(F64, False, True, False), (F64, True, True, True), (F64, False, False, True), (F64, True, False, False),
     (C128, True, False, False)],
)
def test_solve_triangular(dtype, upper, left, unit):
    a = _r(2, 4, 4, dtype=dtype) + 4 * torch.eye(4, dtype=dtype)
    b = _r(3, 1, 4, 2, dtype=dtype)  # batch dims broadcast against a's
    b = b if left else b.mT
    check(lambda a, b: torch.linalg.solve_triangular(a, b, upper=upper, left=left, unitriangular=unit), a, b,
          ops=[aten.linalg_solve_triangular.default])


@pytest.mark.parametrize("transpose,upper", [(False, True), (True, False)])
def test_triangular_solve(transpose, upper):
    a = _r(2, 4, 4) + 4 * torch.eye(4, dtype=F64)
    check(lambda b, a: aten.triangular_solve(b, a, upper, transpose, False), _r(3, 1, 4, 2), a,
          ops=[aten.triangular_solve.default])
    check(lambda b, a: aten.triangular_solve(b, a, not upper, transpose, True), _r(4, 3), a[0],
          ops=[aten.triangular_solve.default])


@pytest.mark.parametrize("upper", [False, True])
def test_cholesky_solve_and_inverse(upper):
    for dtype in (F64, C128) if upper else (F64,):
        factor = torch.linalg.cholesky(_spd(2, 4, 4, dtype=dtype), upper=upper)
        check(lambda b, f: aten.cholesky_solve(b, f, upper), _r(3, 1, 4, 2, dtype=dtype), factor,
              ops=[aten.cholesky_solve.default])
        check(lambda f: aten.cholesky_inverse(f, upper), factor, ops=[aten.cholesky_inverse.default])
    if upper:
        check(lambda b, f: aten.cholesky_solve(b, f, upper), torch.zeros(0, 0), torch.zeros(0, 0))
        check(lambda f: aten.cholesky_inverse(f, upper), torch.zeros(0, 0))


# -- LU ---------------------------------------------------------------------------------------------
# Exactly singular under any rounding: multipliers are powers of two.
SINGULAR = torch.tensor([[1.0, 2, 4], [2, 4, 8], [4, 1, 2]], dtype=F64)


@pytest.mark.parametrize(
    "dtype,shape", [(F64, (3, 5)), (F64, (5, 3)), (F64, (2, 3, 4, 4)), (F64, (1, 1)), (C128, (2, 4, 3)),
                    (torch.float32, (5, 5))],
)
def test_lu_factor_and_unpack(dtype, shape):
    tol = TOL32 if dtype is torch.float32 else {}
    x = _r(*shape, dtype=dtype)
    check(lambda a: torch.linalg.lu_factor_ex(a), x, ops=[aten.linalg_lu_factor_ex.default], **tol)
    check(lambda a: torch.linalg.lu(a), x, ops=[aten.linalg_lu.default], **tol)
    lu, piv = torch.linalg.lu_factor(x)
    check(lambda lu, p: torch.lu_unpack(lu, p), lu, piv, ops=[aten.lu_unpack.default], **tol)


def test_lu_singular_and_flags():
    x = torch.stack([_r(3, 3), SINGULAR, torch.zeros(3, 3, dtype=F64)])
    check(lambda a: torch.linalg.lu_factor_ex(a), x, ops=[aten.linalg_lu_factor_ex.default])
    lu, piv = torch.linalg.lu_factor(_r(4, 3))
    check(lambda lu, p: torch.lu_unpack(lu, p, unpack_data=False), lu, piv)
    check(lambda lu, p: torch.lu_unpack(lu, p, unpack_pivots=False), lu, piv)
    check(lambda a: torch.linalg.lu_factor_ex(a), torch.zeros(0, 0, dtype=F64))


def test_lu_without_pivoting():
    x = _spd(2, 4, 4)  # no pivoting needed for stability
    (lu, piv, info), _, _ = lower_and_run(lambda a: torch.linalg.lu_factor_ex(a, pivot=False), x)
    assert piv.tolist() == [[1, 2, 3, 4]] * 2 and info.tolist() == [0, 0]
    torch.testing.assert_close((lu.tril(-1) + torch.eye(4, dtype=F64)) @ lu.triu(), x)
    (p, l, u), _, _ = lower_and_run(lambda a: torch.linalg.lu(a, pivot=False), x)
    assert p.shape == (0,)
    torch.testing.assert_close(l @ u, x)


@pytest.mark.parametrize(
    "dtype,left,adjoint", [(F64, True, False), (F64, True, True), (F64, False, False), (F64, False, True),
                           (C128, False, True)],
)
def test_lu_solve(dtype, left, adjoint):
    lu, piv = torch.linalg.lu_factor(_r(2, 4, 4, dtype=dtype))
    b = _r(3, 1, 4, 2, dtype=dtype)
    b = b if left else b.mT
    check(lambda lu, p, b: torch.linalg.lu_solve(lu, p, b, left=left, adjoint=adjoint), lu, piv, b,
          ops=[aten.linalg_lu_solve.default])


@pytest.mark.parametrize("dtype", [F64, C128])
def test_det_slogdet(dtype):
    x = _r(2, 4, 4, dtype=dtype)
    check(lambda a: torch.linalg.det(a), x, ops=[aten._linalg_det.default])
    check(lambda a: aten._linalg_det(a.mT), x)  # not contiguous: factors A itself
    check(lambda a: aten._linalg_det(a), x)  # LU and pivots of A^T, as eager
    check(lambda a: aten._linalg_slogdet(a), x, ops=[aten._linalg_slogdet.default])
    check(lambda a: torch.logdet(a), _spd(3, 3, dtype=dtype))


def test_det_singular_and_empty():
    x = torch.stack([_r(3, 3), SINGULAR, torch.zeros(3, 3, dtype=F64)])
    check(lambda a: torch.linalg.slogdet(a), x)
    check(lambda a: torch.linalg.det(a), x)
    check(lambda a: torch.linalg.det(a), torch.zeros(0, 0, dtype=F64))
    check(lambda a: torch.linalg.slogdet(a), torch.zeros(2, 0, 0, dtype=F64))


def test_solve_ex_and_inv_ex():
    a = _r(2, 4, 4)
    check(lambda a, b: torch.linalg.solve_ex(a, b), a, _r(3, 1, 4, 2), ops=[aten._linalg_solve_ex.default])
    check(lambda a, b: aten._linalg_solve_ex(a, b), a, _r(2, 4, 2))  # LU, pivots of A
    check(lambda a, b: torch.linalg.solve_ex(a, b, left=False), a, _r(2, 3, 4))
    check(lambda a, b: torch.linalg.solve_ex(a, b), a, _r(4))  # vector rhs
    check(lambda a, b: torch.linalg.solve_ex(a, b), a, _r(2, 4))  # batched vector rhs
    check(lambda a: torch.linalg.inv_ex(a), a, ops=[aten.linalg_inv_ex.default])
    c = _r(2, 4, 4, dtype=C128)
    check(lambda a, b: aten._linalg_solve_ex(a, b, left=False), c, _r(3, 4, dtype=C128))
    check(lambda a: torch.linalg.inv_ex(a), c)
    check(lambda a: torch.linalg.inv_ex(a), a.float(), **TOL32)


def test_solve_inv_singular_and_empty():
    x = torch.stack([_r(3, 3), SINGULAR])
    _, info = lower_and_run(lambda a: torch.linalg.inv_ex(a), x)[0]
    assert info.tolist() == torch.linalg.inv_ex(x).info.tolist() == [0, 3]
    check(lambda a: torch.linalg.inv_ex(a), torch.zeros(0, 0))
    check(lambda a, b: torch.linalg.solve_ex(a, b), torch.zeros(2, 0, 0), torch.zeros(2, 0, 3))


# -- QR -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "dtype,shape,mode", [(F64, (5, 2), "complete"), (F64, (2, 5), "reduced"), (F64, (2, 3, 4), "r"),
                         (F64, (3, 0), "complete"), (C128, (2, 5, 4), "complete"), (C128, (4, 4), "reduced")],
)
def test_geqrf_qr(dtype, shape, mode):
    x = _r(*shape, dtype=dtype)
    check(lambda a: torch.geqrf(a), x, ops=[aten.geqrf.default])
    check(lambda a: torch.linalg.qr(a, mode=mode), x, ops=[aten.linalg_qr.default])


def test_qr_float32_and_zero_column():
    check(lambda a: torch.linalg.qr(a), torch.randn(6, 4), ops=[aten.linalg_qr.default], **TOL32)
    x = torch.tensor([[0.0, 1.0], [0.0, 2.0], [0.0, 0.0]])  # tau = 0 for the zero column
    check(lambda a: torch.geqrf(a), x)


@pytest.mark.parametrize("dtype", [F64, C128])
def test_householder_product(dtype):
    a, tau = torch.geqrf(_r(2, 5, 3, dtype=dtype))
    check(lambda a, t: torch.linalg.householder_product(a, t), a, tau,
          ops=[aten.linalg_householder_product.default])
    check(lambda a, t: torch.linalg.householder_product(a, t[..., :2]), a, tau)


@pytest.mark.parametrize(
    "dtype,left,transpose", [(F64, True, False), (F64, True, True), (F64, False, False), (F64, False, True),
                             (C128, True, True), (C128, False, False)],
)
def test_ormqr(dtype, left, transpose):
    a, tau = torch.geqrf(_r(2, 5, 3, dtype=dtype))
    c = _r(2, 5, 4, dtype=dtype) if left else _r(2, 4, 5, dtype=dtype)
    check(lambda a, t, c: torch.ormqr(a, t, c, left=left, transpose=transpose), a, tau, c,
          ops=[aten.ormqr.default])


# -- eigh and SVD ---------------------------------------------------------------------------------------
def _close(a, b, dtype):
    tol = {"rtol": 1e-4, "atol": 1e-4} if dtype in (torch.float32, torch.complex64) else {"rtol": 1e-9, "atol": 1e-9}
    torch.testing.assert_close(a, b, **tol)


@pytest.mark.parametrize(
    "dtype,shape", [(torch.float32, (5, 5)), (torch.float32, (2, 3, 3)), (F64, (8, 8)), (F64, (1, 1)),
                    (torch.complex64, (5, 5)), (C128, (2, 3, 3))],
)
def test_eigh(dtype, shape):
    x = _r(*shape, dtype=dtype)
    for uplo in ("L", "U"):
        values, vectors = lower_and_run(functools.partial(torch.linalg.eigh, UPLO=uplo), x)[0]
        sym = torch.linalg.eigh(x, UPLO=uplo)
        _close(values, sym.eigenvalues, dtype)
        herm = sym.eigenvectors @ torch.diag_embed(sym.eigenvalues.to(dtype)) @ sym.eigenvectors.mH
        _close(vectors @ torch.diag_embed(values.to(dtype)) @ vectors.mH, herm, dtype)
        _close(vectors.mH @ vectors, torch.eye(shape[-1], dtype=dtype).expand_as(vectors), dtype)
    check(lambda a: torch.linalg.eigvalsh(a), x, rtol=1e-4, atol=1e-4, ops=[aten._linalg_eigh.default])


def test_eigh_degenerate_and_empty():
    for x in (torch.eye(4, dtype=F64), torch.zeros(3, 3, dtype=F64), torch.ones(4, 4, dtype=F64)):
        check(lambda a: torch.linalg.eigvalsh(a), x, atol=1e-12, rtol=0)
        values, vectors = lower_and_run(lambda a: torch.linalg.eigh(a), x)[0]
        _close(vectors @ torch.diag_embed(values) @ vectors.mT, x, F64)
    check(lambda a: torch.linalg.eigh(a), torch.zeros(0, 0))


def _check_svd(x, full_matrices):
    dtype = x.dtype
    u, s, vh = lower_and_run(lambda a: torch.linalg.svd(a, full_matrices=full_matrices), x)[0]
    eu, es, evh = torch.linalg.svd(x, full_matrices=full_matrices)
    assert u.shape == eu.shape and vh.shape == evh.shape
    _close(s, es, dtype)
    k = s.shape[-1]
    _close((u[..., :k] * s.unsqueeze(-2).to(dtype)) @ vh[..., :k, :], x, dtype)
    _close(u.mH @ u, torch.eye(u.shape[-1], dtype=dtype).expand(*u.shape[:-2], -1, -1), dtype)
    _close(vh @ vh.mH, torch.eye(vh.shape[-2], dtype=dtype).expand(*vh.shape[:-2], -1, -1), dtype)


@pytest.mark.parametrize(
    "dtype,shape,full_matrices", [(torch.float32, (5, 5), False), (torch.float32, (2, 4, 3), True),
                                  (F64, (3, 5), True), (F64, (6, 1), False), (torch.complex64, (5, 3), True),
                                  (C128, (2, 3, 4), False)],
)
def test_svd(dtype, shape, full_matrices):
    x = _r(*shape, dtype=dtype)
    _check_svd(x, full_matrices)
    check(lambda a: torch.linalg.svdvals(a), x, rtol=1e-4, atol=1e-5, ops=[aten._linalg_svd.default])


def test_svd_rank_deficient_and_empty():
    x = _r(6, 2) @ _r(2, 4)  # rank 2
    _check_svd(x, False)
    _check_svd(x, True)
    _check_svd(torch.zeros(3, 2, dtype=F64), True)
    check(lambda a: torch.linalg.matrix_rank(a), torch.stack([x, _r(6, 4)]))
    for shape in [(0, 0), (0, 3), (3, 0), (2, 0, 2)]:
        for full_matrices in (False, True):
            check(functools.partial(torch.linalg.svd, full_matrices=full_matrices), torch.zeros(shape))


def test_svd_based_norms():
    x = _r(2, 4, 3)
    check(lambda a: torch.linalg.matrix_norm(a, ord=2), x)
    check(lambda a: torch.linalg.matrix_norm(a, ord="nuc"), x)
    check(lambda a: torch.linalg.cond(a[..., :3, :]), x)


# -- pinv and matrix_exp --------------------------------------------------------------------------------
def test_pinv():
    x = torch.randn(5, 5)
    check(lambda a: torch.linalg.pinv(a), x, ops=[aten.linalg_pinv.atol_rtol_tensor], **TOL32)
    check(lambda a: torch.linalg.pinv(a, rtol=0.5), x, **TOL32)
    check(lambda a: torch.linalg.pinv(a + a.mT, hermitian=True), x, **TOL32)
    check(lambda a: torch.linalg.pinv(a, atol=0.5), _r(2, 3, 4))
    check(lambda a: torch.pinverse(a, rcond=0.1), _r(4, 2, dtype=C128))
    check(lambda a: torch.linalg.pinv(a + a.mH, hermitian=True, rtol=0.3), _r(3, 3, dtype=C128))


def test_pinv_rank_deficient_batched_tolerance_and_empty():
    x = _r(6, 2) @ _r(2, 4)
    check(lambda a: torch.linalg.pinv(a), x)
    check(lambda a, t: torch.linalg.pinv(a, atol=t), _r(2, 3, 4), torch.tensor([0.5, 1.5], dtype=F64))
    check(lambda a: torch.linalg.pinv(a), torch.zeros(3, 0))


def test_matrix_exp():
    x = _r(8, 4, 4)
    # a batch with one 1-norm per Taylor degree (1, 2, 4, 8, 12, 18) and for scaling and
    # squaring, each matrix with its own number of squarings
    scales = torch.tensor([1e-17, 1e-9, 1e-5, 1e-2, 0.1, 0.5, 3.0, 20.0], dtype=F64)
    norms = x.abs().sum(-2).amax(-1)
    y = x * (scales / norms)[:, None, None]
    check(lambda a: torch.linalg.matrix_exp(a), y, ops=[aten.linalg_matrix_exp.default])
    check(lambda a: torch.linalg.matrix_exp(a), y.float(), **TOL32)
    check(lambda a: torch.linalg.matrix_exp(a), _r(2, 3, 3, dtype=C128))
    check(lambda a: torch.linalg.matrix_exp(a), _r(2, 1, 1))
    check(lambda a: torch.linalg.matrix_exp(a), torch.zeros(0, 0))


# -- LDL^T (Bunch-Kaufman) ----------------------------------------------------------------------------
# 2x2 pivots everywhere (zero diagonal), and a mix of 1x1 pivots with and without interchanges.
ZERO_DIAGONAL = torch.tensor([[0.0, 1, 2], [1, 0, 3], [2, 3, 0]], dtype=F64)
MIXED = torch.tensor([[1e-3, 1, 2, 0.5], [1, 1e-3, 3, 1], [2, 3, 10, 2], [0.5, 1, 2, 1e-4]], dtype=F64)


@pytest.mark.parametrize("dtype,shape", [(F64, (2, 6, 6)), (C128, (5, 5)), (torch.float32, (3, 4, 4))])
def test_ldl_factor_and_solve(dtype, shape):
    tol = TOL32 if dtype is torch.float32 else {}
    x = _r(*shape, dtype=dtype)  # random: 1x1 and 2x2 pivots (pivots < 0)
    check(lambda a: torch.linalg.ldl_factor_ex(a), x, ops=[aten.linalg_ldl_factor_ex.default], **tol)
    ld, piv = torch.linalg.ldl_factor(x)
    check(lambda ld, p, b: torch.linalg.ldl_solve(ld, p, b), ld, piv, _r(*shape[:-1], 3, dtype=dtype),
          ops=[aten.linalg_ldl_solve.default], **tol)


def test_ldl_pivoting_cases():
    x = torch.stack([ZERO_DIAGONAL, MIXED[:3, :3], torch.zeros(3, 3, dtype=F64)])  # the last: info = 1
    check(lambda a: torch.linalg.ldl_factor_ex(a), x)
    check(lambda a: torch.linalg.ldl_factor_ex(a), MIXED)
    ld, piv = torch.linalg.ldl_factor(MIXED)
    check(lambda ld, p, b: torch.linalg.ldl_solve(ld, p, b), ld, piv, _r(2, 4, 2))  # broadcast batch
    check(lambda a: torch.linalg.ldl_factor_ex(a), torch.zeros(0, 0))
