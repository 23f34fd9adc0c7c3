"""Reductions, scans, sorting and softmax lowerings against eager."""

import pytest
import torch
from direct_graph import check_direct
from harness import check

aten = torch.ops.aten
NAN = float("nan")
INF = float("inf")

torch.manual_seed(0)
X = torch.randn(3, 4, 5)
X64 = torch.randn(2, 3, dtype=torch.float64)
S = torch.tensor(1.5)  # rank 0
ONE = torch.randn(1, 4, 1)
I = torch.randint(-5, 6, (3, 4))
B = torch.rand(3, 4) > 0.5
U8 = torch.randint(0, 3, (3, 4), dtype=torch.uint8)
EMPTY = torch.randn(0, 3)
H = torch.randn(4, 6).to(torch.bfloat16)
C = torch.randn(3, 4, dtype=torch.complex64)
# NaNs in distinct places, ties, and infinities.
XN = torch.tensor(
    [[1.0, NAN, 3.0, 3.0, NAN], [2.0, 2.0, -INF, 0.0, -1.0], [INF, 5.0, 5.0, NAN, 1.0]]
)
TIES = torch.tensor([[3.0, 1.0, 3.0, 1.0], [0.0, -0.0, 0.0, 2.0], [7.0, 7.0, 7.0, 7.0]])
IT = torch.tensor([[4, 1, 4, 1], [0, 0, 2, 2], [-3, 5, -3, 5]])


def tupled(fn, *args, **kwargs):
    """x -> tuple(fn(x, *args, **kwargs)): binds loop variables (make_fx traces every
    parameter, so default-argument binding will not do) and unpacks return types."""
    return lambda x: tuple(fn(x, *args, **kwargs))


# -- sum, mean, prod, nansum ----------------------------------------------------------------------
@pytest.mark.parametrize(
    "fn,args",
    [
        (lambda x: x.sum(1), (X,)),
        (lambda x: x.sum(-1, keepdim=True), (X,)),
        (lambda x: x.sum((0, 2)), (X,)),
        (lambda x: x.sum([]), (X,)),
        (lambda x: aten.sum.dim_IntList(x, None), (X,)),
        (lambda x: x.sum(0), (S,)),
        (lambda x: x.sum(2, keepdim=True), (ONE,)),
        (lambda x: x.sum(1, dtype=torch.float64), (X,)),
        (lambda x: x.sum(1), (I,)),
        (lambda x: x.sum(0), (B,)),
        (lambda x: x.sum(0), (EMPTY,)),
        (lambda x: x.sum(1), (H,)),
        (lambda x: x.sum(0), (C,)),
        (lambda x: x.sum(1, dtype=torch.int32), (X * 3,)),
    ],
)
def test_sum_dim(fn, args):
    check(fn, *args, ops=[aten.sum.dim_IntList])


@pytest.mark.parametrize("x", [X, S, I, B, EMPTY, X64, C])
def test_sum_default(x):
    check(lambda x: x.sum(), x, ops=[aten.sum.default])
    check(
        lambda x: x.sum(dtype=torch.float64),
        x.real if x.is_complex() else x,
        ops=[aten.sum.default],
    )


@pytest.mark.parametrize(
    "fn,args",
    [
        (lambda x: x.mean(1), (X,)),
        (lambda x: x.mean((-1, 0), keepdim=True), (X,)),
        (lambda x: x.mean(0), (S,)),
        (lambda x: x.mean(1, dtype=torch.float64), (I,)),
        (lambda x: x.mean(0), (EMPTY,)),
        (lambda x: x.mean(1), (H,)),
        (lambda x: x.mean(0), (C,)),
    ],
)
def test_mean_dim(fn, args):
    check(fn, *args, ops=[aten.mean.dim])


def test_mean_default():
    check(lambda x: x.mean(), X, ops=[aten.mean.default])
    check(lambda x: x.mean(), EMPTY, ops=[aten.mean.default])
    check(lambda x: x.mean(dtype=torch.float32), I, ops=[aten.mean.default])
    check(lambda x: x.mean(), H, ops=[aten.mean.default], atol=1e-2, rtol=1e-2)


