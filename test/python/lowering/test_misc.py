"""Miscellaneous math, activation backward, loss and distance lowerings against eager."""

import pytest
import torch
import torch.nn.functional as F
from harness import check, lower_and_run

aten = torch.ops.aten
torch.manual_seed(0)
X = torch.randn(3, 5)
Y = torch.randn(3, 5)
P = torch.rand(3, 5) * 0.98 + 0.01  # probabilities
G = torch.randn(3, 5)  # an incoming gradient
SPECIAL = torch.tensor([0.0, -0.0, 1.0, -2.5, float("inf"), float("-inf"), float("nan"), 3.0, -3.0, 1e-30])
H = X.half()


# -- pointwise math ---------------------------------------------------------------------------------
def test_lerp():
    check(lambda a, b: torch.lerp(a, b, 0.3), X, Y, ops=[aten.lerp.Scalar])
    check(lambda a, b: torch.lerp(a, b, 0.75), X, Y)
    check(lambda a, b, w: torch.lerp(a, b, w), X, Y, torch.rand(5) * 2 - 0.5, ops=[aten.lerp.Tensor])
    check(lambda a, b: torch.lerp(a, b, 0.3), H, Y.half())


def test_addcmul_addcdiv():
    check(lambda a, b, c: torch.addcmul(a, b, c, value=0.5), X, Y, G, ops=[aten.addcmul.default])
    check(lambda a, b, c: torch.addcmul(a, b, c, value=3), torch.arange(5), torch.arange(5), torch.arange(5))
    check(lambda a, b, c: torch.addcmul(a, b, c), X, Y[0], torch.tensor(2.0))
    check(lambda a, b, c: torch.addcdiv(a, b, c, value=-2), X, Y, P, ops=[aten.addcdiv.default])
    check(lambda a, b, c: torch.addcdiv(a, b, c), H, Y.half(), P.half(), rtol=1e-3, atol=1e-3)


def test_hypot():
    check(torch.hypot, X, Y, ops=[aten.hypot.default])
    check(torch.hypot, SPECIAL, SPECIAL.flip(0))
    check(torch.hypot, torch.tensor([1e30, 3e-30, 0.0]), torch.tensor([1e30, 4e-30, 0.0]))
    check(torch.hypot, X.double(), Y.double())


def test_logit():
    check(torch.logit, P, ops=[aten.logit.default])
    check(lambda x: torch.logit(x, eps=0.1), P)
    check(torch.logit, torch.tensor([0.0, 1.0, 0.5, -1.0, float("nan")]))
    check(lambda x: torch.logit(x, 1e-6), torch.tensor([0.0, 1.0, float("nan")]))


def test_xlogy():
    y = torch.tensor([0.0, 2.0, float("nan"), 1.0, 0.0, float("inf")])
    x = torch.tensor([0.0, 0.0, 0.0, 3.0, 2.0, 1.0])
    check(torch.xlogy, x, y, ops=[aten.xlogy.Tensor])
    check(lambda x: torch.xlogy(x, 2.5), x, ops=[aten.xlogy.Scalar_Other])
    check(lambda y: torch.xlogy(2, y), y, ops=[aten.xlogy.Scalar_Self])
    check(torch.xlogy, torch.tensor([0, 1, 2]), torch.tensor([3, 4, 0]))


def test_sinc_frac_nan_to_num():
    check(torch.sinc, torch.cat([SPECIAL, X.flatten()]), ops=[aten.sinc.default])
    check(torch.sinc, torch.tensor([0, 1, 2]))
    check(torch.frac, torch.cat([SPECIAL, X.flatten() * 10]), ops=[aten.frac.default])
    check(torch.nan_to_num, SPECIAL, ops=[aten.nan_to_num.default])
    check(lambda x: torch.nan_to_num(x, nan=1.5, posinf=9.0, neginf=-9.0), SPECIAL)
    check(lambda x: torch.nan_to_num(x, posinf=9.0), SPECIAL.half())
    check(torch.nan_to_num, torch.tensor([1, 2, 3]))
    check(torch.nan_to_num, torch.complex(SPECIAL, SPECIAL.flip(0)))


