"""Pooling, resampling, im2col/col2im, grid_sampler and embedding lowerings against eager."""

import functools

import pytest
import torch
from direct_graph import check_direct
from harness import check, lower_and_run

aten = torch.ops.aten
torch.manual_seed(0)

X4 = torch.randn(2, 3, 9, 8)
X5 = torch.randn(1, 2, 5, 6, 7)


# -- max pooling ----------------------------------------------------------------------------
MAXPOOL2D = [
    # kernel, stride, padding, dilation, ceil_mode
    ([2, 2], [], [0, 0], [1, 1], False),
    ([3, 3], [2, 2], [1, 1], [1, 1], False),
    ([3, 2], [2, 1], [1, 0], [1, 1], True),
    ([2, 2], [3, 3], [1, 1], [1, 1], True),
    ([3, 3], [1, 2], [1, 1], [2, 1], False),
    ([2, 3], [2, 2], [0, 1], [2, 2], True),
]


@pytest.mark.parametrize("args", MAXPOOL2D)
def test_max_pool2d_with_indices(args):
    check(lambda x: aten.max_pool2d_with_indices(x, *args), X4, ops=[aten.max_pool2d_with_indices.default])


def test_max_pool2d_unbatched_int_half_ties_nan():
    check(lambda x: aten.max_pool2d_with_indices(x, [2, 2], [1, 1], [1, 1]), X4[0], ops=[aten.max_pool2d_with_indices.default])
    ints = torch.randint(-3, 3, (1, 2, 6, 6))  # many ties: the first index wins
    check(lambda x: aten.max_pool2d_with_indices(x, [3, 3], [1, 1], [1, 1]), ints, ops=[aten.max_pool2d_with_indices.default])
    check(lambda x: aten.max_pool2d_with_indices(x, [2, 2]), X4.half(), ops=[aten.max_pool2d_with_indices.default])
    x = torch.tensor([[[[1.0, float("nan"), float("nan"), 2.0], [float("-inf")] * 4]]])
    check(lambda x: aten.max_pool2d_with_indices(x, [2, 4]), x, ops=[aten.max_pool2d_with_indices.default])
    neg = torch.full((1, 1, 3, 3), float("-inf"))
    check(lambda x: aten.max_pool2d_with_indices(x, [2, 2], [1, 1], [1, 1]), neg, ops=[aten.max_pool2d_with_indices.default])


def test_max_pool_functional():
    check(lambda x: torch.nn.functional.max_pool2d(x, 3, 2, 1, ceil_mode=True), X4, ops=[aten.max_pool2d_with_indices.default])


@pytest.mark.parametrize("args", MAXPOOL2D)
def test_max_pool2d_backward(args):
    out, idx = aten.max_pool2d_with_indices(X4, *args)
    g = torch.randn(out.shape)
    check(lambda g, x, i: aten.max_pool2d_with_indices_backward(g, x, *args, i), g, X4, idx,
          ops=[aten.max_pool2d_with_indices_backward.default])


def test_max_pool3d():
    args = ([2, 3, 2], [2, 2, 1], [1, 1, 0], [1, 1, 2], True)
    check(lambda x: aten.max_pool3d_with_indices(x, *args), X5, ops=[aten.max_pool3d_with_indices.default])
    check(lambda x: aten.max_pool3d_with_indices(x, [2, 2, 2]), X5[0], ops=[aten.max_pool3d_with_indices.default])
    out, idx = aten.max_pool3d_with_indices(X5, *args)
    g = torch.randn(out.shape)
    check(lambda g, x, i: aten.max_pool3d_with_indices_backward(g, x, *args, i), g, X5, idx,
          ops=[aten.max_pool3d_with_indices_backward.default])