def test_prod():
    small = torch.rand(3, 4) + 0.5
    check(lambda x: x.prod(), small, ops=[aten.prod.default])
    check(lambda x: x.prod(), I, ops=[aten.prod.default])
    check(lambda x: x.prod(), B, ops=[aten.prod.default])
    check(lambda x: x.prod(dtype=torch.float64), small, ops=[aten.prod.default])
    check(lambda x: x.prod(1), small, ops=[aten.prod.dim_int])
    check(lambda x: x.prod(-2, keepdim=True), I, ops=[aten.prod.dim_int])
    check(lambda x: x.prod(0), EMPTY, ops=[aten.prod.dim_int])
    check(lambda x: x.prod(0, dtype=torch.int32), B, ops=[aten.prod.dim_int])


def test_nansum():
    check(lambda x: torch.nansum(x), XN, ops=[aten.nansum.default])
    check(lambda x: torch.nansum(x, 1, keepdim=True), XN, ops=[aten.nansum.default])
    check(lambda x: torch.nansum(x, 0), I, ops=[aten.nansum.default])


# -- any, all, count_nonzero ---------------------------------------------------------------------
@pytest.mark.parametrize("name", ["any", "all"])
def test_any_all(name):
    packet = getattr(aten, name)
    fn = getattr(torch, name)
    zeros = torch.zeros(3, 4)
    for x in (X > 0.5, I, zeros, U8, S, XN, EMPTY):
        check(lambda x: fn(x), x, ops=[packet.default])
    check(lambda x: fn(x, 1), I, ops=[packet.dim])
    check(lambda x: fn(x, -1, keepdim=True), X > 0, ops=[packet.dim])
    check(lambda x: fn(x, 0), EMPTY, ops=[packet.dim])
    check(lambda x: fn(x, 0), U8, ops=[packet.dim])
    check(lambda x: fn(x, (0, 2)), X > 0, ops=[packet.dims])
    check(lambda x: fn(x, (1,), keepdim=True), I, ops=[packet.dims])
    check(lambda x: packet.dims(x, None), X > 1, ops=[packet.dims])
    check(lambda x: packet.dims(x, []), I, ops=[packet.dims])  # [] reduces nothing


def test_count_nonzero():
    check(lambda x: torch.count_nonzero(x), I, ops=[aten.count_nonzero.default])
    check(lambda x: torch.count_nonzero(x, 1), XN, ops=[aten.count_nonzero.default])
    check(lambda x: torch.count_nonzero(x, (0, 1)), B, ops=[aten.count_nonzero.dim_IntList])


# -- amax, amin, max, min, aminmax -------------------------------------------------------------
@pytest.mark.parametrize("name", ["amax", "amin"])
@pytest.mark.parametrize(
    "x,kwargs",
    [
        (X, {"dim": 1}),
        (X, {"dim": (0, -1), "keepdim": True}),
        (X, {}),
        (XN, {"dim": 1}),
        (XN, {"dim": 0}),
        (XN, {}),
        (I, {"dim": 0}),
        (B, {"dim": 1}),
        (S, {}),
        (H, {"dim": -1}),
        (X64, {"dim": [0]}),
        (U8, {"dim": 1}),
    ],
)
def test_amax_amin(name, x, kwargs):
    check(lambda x: getattr(torch, name)(x, **kwargs), x, ops=[getattr(aten, name).default])


@pytest.mark.parametrize("name", ["max", "min"])
def test_max_min(name):
    fn = getattr(torch, name)
    packet = getattr(aten, name)
    for x in (X, XN, I, B, S, TIES):
        check(lambda x: fn(x), x, ops=[packet.default])
    for x, dim, keepdim in (
        (X, 1, False),
        (XN, 1, False),
        (XN, 0, True),
        (TIES, 1, False),
        (TIES, 0, False),
        (IT, 1, True),
        (B, 0, False),
        (S, 0, False),
        (S, -1, True),
        (X64, -1, False),
        (H, 0, False),
    ):
        check(tupled(fn, dim, keepdim=keepdim), x, ops=[packet.dim])


