"""Convolution lowerings (forward, transposed, backward) against eager."""

import pytest
import torch
from harness import check

aten = torch.ops.aten
torch.manual_seed(0)

# (input shape, weight shape, stride, padding, dilation, transposed, output_padding, groups)
CASES = [
    # 1-d
    ((2, 4, 9), (6, 4, 3), [1], [0], [1], False, [0], 1),
    ((2, 4, 10), (6, 2, 3), [2], [1], [2], False, [0], 2),
    ((1, 3, 7), (3, 2, 3), [3], [1], [1], True, [2], 1),
    # 2-d
    ((2, 3, 8, 7), (5, 3, 3, 3), [1, 1], [1, 1], [1, 1], False, [0, 0], 1),
    ((2, 4, 9, 8), (6, 2, 3, 2), [2, 3], [1, 0], [1, 2], False, [0, 0], 2),
    ((1, 6, 7, 7), (6, 1, 3, 3), [2, 2], [1, 1], [1, 1], False, [0, 0], 6),  # depthwise
    ((2, 4, 5, 6), (4, 3, 3, 3), [2, 2], [1, 0], [1, 1], True, [1, 0], 1),
    ((2, 4, 5, 6), (4, 3, 3, 2), [2, 3], [1, 1], [2, 1], True, [1, 2], 2),
    ((1, 2, 6, 6), (2, 1, 3, 3), [2, 2], [3, 3], [1, 1], True, [1, 1], 1),  # padding > kernel extent
    ((1, 1, 1, 1), (1, 1, 1, 1), [1, 1], [0, 0], [1, 1], False, [0, 0], 1),
    # 3-d
    ((1, 2, 5, 6, 4), (4, 2, 3, 3, 2), [1, 2, 1], [1, 1, 0], [1, 1, 2], False, [0, 0, 0], 1),
    ((1, 4, 3, 4, 3), (4, 1, 2, 3, 2), [2, 1, 2], [0, 1, 1], [1, 1, 1], True, [1, 0, 1], 2),
]


def _ids(case):
    x, _, s, p, d, t, _, g = case
    return f"{'T' if t else 'C'}{len(x) - 2}d-x{'x'.join(map(str, x))}-s{s}-p{p}-d{d}-g{g}"


@pytest.mark.parametrize("case", CASES, ids=[_ids(c) for c in CASES])
@pytest.mark.parametrize("bias", [False, True])
def test_convolution(case, bias):
    xs, ws, s, p, d, t, op, g = case
    x, w = torch.randn(xs), torch.randn(ws)
    cout = ws[1] * g if t else ws[0]
    b = torch.randn(cout) if bias else None
    if bias:
        check(lambda x, w, b: aten.convolution(x, w, b, s, p, d, t, op, g), x, w, b,
              rtol=1e-4, atol=1e-4, ops=[aten.convolution.default])
    else:
        check(lambda x, w: aten.convolution(x, w, None, s, p, d, t, op, g), x, w,
              rtol=1e-4, atol=1e-4, ops=[aten.convolution.default])


@pytest.mark.parametrize("case", CASES, ids=[_ids(c) for c in CASES])
def test_convolution_backward(case):
    xs, ws, s, p, d, t, op, g = case
    x, w = torch.randn(xs), torch.randn(ws)
    y = aten.convolution(x, w, None, s, p, d, t, op, g)
    gy = torch.randn(y.shape)
    bias_sizes = [y.shape[1]]

    def fn(gy, x, w):
        return aten.convolution_backward(gy, x, w, bias_sizes, s, p, d, t, op, g, [True, True, True])

    check(fn, gy, x, w, rtol=1e-4, atol=1e-4, ops=[aten.convolution_backward.default])


@pytest.mark.parametrize("mask", [[True, False, False], [False, True, False], [False, False, True], [False, True, True]])
def test_convolution_backward_mask(mask):
    x, w = torch.randn(2, 4, 9, 8), torch.randn(6, 2, 3, 3)
    gy = torch.randn(aten.convolution(x, w, None, [2, 2], [1, 1], [1, 1], False, [0, 0], 2).shape)

    def fn(gy, x, w):
        grads = aten.convolution_backward(gy, x, w, [6], [2, 2], [1, 1], [1, 1], False, [0, 0], 2, mask)
        # Outputs outside the mask are unspecified (eager's CPU kernel sometimes fills them).
        return tuple(g for g, m in zip(grads, mask) if m)

    check(fn, gy, x, w, rtol=1e-4, atol=1e-4, ops=[aten.convolution_backward.default])


def test_convolution_float64_and_half():
    x, w = torch.randn(2, 3, 6, 6, dtype=torch.float64), torch.randn(4, 3, 3, 3, dtype=torch.float64)
    check(lambda x, w: aten.convolution(x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1), x, w,
          ops=[aten.convolution.default])
    check(lambda x, w: aten.convolution(x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1), x.half(),
          w.half(), rtol=1e-2, atol=1e-2, ops=[aten.convolution.default])


def test_convolution_int():
    x = torch.randint(-3, 4, (1, 2, 5, 5))
    w = torch.randint(-3, 4, (3, 2, 2, 2))
    check(lambda x, w: aten.convolution(x, w, None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1), x, w,
          ops=[aten.convolution.default])


def test_convolution_one_element_params_and_functional():
    x, w = torch.randn(2, 3, 8, 8), torch.randn(4, 3, 3, 3)
    check(lambda x, w: aten.convolution(x, w, None, [2], [1], [1], False, [0], 1), x, w,
          rtol=1e-4, atol=1e-4, ops=[aten.convolution.default])
    check(lambda x, w: torch.nn.functional.conv2d(x, w, padding="same"), x, w,
          rtol=1e-4, atol=1e-4, ops=[aten.convolution.default])
    check(lambda x, w: aten._convolution(x, w, None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1, False, False, True, True),
          x, w, rtol=1e-4, atol=1e-4, ops=[aten._convolution.default])


def test_convolution_empty_batch():
    x, w = torch.randn(0, 3, 5, 5), torch.randn(4, 3, 3, 3)
    check(lambda x, w: aten.convolution(x, w, None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1), x, w,
          ops=[aten.convolution.default])


@pytest.mark.parametrize("pad", [0, 2])
def test_conv_tbc(pad):
    x, w, b = torch.randn(7, 2, 3), torch.randn(3, 3, 4), torch.randn(4)
    check(lambda x, w, b: aten.conv_tbc(x, w, b, pad), x, w, b, rtol=1e-5, atol=1e-5, ops=[aten.conv_tbc.default])
