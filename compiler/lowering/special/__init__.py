"""Special functions and the remaining elementwise math: Bessel and Airy functions,
orthogonal polynomials, erfc/erfcx/ndtri/log_ndtr, zeta/polygamma, the regularized
incomplete gamma functions, and fmax/fmin/frexp/ldexp/signbit/nextafter.

CHLO supplies erfc, nextafter and lgamma. Everything else reproduces PyTorch's CPU
kernel (aten/src/ATen/native/Math.h: Cephes rational and Chebyshev approximations,
SciPy's incomplete gamma, Faddeeva's erfcx) operation by operation in the kernel's own
dtype -- float32 for float32 (and for float16/bfloat16/integer inputs, which promote or
upcast to float), float64 for float64 -- so results agree with eager to a few ulps.
Where the kernel accumulates in double for float inputs in a way that matters (zeta, and
so polygamma for n >= 2; digamma's reflection term), we do too. CHLO's zeta and digamma
are not used: they differ from PyTorch for q <= 0 and at 0.

Each branch of a kernel's `if` chain is computed for every element and the chain becomes
a cascade of selects (`_chain`). The kernels' data-dependent loops (power series,
continued fractions, polynomial recurrences) become `stablehlo.while` loops that run
while any element is still iterating, each element keeping its state once its own loop
would have exited (`_loop`, `_recurrence`); like the kernels, they run as long as the
inputs demand (e.g. about max(n) steps for a Legendre polynomial of degree n).

Known differences from eager: the polynomials of high degree (n in the hundreds) in
float32 are ill-conditioned and differ by about n ulps, as eager itself does from the
exact value; where a kernel returns an uninitialized value (Chebyshev U/V/W and
Laguerre/Legendre recurrences at x = NaN) we return NaN; and XLA:CPU flushes subnormal
results to zero. The coefficient tables live in `_tables.py`.

Modules: `bessel.py` (Bessel, Airy, modified Bessel), `error_functions.py` (erfc, erfcx,
ndtri, log_ndtr), `gamma.py` (zeta, digamma, polygamma, igamma/igammac), `polynomials.py`,
`floating_point.py` (fmax, fmin, frexp, ldexp, signbit, nextafter); the value class, loops
and dtype plumbing they share are in `_values.py`. Their lowerings form one family, `special`.
"""

from __future__ import annotations

from ..registry import Padding, declare_padding
from . import bessel, error_functions, floating_point, gamma, polynomials  # noqa: F401  (fill the table)

# Bounded dynamism: every op here reads only the same position of its operands.
declare_padding(Padding.SAFE, family="special")