# -- average pooling ---------------------------------------------------------------------------
AVGPOOL2D = [
    # kernel, stride, padding, ceil_mode, count_include_pad, divisor_override
    ([2, 2], [], [0, 0], False, True, None),
    ([3, 3], [2, 2], [1, 1], False, True, None),
    ([3, 3], [2, 2], [1, 1], False, False, None),
    ([3, 2], [2, 3], [1, 1], True, True, None),
    ([3, 2], [2, 3], [1, 1], True, False, None),
    ([2, 2], [2, 2], [1, 0], True, True, 3),
]


@pytest.mark.parametrize("args", AVGPOOL2D)
def test_avg_pool2d(args):
    check(lambda x: aten.avg_pool2d(x, *args), X4, ops=[aten.avg_pool2d.default])
    out = aten.avg_pool2d(X4, *args)
    g = torch.randn(out.shape)
    check(lambda g, x: aten.avg_pool2d_backward(g, x, *args), g, X4, ops=[aten.avg_pool2d_backward.default])


def test_avg_pool2d_dtypes():
    ints = torch.randint(-20, 20, (1, 2, 5, 5))
    check(lambda x: aten.avg_pool2d(x, [3, 3], [1, 1], [1, 1]), ints, ops=[aten.avg_pool2d.default])
    check(lambda x: aten.avg_pool2d(x, [2, 2]), X4.half(), rtol=1e-3, atol=1e-3, ops=[aten.avg_pool2d.default])
    check(lambda x: aten.avg_pool2d(x, [2, 2]), X4.double(), ops=[aten.avg_pool2d.default])
    check(lambda x: aten.avg_pool2d(x, [2, 2], [1, 1]), X4[0], ops=[aten.avg_pool2d.default])


@pytest.mark.parametrize("args", [([2, 2, 2], [], [0, 0, 0], False, True, None),
                                  ([3, 2, 3], [2, 1, 2], [1, 1, 1], True, False, None)])
def test_avg_pool3d(args):
    check(lambda x: aten.avg_pool3d(x, *args), X5, ops=[aten.avg_pool3d.default])
    out = aten.avg_pool3d(X5, *args)
    g = torch.randn(out.shape)
    check(lambda g, x: aten.avg_pool3d_backward(g, x, *args), g, X5, ops=[aten.avg_pool3d_backward.default])


# -- adaptive pooling -------------------------------------------------------------------------
@pytest.mark.parametrize("size", [[3, 4], [4, 5], [1, 3], [5, 7], [12, 10]])
def test_adaptive_avg_pool2d(size):
    check(lambda x: aten._adaptive_avg_pool2d(x, size), X4, rtol=1e-5, atol=1e-5,
          ops=[aten._adaptive_avg_pool2d.default])
    g = torch.randn(2, 3, *size)
    check(lambda g, x: aten._adaptive_avg_pool2d_backward(g, x), g, X4, rtol=1e-5, atol=1e-5,
          ops=[aten._adaptive_avg_pool2d_backward.default])


def test_adaptive_avg_pool_misc():
    check(lambda x: aten._adaptive_avg_pool2d(x, [4, 3]), X4[0], ops=[aten._adaptive_avg_pool2d.default])
    check(lambda x: aten._adaptive_avg_pool2d(x, [4, 3]), X4.half(), rtol=1e-3, atol=1e-3,
          ops=[aten._adaptive_avg_pool2d.default])
    inf = X4.clone()
    inf[0, 0, 0, 0] = float("inf")
    check(lambda x: aten._adaptive_avg_pool2d(x, [4, 3]), inf, ops=[aten._adaptive_avg_pool2d.default])
    check(lambda x: aten._adaptive_avg_pool3d(x, [2, 4, 3]), X5, ops=[aten._adaptive_avg_pool3d.default])
    g = torch.randn(1, 2, 2, 4, 3)
    check(lambda g, x: aten._adaptive_avg_pool3d_backward(g, x), g, X5, ops=[aten._adaptive_avg_pool3d_backward.default])