def test_aminmax():
    check(lambda x: tuple(torch.aminmax(x)), XN, ops=[aten.aminmax.default])
    check(lambda x: tuple(torch.aminmax(x, dim=1, keepdim=True)), X, ops=[aten.aminmax.default])


# -- argmax, argmin ----------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["argmax", "argmin"])
@pytest.mark.parametrize(
    "x,kwargs",
    [
        (X, {"dim": 1}),
        (X, {}),
        (X, {"keepdim": True}),
        (XN, {"dim": 1}),
        (XN, {"dim": 0}),
        (XN, {}),
        (TIES, {"dim": 1}),
        (TIES, {"dim": 0, "keepdim": True}),
        (IT, {"dim": 1}),
        (IT, {}),
        (U8, {"dim": 0}),
        (S, {}),
        (S, {"dim": 0}),
        (S, {"dim": -1, "keepdim": True}),
        (H, {"dim": 1}),
        (X64, {"dim": -1}),
        (torch.tensor([-INF, -INF, 1.0]), {}),
        (torch.tensor([INF, INF]), {}),
    ],
)
def test_argmax_argmin(name, x, kwargs):
    check(lambda x: getattr(torch, name)(x, **kwargs), x, ops=[getattr(aten, name).default])


# -- var, std -------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "fn,op",
    [
        (lambda x: torch.var(x, 1), aten.var.correction),
        (lambda x: torch.var(x, (0, 2), keepdim=True, correction=0), aten.var.correction),
        (lambda x: torch.var(x, correction=2.5), aten.var.correction),
        (lambda x: torch.var(x), aten.var.correction),
        (lambda x: torch.std(x, 1), aten.std.correction),
        (lambda x: torch.std(x, correction=0), aten.std.correction),
        (lambda x: tuple(torch.var_mean(x, 1)), aten.var_mean.correction),
        (
            lambda x: tuple(torch.var_mean(x, (0, 1), correction=0, keepdim=True)),
            aten.var_mean.correction,
        ),
        (lambda x: tuple(torch.std_mean(x, -1)), aten.std_mean.correction),
    ],
)
def test_var_std(fn, op):
    check(fn, X, ops=[op])


def test_var_std_composite_overloads():
    # CompositeImplicit overloads: make_fx rewrites them to .correction, so build the node.
    check_direct(aten.var.dim, X, [1], False)
    check_direct(aten.var.dim, X, [0, -1], True, True)
    check_direct(aten.var.dim, X, None)
    check_direct(aten.var.default, X, False)
    check_direct(aten.std.dim, X, [2], False, True)
    check_direct(aten.std.default, X)
    check_direct(aten.var_mean.dim, X, [1], True, False)
    check_direct(aten.std_mean.default, X, False)


@pytest.mark.filterwarnings("ignore::UserWarning")  # var(): degrees of freedom <= 0
def test_var_edge_cases():
    check(lambda x: torch.var(x), S, ops=[aten.var.correction])  # N - correction = 0 -> nan
    check(
        lambda x: torch.var(x, 1, correction=3), torch.randn(2, 2), ops=[aten.var.correction]
    )  # inf
    check(lambda x: torch.var(x, 0), X64, ops=[aten.var.correction])
    check(lambda x: torch.var(x, 1), H, ops=[aten.var.correction], atol=2e-2, rtol=2e-2)
    check(lambda x: torch.var(x, 1), C, ops=[aten.var.correction])
    check(lambda x: torch.std(x, 0), C, ops=[aten.std.correction])
    check(lambda x: torch.var(x, 1), XN, ops=[aten.var.correction])
    check(lambda x: torch.var(x, 1), ONE, ops=[aten.var.correction])