def test_heaviside_copysign():
    check(torch.heaviside, SPECIAL, torch.full((10,), 0.5), ops=[aten.heaviside.default])
    check(torch.heaviside, torch.tensor([-2, 0, 3]), torch.tensor([7]))
    check(torch.copysign, SPECIAL, SPECIAL.flip(0), ops=[aten.copysign.Tensor])
    check(lambda x: torch.copysign(x, -1.0), SPECIAL, ops=[aten.copysign.Scalar])
    check(lambda x: torch.copysign(x, -0.0), torch.tensor([1, -2, 3]))
    check(torch.copysign, X.double(), Y.double())
    check(torch.copysign, H, Y.bfloat16())


# -- activations and backward ops ------------------------------------------------------------------------
ACT = torch.cat([X.flatten() * 4, torch.tensor([-3.0, 3.0, 0.0, 25.0, -25.0])])
GA = torch.randn(ACT.shape)


@pytest.mark.parametrize(
    "fn, op",
    [
        (lambda x: F.hardsigmoid(x), aten.hardsigmoid.default),
        (lambda x: F.hardswish(x), aten.hardswish.default),
        (lambda x: F.mish(x), aten.mish.default),
        (F.softplus, aten.softplus.default),
        (lambda x: F.softplus(x, beta=2.0, threshold=5.0), aten.softplus.default),
        (lambda x: F.threshold(x, 0.5, -2.0), aten.threshold.default),
        (F.logsigmoid, aten.log_sigmoid_forward.default),
        (lambda x: F.glu(x.reshape(-1, 4), dim=1), aten.glu.default),
        (lambda x: F.softshrink(x, 0.7), aten.softshrink.default),
        (lambda x: F.hardshrink(x, 0.7), aten.hardshrink.default),
        (lambda x: F.celu(x, 0.6), aten.celu.default),
    ],
)
def test_activations(fn, op):
    check(fn, ACT, ops=[op])
    check(fn, ACT.half(), rtol=1e-3, atol=1e-3)


def test_log_sigmoid_forward_outputs():
    check(lambda x: aten.log_sigmoid_forward(x), ACT)


@pytest.mark.parametrize(
    "fn, op",
    [
        (lambda g, x: aten.threshold_backward(g, x, 0.0), aten.threshold_backward.default),
        (lambda g, x: aten.sigmoid_backward(g, torch.sigmoid(x)), aten.sigmoid_backward.default),
        (lambda g, x: aten.tanh_backward(g, torch.tanh(x)), aten.tanh_backward.default),
        (lambda g, x: aten.gelu_backward(g, x), aten.gelu_backward.default),
        (lambda g, x: aten.gelu_backward(g, x, approximate="tanh"), aten.gelu_backward.default),
        (lambda g, x: aten.silu_backward(g, x), aten.silu_backward.default),
        (lambda g, x: aten.hardtanh_backward(g, x, -1.0, 3.0), aten.hardtanh_backward.default),
        (lambda g, x: aten.leaky_relu_backward(g, x, 0.2, False), aten.leaky_relu_backward.default),
        (lambda g, x: aten.elu_backward(g, 1.5, 1.1, 0.8, False, x), aten.elu_backward.default),
        (lambda g, x: aten.elu_backward(g, 1.5, 1.1, 0.8, True, F.elu(x)), aten.elu_backward.default),
        (lambda g, x: aten.hardsigmoid_backward(g, x), aten.hardsigmoid_backward.default),
        (lambda g, x: aten.hardswish_backward(g, x), aten.hardswish_backward.default),
        (lambda g, x: aten.mish_backward(g, x), aten.mish_backward.default),
        (lambda g, x: aten.softplus_backward(g, x, 1.5, 4.0), aten.softplus_backward.default),
        (lambda g, x: aten.logit_backward(g, torch.sigmoid(x)), aten.logit_backward.default),
        (lambda g, x: aten.logit_backward(g, torch.sigmoid(x) * 1.2 - 0.1, 0.05), aten.logit_backward.default),
        (lambda g, x: aten.log_sigmoid_backward(g, x, *aten.log_sigmoid_forward(x)[1:]), aten.log_sigmoid_backward.default),
        (lambda g, x: aten.glu_backward(g[:10], x, 0), aten.glu_backward.default),
        (lambda g, x: aten.softshrink_backward(g, x, 0.7), aten.softshrink_backward.default),
        (lambda g, x: aten.hardshrink_backward(g, x, 0.7), aten.hardshrink_backward.default),
        (lambda g, x: aten.rrelu_with_noise_backward(g, x, g * 0.1, 0.1, 0.3, False, False), aten.rrelu_with_noise_backward.default),
        (lambda g, x: aten.rrelu_with_noise_backward(g, x, g * 0.1, 0.1, 0.3, True, False), aten.rrelu_with_noise_backward.default),
    ],
)
def test_activation_backward(fn, op):
    check(fn, GA, ACT, ops=[op], rtol=1e-5, atol=1e-5)
    check(fn, GA.double(), ACT.double())