@pytest.mark.parametrize("size", [[3, 4], [4, 5], [1, 1], [9, 8], [12, 10]])
def test_adaptive_max_pool2d(size):
    check(lambda x: aten.adaptive_max_pool2d(x, size), X4, ops=[aten.adaptive_max_pool2d.default])
    out, idx = aten.adaptive_max_pool2d(X4, size)
    g = torch.randn(out.shape)
    check(lambda g, x, i: aten.adaptive_max_pool2d_backward(g, x, i), g, X4, idx,
          ops=[aten.adaptive_max_pool2d_backward.default])


def test_adaptive_max_pool3d():
    check(lambda x: aten.adaptive_max_pool3d(x, [2, 4, 3]), X5, ops=[aten.adaptive_max_pool3d.default])
    out, idx = aten.adaptive_max_pool3d(X5, [2, 4, 3])
    g = torch.randn(out.shape)
    check(lambda g, x, i: aten.adaptive_max_pool3d_backward(g, x, i), g, X5, idx,
          ops=[aten.adaptive_max_pool3d_backward.default])


# -- upsampling ---------------------------------------------------------------------------------
X4S = torch.randn(2, 3, 5, 6)


@pytest.mark.parametrize(
    "size,scales", [([10, 12], None), ([7, 9], None), ([5, 6], None), (None, [1.7, 2.3]), (None, [0.6, 1.0])]
)
def test_upsample_nearest2d_vec(size, scales):
    # .vec overloads are CompositeImplicit under make_fx: build the one-node graph by hand.
    check_direct(aten.upsample_nearest2d.vec, X4S, size, scales)
    check_direct(aten._upsample_nearest_exact2d.vec, X4S, size, scales)


@pytest.mark.parametrize(
    "size,scales,align", [([10, 12], None, False), ([7, 9], None, True), ([3, 4], None, False), ([5, 6], None, False),
                          ([1, 1], None, True), (None, [1.7, 2.3], False), (None, [0.6, 1.0], True)]
)
def test_upsample_bilinear2d_vec(size, scales, align):
    check_direct(aten.upsample_bilinear2d.vec, X4S, size, align, scales)
    check_direct(aten.upsample_bicubic2d.vec, X4S, size, align, scales, rtol=1e-5, atol=1e-5)


def test_upsample_functional_default_overloads():
    F = torch.nn.functional
    x3, x5 = torch.randn(2, 3, 7), torch.randn(1, 2, 3, 4, 5)
    check(lambda x: F.interpolate(x, scale_factor=2), X4S, ops=[aten.upsample_nearest2d.default])
    check(lambda x: F.interpolate(x, scale_factor=1.7, mode="bilinear"), X4S, ops=[aten.upsample_bilinear2d.default])
    check(lambda x: F.interpolate(x, size=(8, 3), mode="bilinear", align_corners=True), X4S,
          ops=[aten.upsample_bilinear2d.default])
    check(lambda x: F.interpolate(x, scale_factor=1.5, mode="bicubic"), X4S, rtol=1e-5, atol=1e-5,
          ops=[aten.upsample_bicubic2d.default])
    check(lambda x: F.interpolate(x, scale_factor=2.5, mode="nearest-exact"), X4S, ops=[aten._upsample_nearest_exact2d.default])
    check(lambda x: F.interpolate(x, scale_factor=2.5), x3, ops=[aten.upsample_nearest1d.default])
    check(lambda x: F.interpolate(x, size=11, mode="linear"), x3, ops=[aten.upsample_linear1d.default])
    check(lambda x: F.interpolate(x, size=4, mode="linear", align_corners=True), x3, ops=[aten.upsample_linear1d.default])
    check(lambda x: F.interpolate(x, scale_factor=(2, 1.5, 0.7)), x5, ops=[aten.upsample_nearest3d.default])
    check(lambda x: F.interpolate(x, scale_factor=(2, 1.5, 0.7), mode="trilinear"), x5,
          ops=[aten.upsample_trilinear3d.default])
    check(lambda x: F.interpolate(x, size=(5, 3, 9), mode="trilinear", align_corners=True), x5,
          ops=[aten.upsample_trilinear3d.default])


