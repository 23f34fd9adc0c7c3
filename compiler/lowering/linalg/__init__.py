"""Dense linear algebra: Cholesky and triangular solves (native `stablehlo.cholesky` /
`stablehlo.triangular_solve`), LU with partial pivoting, Householder QR, LDL^T with
Bunch-Kaufman pivoting, symmetric eigendecomposition and SVD (Jacobi), and what PyTorch
builds on them (solve, inv, det, slogdet, lu_solve, lu_unpack, householder_product,
ormqr, ldl_solve, pinv, matrix_exp).

Algorithms without a StableHLO op are written as `stablehlo.while` loops over
elementwise, masked updates of the whole (batched) matrix, so every batch element
takes the same steps and no dynamic shapes appear:

* LU: LAPACK getrf's partial pivoting (the first row of largest |a| — |re|+|im| for
  complex — at or below the diagonal), 1-based int32 pivots, `info` = the first zero
  pivot, so pivots and factors equal eager's up to rounding.
* LDL^T: LAPACK sytf2's Bunch-Kaufman pivoting (uplo 'L'; negative pivots mark 2x2
  blocks), real and complex-symmetric; each matrix of a batch advances by 1 or 2
  columns per step. Complex Hermitian (hetrf) is not lowered.
* QR: LAPACK geqrf's Householder reflectors (beta = -sign(alpha) * norm, tau =
  (beta - alpha) / beta), so `geqrf`, `linalg_qr`, `householder_product` and `ormqr`
  equal eager's up to rounding.
* eigh: cyclic Jacobi with round-robin (parallel) ordering until the off-diagonal part
  is below eps relative to the matrix; eigenvalues ascending. SVD: one-sided (Hestenes)
  Jacobi, then a Householder QR of the rotated columns for U. Singular values and
  eigenvalues equal eager's; singular/eigen *vectors* are unique only up to sign
  (phase), which LAPACK fixes by its own algorithm's accident; ours may differ.
* matrix_exp: PyTorch's own algorithm (Bader-Blanes-Casas Taylor approximants chosen
  by the 1-norm, scaling and squaring), step by step.

Products inside these algorithms run at HIGHEST precision whatever
`torch.get_float32_matmul_precision()` says (PyTorch's linalg kernels never use TF32).

Errors: `info` outputs are computed as LAPACK defines them (cholesky: 1 + the first
non-positive pivot; LU: 1 + the first exactly-zero pivot; LDL: 1 + the first zero
column). The `_linalg_check_errors` that `torch.linalg.inv/solve/cholesky/lu_factor`
add to raise on a nonzero info is dropped (checks.py): a singular or non-positive-
definite input gives inf/NaN results instead of an error.

`_linalg_det` and `_linalg_slogdet` return the LU factorization of A^T instead of A
when A is real and contiguous (their backward formulas rely on it); the lowerings do
the same, reading contiguity from the FX node's metadata.

Modules, one per algorithm: `cholesky.py` (with the triangular solves), `lu.py`, `qr.py`,
`spectral.py` (eigh, SVD), `ldl.py`, `matrix_functions.py` (pinv, matrix_exp); the
builders they share are in `_builders.py`. Their lowerings form one family, `linalg`.
"""

from __future__ import annotations

from ..registry import Padding, declare_padding
from . import cholesky, ldl, lu, matrix_functions, qr, spectral  # noqa: F401  (fill the table)

# Bounded dynamism: factorizations and solves over padded matrices are not masked.
declare_padding(Padding.EAGER, family="linalg")