# -- norms, logsumexp --------------------------------------------------------------------------
@pytest.mark.parametrize(
    "ord_,kwargs",
    [
        (2, {}),
        (2, {"dim": 1}),
        (1, {"dim": (0, 2), "keepdim": True}),
        (INF, {"dim": -1}),
        (-INF, {"dim": 1}),
        (0, {"dim": 1}),
        (3, {"dim": 0}),
        (0.5, {}),
        (-1, {"dim": 1}),
        (2, {"dtype": torch.float64}),
    ],
)
def test_vector_norm(ord_, kwargs):
    x = X.clone()
    x[0, 0, :2] = 0
    check(
        lambda x: torch.linalg.vector_norm(x, ord_, **kwargs),
        x,
        ops=[aten.linalg_vector_norm.default],
    )


def test_vector_norm_other_dtypes():
    op = [aten.linalg_vector_norm.default]
    check(lambda x: torch.linalg.vector_norm(x), C, ops=op)
    check(lambda x: torch.linalg.vector_norm(x, 1, 1), C, ops=op)
    check(lambda x: torch.linalg.vector_norm(x, dim=1), H, ops=op, atol=2e-2, rtol=2e-2)
    check(lambda x: torch.linalg.vector_norm(x), S, ops=op)
    check(lambda x: torch.linalg.vector_norm(x, dim=1), XN, ops=op)


def test_norm_overloads():
    check(lambda x: aten.norm.Scalar(x, 3), X, ops=[aten.norm.Scalar])
    check(lambda x: aten.norm.ScalarOpt_dim(x, None, [1]), X, ops=[aten.norm.ScalarOpt_dim])
    check(lambda x: aten.norm.ScalarOpt_dim(x, 1, [0, 2], True), X, ops=[aten.norm.ScalarOpt_dim])
    check(
        lambda x: aten.norm.ScalarOpt_dim_dtype(x, 2, [1], False, dtype=torch.float64),
        X,
        ops=[aten.norm.ScalarOpt_dim_dtype],
    )
    check(
        lambda x: aten.norm.ScalarOpt_dtype(x, 2, dtype=torch.float64),
        X,
        ops=[aten.norm.ScalarOpt_dtype],
    )


def test_logsumexp():
    op = [aten.logsumexp.default]
    check(lambda x: torch.logsumexp(x, 1), X * 30, ops=op)
    check(lambda x: torch.logsumexp(x, (0, 2), keepdim=True), X, ops=op)
    check(lambda x: torch.logsumexp(x, 1), XN, ops=op)
    inf_rows = torch.tensor([[-INF, -INF], [INF, 1.0], [-INF, 0.0]])
    check(lambda x: torch.logsumexp(x, 1), inf_rows, ops=op)
    check(lambda x: torch.logsumexp(x, 1), I, ops=op)
    check(lambda x: torch.logsumexp(x, 0), S, ops=op)
    check(lambda x: torch.logsumexp(x, 0), X64, ops=op)


# -- softmax family --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "x,dim",
    [
        (X * 20, 1),
        (X, -1),
        (X, 0),
        (S, 0),
        (ONE, 0),
        (X64, 1),
        (XN, 1),
        (torch.tensor([[-INF, 0.0], [-INF, -INF]]), 1),
    ],
)
def test_softmax(x, dim):
    check(lambda x: torch.softmax(x, dim), x, ops=[aten._softmax.default])
    check(lambda x: torch.log_softmax(x, dim), x, ops=[aten._log_softmax.default])


def test_softmax_low_precision_and_dtype():
    check(lambda x: torch.softmax(x, 1), H, ops=[aten._softmax.default], atol=1e-2, rtol=1e-2)
    check(
        lambda x: torch.log_softmax(x, 0), H, ops=[aten._log_softmax.default], atol=2e-2, rtol=2e-2
    )
    check(lambda x: torch.softmax(x, 1, dtype=torch.float64), X, ops=[aten._softmax.default])
    check(
        lambda x: torch.softmax(x, 1, dtype=torch.float32),
        H,
        ops=[aten._softmax.default],
        atol=1e-2,
        rtol=1e-2,
    )