def test_upsample_unsupported_dtype_fails():
    from torch_tpu.compiler.lowering import LoweringError

    with pytest.raises(LoweringError, match="not supported"):
        lower_and_run(lambda x: aten.upsample_linear1d(x, [9], False), torch.zeros(1, 2, 5, dtype=torch.int64))


def test_upsample_dtypes():
    check_direct(aten.upsample_bilinear2d.vec, X4S.double(), [9, 11], False, None)
    check_direct(aten.upsample_bilinear2d.vec, X4S.half(), [9, 11], False, None, rtol=1e-2, atol=1e-2)
    u8 = torch.randint(0, 256, (1, 3, 5, 6), dtype=torch.uint8)
    check_direct(aten.upsample_nearest2d.vec, u8, [9, 11], None)
    check_direct(aten.upsample_nearest1d.vec, torch.randn(2, 3, 7), None, [2.5])
    check_direct(aten.upsample_nearest3d.vec, X5, [3, 9, 4], None)
    check_direct(aten.upsample_linear1d.vec, torch.randn(2, 3, 7), [12], True, None)
    check_direct(aten.upsample_trilinear3d.vec, X5, None, False, [1.5, 0.5, 2.0])


@pytest.mark.parametrize("size,align", [([9, 11], False), ([40, 29], True), ([17, 30], False), ([5, 5], False)])
def test_upsample_bilinear_uint8(size, align):
    # uint8 follows the CPU kernel's int16 fixed-point passes exactly.
    u8 = torch.randint(0, 256, (1, 3, 17, 13), dtype=torch.uint8)
    check(lambda x: aten.upsample_bilinear2d(x, size, align), u8, ops=[aten.upsample_bilinear2d.default])
    check(lambda x: aten.upsample_bilinear2d(x, size, align), u8.repeat(1, 2, 1, 1),
          ops=[aten.upsample_bilinear2d.default])
    check_direct(aten.upsample_bilinear2d.vec, u8, None, align, [1.7, 0.6])


@pytest.mark.parametrize(
    "op,in_shape,out_size,extra",
    [
        (aten.upsample_nearest1d_backward, (2, 3, 5), [11], ()),
        (aten.upsample_nearest2d_backward, (2, 3, 5, 6), [7, 13], ()),
        (aten.upsample_nearest2d_backward, (2, 3, 5, 6), [7, 13], (1.5, 2.2)),
        (aten._upsample_nearest_exact2d_backward, (2, 3, 5, 6), [7, 13], ()),
        (aten.upsample_nearest3d_backward, (1, 2, 3, 4, 5), [5, 4, 9], ()),
        (aten.upsample_linear1d_backward, (2, 3, 5), [11], (False,)),
        (aten.upsample_bilinear2d_backward, (2, 3, 5, 6), [7, 13], (False,)),
        (aten.upsample_bilinear2d_backward, (2, 3, 5, 6), [7, 13], (True,)),
        (aten.upsample_bilinear2d_backward, (2, 3, 5, 6), [3, 4], (False,)),
        (aten.upsample_trilinear3d_backward, (1, 2, 3, 4, 5), [5, 4, 9], (False,)),
        (aten.upsample_bicubic2d_backward, (2, 3, 5, 6), [7, 13], (False,)),
    ],
)
def test_upsample_backward(op, in_shape, out_size, extra):
    g = torch.randn(*in_shape[:2], *out_size)
    check(lambda g: op(g, out_size, list(in_shape), *extra), g, rtol=1e-5, atol=1e-5, ops=[op.default])