@pytest.mark.parametrize(
    "act",
    [F.gelu, F.silu, F.hardswish, F.hardsigmoid, F.mish, F.softplus, F.elu, F.logsigmoid, torch.tanh, torch.sigmoid, F.relu6,
     F.softshrink, F.hardshrink, F.celu, F.selu, lambda x: torch.cat([F.glu(x, 0)] * 2)],
    ids=lambda f: f.__name__,
)
def test_backward_as_autograd_traces_it(act):
    # make_fx through autograd puts the same backward ops in the graph as aot_autograd.
    def grad(x, g):
        x = x.detach().requires_grad_()
        return torch.autograd.grad(act(x), x, g)[0]

    check(grad, ACT, GA, rtol=1e-5, atol=1e-5)


# -- losses ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_pointwise_losses(reduction):
    check(lambda a, b: F.mse_loss(a, b, reduction=reduction), X, Y, ops=[aten.mse_loss.default])
    check(lambda a, b: F.binary_cross_entropy(a, b, reduction=reduction), P, torch.rand(3, 5), ops=[aten.binary_cross_entropy.default])
    check(lambda a, b, w: F.binary_cross_entropy(a, b, w, reduction=reduction), P, torch.rand(3, 5), torch.rand(5))
    check(lambda a, b: F.binary_cross_entropy_with_logits(a, b, reduction=reduction), X, torch.rand(3, 5), ops=[aten.binary_cross_entropy_with_logits.default])
    check(lambda a, b, w, pw: F.binary_cross_entropy_with_logits(a, b, w, pos_weight=pw, reduction=reduction), X, torch.rand(3, 5), torch.rand(3, 1), torch.rand(5) * 3)
    check(lambda a, b: F.smooth_l1_loss(a, b, reduction=reduction, beta=0.5), X, Y, ops=[aten.smooth_l1_loss.default])
    check(lambda a, b: F.smooth_l1_loss(a, b, reduction=reduction, beta=0.0), X, Y)
    check(lambda a, b: F.huber_loss(a, b, reduction=reduction, delta=0.7), X, Y, ops=[aten.huber_loss.default])
    check(lambda a, b: F.soft_margin_loss(a, b, reduction=reduction), X, torch.sign(Y), ops=[aten.soft_margin_loss.default])


def test_bce_edges():
    check(lambda a, b: F.binary_cross_entropy(a, b, reduction="none"), torch.tensor([0.0, 1.0, 0.5, 1e-30]), torch.tensor([1.0, 0.0, 0.5, 1.0]))


@pytest.mark.parametrize("reduction", [0, 1, 2])
def test_loss_backward(reduction):
    g = torch.randn(3, 5) if reduction == 0 else torch.tensor(1.7)
    x0 = torch.tensor([[0.0, 1.0, -1.0, 0.5, -0.5]]).expand(3, 5).contiguous()
    check(lambda g, a, b: aten.mse_loss_backward(g, a, b, reduction), g, X, Y, ops=[aten.mse_loss_backward.default])
    check(lambda g, a, b: aten.binary_cross_entropy_backward(g, a, b, None, reduction), g, P, torch.rand(3, 5), ops=[aten.binary_cross_entropy_backward.default])
    check(lambda g, a, b, w: aten.binary_cross_entropy_backward(g, a, b, w, reduction), g, P, torch.rand(3, 5), torch.rand(3, 5))
    check(lambda g, a, b: aten.smooth_l1_loss_backward(g, a, b, reduction, 0.5), g, x0, torch.zeros(3, 5), ops=[aten.smooth_l1_loss_backward.default])
    check(lambda g, a, b: aten.smooth_l1_loss_backward(g, a, b, reduction, 0.0), g, x0, torch.zeros(3, 5))
    check(lambda g, a, b: aten.huber_loss_backward(g, a, b, reduction, 0.5), g, x0, torch.zeros(3, 5), ops=[aten.huber_loss_backward.default])
    check(lambda g, a, b: aten.soft_margin_loss_backward(g, a, b, reduction), g, X, torch.sign(Y), ops=[aten.soft_margin_loss_backward.default])