def test_softmax_backward():
    g = torch.randn(3, 4, 5)
    y = torch.softmax(X, 1)
    check(
        lambda g, y: aten._softmax_backward_data(g, y, 1, torch.float32),
        g,
        y,
        ops=[aten._softmax_backward_data.default],
    )
    ly = torch.log_softmax(X, -1)
    check(
        lambda g, y: aten._log_softmax_backward_data(g, y, -1, torch.float32),
        g,
        ly,
        ops=[aten._log_softmax_backward_data.default],
    )
    gh, yh = g.to(torch.bfloat16), y.to(torch.bfloat16)
    check(
        lambda g, y: aten._softmax_backward_data(g, y, 0, torch.bfloat16),
        gh,
        yh,
        ops=[aten._softmax_backward_data.default],
        atol=1e-2,
        rtol=1e-2,
    )


def test_safe_softmax():
    x = torch.tensor([[-INF, -INF, -INF], [1.0, -INF, 2.0], [0.0, 0.0, 0.0]])
    check(lambda x: aten._safe_softmax(x, 1), x, ops=[aten._safe_softmax.default])
    check(lambda x: aten._safe_softmax(x, 0, torch.float64), x, ops=[aten._safe_softmax.default])


# -- scans -------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "x,dim,kwargs",
    [
        (X, 1, {}),
        (X, -1, {}),
        (X, 0, {}),
        (I, 1, {}),
        (B, 0, {}),
        (S, 0, {}),
        (EMPTY, 0, {}),
        (EMPTY, 1, {}),
        (X, 2, {"dtype": torch.float64}),
        (I, 0, {"dtype": torch.float32}),
        (XN, 1, {}),
        (H, 1, {}),
    ],
)
def test_cumsum_cumprod(x, dim, kwargs):
    tol = {"atol": 5e-2, "rtol": 2e-2} if x.dtype is torch.bfloat16 else {}
    check(lambda x: torch.cumsum(x, dim, **kwargs), x, ops=[aten.cumsum.default], **tol)
    small = x if not x.is_floating_point() else x.clamp(-2, 2)
    check(lambda x: torch.cumprod(x, dim, **kwargs), small, ops=[aten.cumprod.default], **tol)


@pytest.mark.parametrize("name", ["cummax", "cummin"])
def test_cummax_cummin(name):
    fn = getattr(torch, name)
    op = [getattr(aten, name).default]
    seq = torch.tensor([[2.0, 1.0, 1.0, NAN, 0.0, NAN, -1.0], [1.0, 3.0, 3.0, 0.0, 5.0, 5.0, -INF]])
    for x, dim in (
        (X, 1),
        (X, -1),
        (seq, 1),
        (seq, 0),
        (TIES, 1),
        (IT, 1),
        (B, 1),
        (S, 0),
        (EMPTY, 0),
    ):
        check(tupled(fn, dim), x, ops=op)


def test_logcumsumexp():
    op = [aten.logcumsumexp.default]
    check(lambda x: torch.logcumsumexp(x, 1), X * 10, ops=op)
    check(lambda x: torch.logcumsumexp(x, 0), X64, ops=op)
    rows = torch.tensor([[-INF, -INF, 0.0, -INF], [1.0, INF, 2.0, INF], [NAN, 1.0, 2.0, 3.0]])
    check(lambda x: torch.logcumsumexp(x, 1), rows, ops=op)
    check(lambda x: torch.logcumsumexp(x, 0), S, ops=op)


# -- sort, topk --------------------------------------------------------------------------------
SORTABLE = torch.tensor(
    [[NAN, 1.0, -0.0, 0.0, NAN, -1.0, INF, -INF], [3.0, 3.0, 1.0, 2.0, 1.0, 3.0, 0.0, 0.0]]
)