# -- im2col / col2im ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "k,d,p,s", [([3, 3], [1, 1], [0, 0], [1, 1]), ([2, 3], [2, 1], [1, 2], [2, 3]), ([1, 1], [1, 1], [0, 0], [2, 2])]
)
def test_im2col_col2im(k, d, p, s):
    check(lambda x: aten.im2col(x, k, d, p, s), X4, ops=[aten.im2col.default])
    check(lambda x: aten.im2col(x, k, d, p, s), X4[0], ops=[aten.im2col.default])
    cols = aten.im2col(X4, k, d, p, s)
    c = torch.randn(cols.shape)
    check(lambda c: aten.col2im(c, [9, 8], k, d, p, s), c, rtol=1e-5, atol=1e-5, ops=[aten.col2im.default])
    check(lambda c: aten.col2im(c, [9, 8], k, d, p, s), c[0], rtol=1e-5, atol=1e-5, ops=[aten.col2im.default])


def test_fold_unfold_functional():
    F = torch.nn.functional
    check(lambda x: F.unfold(x, 3, padding=1, stride=2), X4, ops=[aten.im2col.default])
    check(lambda x: F.fold(x, (4, 5), 2), torch.randn(2, 12, 12), ops=[aten.col2im.default])


# -- grid_sampler_2d -----------------------------------------------------------------------------
GRID = torch.rand(2, 4, 5, 2) * 2.6 - 1.3  # reaches outside [-1, 1]


# (interpolation: 0 bilinear, 1 nearest, 2 bicubic; padding: 0 zeros, 1 border, 2 reflection; align_corners)
GRID_MODES = [(0, 0, False), (0, 1, False), (0, 2, False), (0, 0, True), (0, 2, True), (1, 0, False),
              (1, 2, True), (2, 0, False), (2, 1, True), (2, 2, False)]


@pytest.mark.parametrize("interp,padding,align", GRID_MODES)
def test_grid_sampler_2d(interp, padding, align):
    check(lambda x, g: aten.grid_sampler_2d(x, g, interp, padding, align), X4S, GRID, rtol=1e-5, atol=1e-5,
          ops=[aten.grid_sampler_2d.default])


def test_grid_sampler_2d_misc():
    check(lambda x, g: torch.nn.functional.grid_sample(x, g, align_corners=False), X4S.double(), GRID.double(),
          ops=[aten.grid_sampler_2d.default])
    g = GRID.clone()
    g[0, 0, 0, 0] = float("nan")
    g[0, 0, 1, 1] = float("inf")
    check(lambda x, g: aten.grid_sampler_2d(x, g, 0, 0, False), X4S, g, ops=[aten.grid_sampler_2d.default])


# -- grid_sampler_3d -----------------------------------------------------------------------------
X5S = torch.randn(2, 3, 4, 5, 6)
GRID3 = torch.rand(2, 3, 4, 5, 3) * 2.6 - 1.3  # reaches outside [-1, 1]

# (interpolation: 0 trilinear, 1 nearest; padding: 0 zeros, 1 border, 2 reflection; align_corners).
# Bicubic is 2-D only: PyTorch refuses it on 5-D input.
GRID3_MODES = [(interp, padding, align)
               for interp in (0, 1) for padding in (0, 1, 2) for align in (False, True)]


def _grid3_with_non_finite():
    """GRID3 with NaN and +-inf coordinates, and points far outside [-1, 1]: eager's 3-D
    kernel skips the out-of-bounds taps of a NaN/inf coordinate (0 with zeros padding) and
    clips NaN to the far border (border, reflection)."""
    g = GRID3.clone()
    g[0, 0, 0, 0, 0] = float("nan")
    g[0, 0, 1, 1, 1] = float("inf")
    g[1, 2, 3, 0, 2] = float("-inf")
    g[1, 1, 1, 1] = torch.tensor([float("nan"), float("inf"), float("-inf")])
    g[0, 2, 2, 2] = torch.tensor([7.3, -9.1, 13.7])
    return g