# -- nll_loss ------------------------------------------------------------------------------------------------------
LOGP = torch.log_softmax(torch.randn(6, 4), dim=1)
TARGET = torch.tensor([0, 3, -100, 1, 3, 2])
WEIGHT = torch.rand(4)


@pytest.mark.parametrize("reduction", [0, 1, 2])
@pytest.mark.parametrize("weighted", [False, True])
def test_nll_loss(reduction, weighted):
    # (weights are graph inputs: tensors captured by a closure would be constants)
    if weighted:
        fwd = lambda x, t, w: aten.nll_loss_forward(x, t, w, reduction, -100)
        bwd = lambda g, x, t, tw, w: aten.nll_loss_backward(g, x, t, w, reduction, -100, tw)
        extra = (WEIGHT,)
    else:
        fwd = lambda x, t: aten.nll_loss_forward(x, t, None, reduction, -100)
        bwd = lambda g, x, t, tw: aten.nll_loss_backward(g, x, t, None, reduction, -100, tw)
        extra = ()
    check(fwd, LOGP, TARGET, *extra, ops=[aten.nll_loss_forward.default])
    check(fwd, LOGP[0], torch.tensor(2), *extra)  # no batch dim
    check(fwd, LOGP[0], torch.tensor(-100), *extra)  # no batch dim, ignored
    _, total = fwd(LOGP, TARGET, *extra)
    g = torch.randn(6) if reduction == 0 else torch.tensor(0.7)
    check(bwd, g, LOGP, TARGET, total, *extra, ops=[aten.nll_loss_backward.default])
    for target in (torch.tensor(2), torch.tensor(-100)):  # 1-D input: no batch dim (issue #11)
        out, total = fwd(LOGP[0], target, *extra)
        check(bwd, torch.full_like(out, 0.7), LOGP[0], target, total, *extra)
    check(lambda x, t: aten.nll_loss_forward(x, t, None, reduction, 3), LOGP, TARGET.clamp(min=0))  # another ignore_index


@pytest.mark.parametrize("reduction", [0, 1, 2])
def test_nll_loss2d(reduction):
    x = torch.log_softmax(torch.randn(2, 4, 3, 5), dim=1)
    t = torch.randint(0, 4, (2, 3, 5))
    t[0, 1, 2] = -100
    fwd = lambda x, t, w: aten.nll_loss2d_forward(x, t, w, reduction, -100)
    check(fwd, x, t, WEIGHT, ops=[aten.nll_loss2d_forward.default])
    _, total = fwd(x, t, WEIGHT)
    g = torch.randn(2, 3, 5) if reduction == 0 else torch.tensor(0.7)
    bwd = lambda g, x, t, tw, w: aten.nll_loss2d_backward(g, x, t, w, reduction, -100, tw)
    check(bwd, g, x, t, total, WEIGHT, ops=[aten.nll_loss2d_backward.default])


def test_cross_entropy_graph():
    check(lambda x, t: F.cross_entropy(x, t), torch.randn(6, 4), TARGET)
    check(lambda x, t: F.cross_entropy(x, t, ignore_index=1, reduction="sum"), torch.randn(6, 4), TARGET.clamp(min=0))


def _one_32_bit_comparison_per_element(text: str) -> None:
    """The (4, 5) one-hot of an nll_loss module: int32 classes, compared once per element."""
    assert "stablehlo.iota dim = 1 : tensor<4x5xi32>" in text, text
    assert "tensor<4x5xi64>" not in text and "stablehlo.and" not in text.split("stablehlo.iota")[1], text