@pytest.mark.parametrize(
    "x,dim,descending",
    [
        (X, -1, False),
        (X, 1, True),
        (X, 0, False),
        (SORTABLE, 1, False),
        (SORTABLE, 1, True),
        (SORTABLE, 0, True),
        (IT, 1, False),
        (IT, 1, True),
        (B, 1, True),
        (B, 0, False),
        (S, 0, False),
        (U8, 1, True),
        (H, 1, False),
        (X64, 0, True),
        (EMPTY, 0, False),
    ],
)
def test_sort(x, dim, descending):
    check(lambda x: tuple(torch.sort(x, dim, descending)), x, ops=[aten.sort.default])
    check(
        lambda x: tuple(torch.sort(x, dim=dim, descending=descending, stable=True)),
        x,
        ops=[aten.sort.stable],
    )


def test_argsort():
    check(lambda x: torch.argsort(x, 1, descending=True), SORTABLE, ops=[aten.sort.default])


@pytest.mark.parametrize(
    "x,k,dim,largest",
    [
        (X, 2, -1, True),
        (X, 3, 1, False),
        (X, 1, 0, True),
        (IT[:, :3], 2, 1, True),
        (torch.tensor([[1.0, NAN, 3.0, -INF], [0.0, 5.0, 4.0, 9.0]]), 2, 1, True),
        (torch.tensor([[1.0, NAN, 3.0, -INF], [0.0, 5.0, 4.0, 9.0]]), 3, 1, False),
        (S, 1, 0, True),
        (X, 0, 1, True),
        (X64, 3, 1, False),
    ],
)
def test_topk(x, k, dim, largest):
    check(lambda x: tuple(torch.topk(x, k, dim, largest)), x, ops=[aten.topk.default])


def test_topk_unsorted():
    # PyTorch leaves the order unspecified for sorted=False: compare as sets.
    def fn(x):
        values, _ = torch.topk(x, 3, 1, sorted=False)
        return torch.sort(values, 1).values

    check(fn, X[0], ops=[aten.topk.default])


# -- order statistics ----------------------------------------------------------------------------
# Distinct values where indices are compared: among equal values PyTorch may report any
# index (its CPU kernel uses quickselect).
DISTINCT = torch.randperm(24).reshape(4, 6).float() - 7.5
WITH_NAN = torch.tensor(
    [[1.0, NAN, 2.0, NAN, 0.0], [4.0, 3.0, -1.0, 9.0, 2.0], [NAN, NAN, NAN, NAN, NAN]]
)


def test_median():
    check(lambda x: torch.median(x), DISTINCT, ops=[aten.median.default])
    check(lambda x: torch.median(x), WITH_NAN, ops=[aten.median.default])
    check(lambda x: torch.median(x), IT, ops=[aten.median.default])
    check(tupled(torch.median, 1), DISTINCT, ops=[aten.median.dim])
    check(tupled(torch.median, 0, keepdim=True), DISTINCT, ops=[aten.median.dim])
    check(tupled(torch.median, 1), WITH_NAN, ops=[aten.median.dim])
    check(tupled(torch.median, 0), S, ops=[aten.median.dim])


def test_nanmedian():
    check(lambda x: torch.nanmedian(x), WITH_NAN, ops=[aten.nanmedian.default])
    check(lambda x: torch.nanmedian(x), DISTINCT, ops=[aten.nanmedian.default])
    check(tupled(torch.nanmedian, 1), WITH_NAN[:2], ops=[aten.nanmedian.dim])
    check(tupled(torch.nanmedian, -1, keepdim=True), DISTINCT, ops=[aten.nanmedian.dim])
    # An all-NaN slice: the value is NaN (which NaN's index is reported is unspecified).
    check(lambda x: torch.nanmedian(x, 1).values, WITH_NAN, ops=[aten.nanmedian.dim])


def test_kthvalue():
    op = [aten.kthvalue.default]
    check(tupled(torch.kthvalue, 2, 1), DISTINCT, ops=op)
    check(tupled(torch.kthvalue, 4, 0, keepdim=True), DISTINCT, ops=op)
    check(tupled(torch.kthvalue, 1), DISTINCT, ops=op)
    check(tupled(torch.kthvalue, 4, 1), WITH_NAN[:2], ops=op)
    check(lambda x: torch.kthvalue(x, 3, 1).values, IT, ops=op)
    check(tupled(torch.kthvalue, 1, 0), S, ops=op)