@pytest.mark.parametrize("interp,padding,align", GRID3_MODES)
def test_grid_sampler_3d(interp, padding, align):
    check(lambda x, g: aten.grid_sampler_3d(x, g, interp, padding, align), X5S, GRID3, rtol=1e-5, atol=1e-5,
          ops=[aten.grid_sampler_3d.default])


@pytest.mark.parametrize("interp,padding,align", GRID3_MODES)
def test_grid_sampler_3d_non_finite_coordinates(interp, padding, align):
    check(lambda x, g: aten.grid_sampler_3d(x, g, interp, padding, align), X5S, _grid3_with_non_finite(),
          rtol=1e-5, atol=1e-5, ops=[aten.grid_sampler_3d.default])


def test_grid_sampler_3d_dtypes():
    F = torch.nn.functional
    check(lambda x, g: F.grid_sample(x, g, align_corners=False), X5S.double(), GRID3.double(),
          ops=[aten.grid_sampler_3d.default])
    check(lambda x, g: F.grid_sample(x, g, mode="nearest", padding_mode="reflection", align_corners=True),
          X5S.double(), GRID3.double(), ops=[aten.grid_sampler_3d.default])
    # The kernel computes in bf16 itself, rounding after every operation, as the lowering does.
    check(lambda x, g: aten.grid_sampler_3d(x, g, 0, 2, False), X5S.bfloat16(), GRID3.bfloat16(),
          ops=[aten.grid_sampler_3d.default])
    # In f16 as well, but XLA:CPU keeps f16 intermediates in f32: a few f16 ulps apart.
    check(lambda x, g: aten.grid_sampler_3d(x, g, 0, 1, True), X5S.half(), GRID3.half(), rtol=1e-2, atol=1e-2,
          ops=[aten.grid_sampler_3d.default])


def test_grid_sampler_3d_refuses_bicubic():
    """PyTorch has no bicubic mode for 5-D input (its meta refuses to trace one): a graph
    that holds one anyway is refused by the lowering."""
    from torch_tpu.compiler.importer import import_graph
    from torch_tpu.compiler.lowering import LoweringError

    graph = torch.fx.Graph()
    x, grid = graph.placeholder("x"), graph.placeholder("grid")
    x.meta["val"], grid.meta["val"] = X5S, GRID3
    node = graph.call_function(aten.grid_sampler_3d.default, (x, grid, 2, 0, False))
    node.meta["val"] = torch.empty(2, 3, 3, 4, 5)
    graph.output(node)
    with pytest.raises(LoweringError, match="bicubic"):
        import_graph(torch.fx.GraphModule({}, graph))


# -- embedding ----------------------------------------------------------------------------------
def test_embedding():
    w = torch.randn(10, 4)
    check(aten.embedding, w, torch.tensor([[1, 2, 9], [0, 0, 3]]), ops=[aten.embedding.default])
    check(aten.embedding, w, torch.tensor([3, 1], dtype=torch.int32), ops=[aten.embedding.default])
    check(aten.embedding, w, torch.tensor(7), ops=[aten.embedding.default])
    check(aten.embedding, w.to(torch.int64), torch.tensor([3, 1]), ops=[aten.embedding.default])
    check(lambda w, i: torch.nn.functional.embedding(i, w, padding_idx=2), w, torch.tensor([2, 5]),
          ops=[aten.embedding.default])


@pytest.mark.parametrize("padding_idx,freq", [(-1, False), (2, False), (-1, True), (3, True)])
def test_embedding_dense_backward(padding_idx, freq):
    idx = torch.tensor([[1, 2, 3, 2], [3, 3, 0, 9]])
    g = torch.randn(2, 4, 5)
    check(lambda g, i: aten.embedding_dense_backward(g, i, 10, padding_idx, freq), g, idx, rtol=1e-5, atol=1e-5,
          ops=[aten.embedding_dense_backward.default])