def test_nll_loss_one_hot_is_one_32_bit_comparison_per_element():
    """The one-hot of nll_loss compares the classes in 32 bits, once per element (ignored
    samples folded into the per-sample target as -1): a TPU emulates int64 comparisons with
    two 32-bit ones and an `and`. The values do not change: a target outside the classes
    matches none, not the class it would wrap to in 32 bits (2**32 + 2 is not class 2)."""
    x = torch.log_softmax(torch.randn(4, 5), dim=1)
    target = torch.tensor([1, 2**32 + 2, -100, 0])
    (out, total), _, imported = lower_and_run(
        lambda x, t: aten.nll_loss_forward(x, t, None, 0, -100), x, target)
    _one_32_bit_comparison_per_element(str(imported.module))
    torch.testing.assert_close(out, torch.stack([-x[0, 1], torch.tensor(0.0), torch.tensor(0.0), -x[3, 0]]))
    (loss, total), _, _ = lower_and_run(lambda x, t: aten.nll_loss_forward(x, t, None, 2, -100), x, target)
    torch.testing.assert_close(loss, -(x[0, 1] + x[3, 0]))
    assert total.item() == 3  # the out-of-range target still counts as a sample (valid), as before
    (loss, total), _, _ = lower_and_run(lambda x, t: aten.nll_loss_forward(x, t, None, 2, -100), x,
                                        torch.tensor([7, -3, 4, 2]))
    torch.testing.assert_close(loss, -(x[2, 4] + x[3, 2]))  # 7 and -3 pick nothing (no clamped class)
    weight = torch.rand(5) + 0.5
    (loss, total), _, _ = lower_and_run(lambda x, t, w: aten.nll_loss_forward(x, t, w, 1, -100), x, target, weight)
    torch.testing.assert_close(total, weight[1] + weight[0])
    torch.testing.assert_close(loss, -(x[0, 1] * weight[1] + x[3, 0] * weight[0]) / (weight[1] + weight[0]))
    check(lambda x, t: aten.nll_loss_forward(x, t, None, 1, 0), x, torch.tensor([1, 0, 4, 0]))  # ignore_index in range
    grad, _, imported = lower_and_run(
        lambda g, x, t, tw: aten.nll_loss_backward(g, x, t, None, 2, -100, tw), torch.tensor(1.0), x, target, total)
    _one_32_bit_comparison_per_element(str(imported.module))
    expected = torch.zeros(4, 5)
    expected[0, 1] = expected[3, 0] = -1.0
    torch.testing.assert_close(grad, expected)


# -- distances and cross ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("p", [0.0, 1.0, 2.0, 3.0, 0.5, float("inf")])
def test_cdist(p):
    a, b = torch.randn(2, 4, 3), torch.randn(2, 5, 3)
    b[0, 1] = a[0, 2]  # a zero distance
    check(lambda a, b: torch.cdist(a, b, p=p), a, b, ops=[aten._cdist_forward.default], rtol=1e-5, atol=1e-5)
    check(lambda a, b: torch.cdist(a, b, p=p), torch.randn(4, 3), torch.randn(3, 1, 6, 3), rtol=1e-5, atol=1e-5)  # broadcast batch
    check(lambda a: F.pdist(a, p=p), a[0], ops=[aten._pdist_forward.default], rtol=1e-5, atol=1e-5)
    grad = torch.randn(2, 4, 5)
    out = torch.cdist(a, b, p=p)
    check(lambda g, a, b, d: aten._cdist_backward(g, a, b, p, d), grad, a, b, out, ops=[aten._cdist_backward.default], rtol=1e-5, atol=1e-5)
    pd = F.pdist(a[0], p=p)
    check(lambda g, a, d: aten._pdist_backward(g, a, p, d), torch.randn(6), a[0], pd, ops=[aten._pdist_backward.default], rtol=1e-5, atol=1e-5)


def test_cdist_matmul_modes():
    a, b = torch.randn(30, 4).double(), torch.randn(7, 4).double()
    check(lambda a, b: torch.cdist(a, b), a, b, ops=[aten._euclidean_dist.default])  # > 25 rows: matmul form
    check(lambda a, b: torch.cdist(a, b, compute_mode="use_mm_for_euclid_dist"), a[:3], b)
    check(lambda a, b: torch.cdist(a, b, compute_mode="donot_use_mm_for_euclid_dist"), a, b)


def test_prelu():
    check(lambda x, w: F.prelu(x, w), torch.randn(2, 3, 4), torch.rand(3), ops=[aten._prelu_kernel.default])

    def grads(x, w, g):
        x, w = x.detach().requires_grad_(), w.detach().requires_grad_()
        return torch.autograd.grad(F.prelu(x, w), (x, w), g)

    check(grads, torch.randn(2, 3, 4), torch.rand(3), torch.randn(2, 3, 4), ops=[aten._prelu_kernel_backward.default])


def test_linalg_cross():
    check(lambda a, b: torch.linalg.cross(a, b), torch.randn(4, 3), torch.randn(4, 3), ops=[aten.linalg_cross.default])
    check(lambda a, b: torch.linalg.cross(a, b, dim=0), torch.randn(3, 2), torch.randn(3, 1))
    check(lambda a, b: torch.cross(a, b, dim=1), torch.randint(-5, 5, (2, 3)), torch.randint(-5, 5, (2, 3)))