@pytest.mark.parametrize("padding_idx,freq", [(-1, False), (4, False), (-1, True), (7, True)])
@pytest.mark.parametrize("num_weights", [40, 5])
def test_embedding_dense_backward_bf16_sums_each_row_in_float32(padding_idx, freq, num_weights):
    """A bf16 gradient's rows are summed in float32 and rounded once, as PyTorch does --
    with fewer tokens than rows (40) through sorted runs of equal indices, else (5) through a
    float32 table. Small integers make every float32 order of the sums exact: the result
    equals the float32 table rounded to bf16 bit for bit (within a bf16 bit when divided by
    the counts), and eager within bf16's rounding."""
    torch.manual_seed(0)
    idx = torch.randint(0, min(num_weights, 9), (3, 6))
    idx[0, :3] = 4  # runs of one index, and the padding index among them
    g = torch.randint(-40, 40, (3, 6, 16)).to(torch.bfloat16) / 8

    def backward(g, i):
        return aten.embedding_dense_backward(g, i, num_weights, padding_idx if padding_idx < num_weights else -1, freq)

    check(backward, g, idx, rtol=1e-2, atol=1e-2, ops=[aten.embedding_dense_backward.default])
    actual, _, _ = lower_and_run(backward, g, idx)
    exact = aten.embedding_dense_backward(g.float(), idx, num_weights,
                                          padding_idx if padding_idx < num_weights else -1, freq).to(torch.bfloat16)
    assert actual.dtype == torch.bfloat16
    if freq:  # divided by the counts, the float32 terms are inexact: their order may move the last bf16 bit
        # (or leave another residue of a sum that cancels)
        torch.testing.assert_close(actual, exact, rtol=2 ** -7, atol=1e-6)
    else:
        assert torch.equal(actual, exact)


def test_embedding_dense_backward_bf16_runs_use_32_bit_keys_and_drop_out_of_range_rows():
    """The sorted runs' keys, sort indices and scatters are 32-bit (a TPU carries int64 as
    two words: the runs' keys scattered as int64 pairs took 0.17 ms a step on the chip), and
    an index outside [0, num_weights) -- which eager rejects -- writes no row, as the int64
    scatter dropped it, rather than one its clamp or its low 32 bits would name."""
    idx = torch.tensor([[5, 2**32 + 3, 5, -1], [40, 3, 41, 2**40]])
    g = torch.randint(-40, 40, (2, 4, 8)).to(torch.bfloat16) / 8
    backward = lambda g, i: aten.embedding_dense_backward(g, i, 40, -1, False)
    actual, _, imported = lower_and_run(backward, g, idx)
    text = str(imported.module)
    sort = text[text.index("stablehlo.sort"):]
    assert "xi64>" not in sort and "tensor<i64>" not in sort, sort  # (after the clamp of the int64 input)
    assert text.count("indices_are_sorted = true") == 2, text  # the runs' sums and keys
    expected = torch.zeros(40, 8)
    expected[5] = g[0, 0].float() + g[0, 2].float()
    expected[3] = g[1, 1].float()
    assert torch.equal(actual, expected.to(torch.bfloat16))


@pytest.mark.parametrize("interp,padding,align", GRID_MODES)
def test_grid_sampler_2d_backward(interp, padding, align):
    g = torch.randn(2, 3, 4, 5)
    check(lambda g, x, grid: aten.grid_sampler_2d_backward(g, x, grid, interp, padding, align, [True, True]),
          g, X4S, GRID, rtol=1e-4, atol=1e-4, ops=[aten.grid_sampler_2d_backward.default])


@pytest.mark.parametrize("interp,padding,align", GRID3_MODES)
def test_grid_sampler_3d_backward(interp, padding, align):
    g = torch.randn(2, 3, 3, 4, 5)
    check(lambda g, x, grid: aten.grid_sampler_3d_backward(g, x, grid, interp, padding, align, [True, True]),
          g, X5S, GRID3, rtol=1e-4, atol=1e-4, ops=[aten.grid_sampler_3d_backward.default])


@pytest.mark.parametrize("interp,padding,align", GRID3_MODES)
def test_grid_sampler_3d_backward_non_finite_coordinates(interp, padding, align):
    """The backward places samples with the _set_grad helpers, whose clip lets NaN through
    (no gradient anywhere) where the forward's sends it to the border."""
    g = torch.randn(2, 3, 3, 4, 5)
    check(lambda g, x, grid: aten.grid_sampler_3d_backward(g, x, grid, interp, padding, align, [True, True]),
          g, X5S, _grid3_with_non_finite(), rtol=1e-4, atol=1e-4, ops=[aten.grid_sampler_3d_backward.default])


@pytest.mark.parametrize("output_mask", [[True, False], [False, True]])
def test_grid_sampler_backward_output_mask(output_mask):
    """Eager returns grad_grid whatever output_mask[1] says; grad_input only when asked."""
    for op, g, x, grid in ((aten.grid_sampler_3d_backward, torch.randn(2, 3, 3, 4, 5), X5S, GRID3),
                           (aten.grid_sampler_2d_backward, torch.randn(2, 3, 4, 5), X4S, GRID)):
        check(lambda g, x, grid: op(g, x, grid, 0, 1, False, output_mask), g, x, grid, rtol=1e-4, atol=1e-4,
              ops=[op.default])


def test_grid_sampler_3d_backward_float64():
    g = torch.randn(2, 3, 3, 4, 5, dtype=torch.float64)
    for interp, padding, align in [(0, 0, False), (0, 2, True), (1, 1, False)]:
        mode = (interp, padding, align, [True, True])
        check(lambda g, x, grid: aten.grid_sampler_3d_backward(g, x, grid, *mode),
              g, X5S.double(), GRID3.double(), ops=[aten.grid_sampler_3d_backward.default])


AA_CASES = [([9, 11], False), ([40, 29], True), ([5, 5], True), ([17, 6], False)]


@pytest.mark.parametrize("size,align", AA_CASES)
def test_upsample_antialias(size, align):
    x = torch.rand(1, 3, 17, 13) * 255
    for op in (aten._upsample_bilinear2d_aa, aten._upsample_bicubic2d_aa):
        fn = functools.partial(op, output_size=size, align_corners=align)
        check(fn, x, rtol=1e-5, atol=1e-4, ops=[op.default])
        # uint8 follows the kernel's int16 fixed point exactly.
        check(fn, x.round().to(torch.uint8), ops=[op.default])
    g = torch.randn(1, 3, *size)
    for op in (aten._upsample_bilinear2d_aa_backward, aten._upsample_bicubic2d_aa_backward):
        fn = functools.partial(op, output_size=size, input_size=[1, 3, 17, 13], align_corners=align)
        check(fn, g, rtol=1e-5, atol=1e-5, ops=[op.default])


@pytest.mark.parametrize("size,align", [([9, 11], False), ([40, 29], True), ([17, 30], False)])
def test_upsample_bicubic_uint8(size, align):
    u8 = torch.randint(0, 256, (1, 3, 17, 13), dtype=torch.uint8)
    check(lambda x: aten.upsample_bicubic2d(x, size, align), u8, ops=[aten.upsample_bicubic2d.default])


def test_upsample_functional_antialias():
    F = torch.nn.functional
    x = torch.rand(2, 3, 20, 24)
    check(lambda x: F.interpolate(x, size=(7, 9), mode="bilinear", antialias=True), x, rtol=1e-5, atol=1e-5,
          ops=[aten._upsample_bilinear2d_aa.default])
    check(lambda x: F.interpolate(x, scale_factor=0.3, mode="bicubic", antialias=True), x, rtol=1e-5, atol=1e-5,
          ops=[aten._upsample_bicubic2d_aa.default])
