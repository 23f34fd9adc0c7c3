"""View-like and shape lowerings against eager."""

import pytest
import torch
from direct_graph import check_direct
from harness import check, execute, lower_and_run
from torch.fx.experimental.proxy_tensor import make_fx

from torch_tpu.compiler.importer import import_graph
from torch_tpu.compiler.lowering import LoweringError

aten = torch.ops.aten
torch.manual_seed(0)
X = torch.randn(3, 4, 5)
M = torch.randn(4, 6)
I = torch.randint(-9, 9, (3, 4, 5))
B = torch.rand(3, 4) > 0.5
S = torch.tensor(2.5)


# -- reshapes and permutations ---------------------------------------------------------------
@pytest.mark.parametrize("x", [X, I, M.double(), B], ids=["f32", "i64", "f64", "bool"])
def test_view_reshape(x):
    check(lambda t: t.view(-1), x, ops=[aten.view.default])
    check(lambda t: t.reshape(x.shape[0], -1).unsqueeze(-1), x, ops=[aten.unsqueeze.default])
    check(lambda t: aten._unsafe_view(t, [-1, 2]), x, ops=[aten._unsafe_view.default])
    check_direct(aten.reshape.default, x, [2, -1])  # CompositeImplicit: never in make_fx graphs
    check(lambda t: aten.view_copy(t, [-1]), x, ops=[aten.view_copy.default])


def test_squeeze_unsqueeze():
    y = torch.randn(1, 3, 1, 2)
    check(lambda t: t.squeeze(), y, ops=[aten.squeeze.default])
    check(lambda t: t.squeeze(-2), y, ops=[aten.squeeze.dim])
    check(lambda t: t.squeeze(1), y, ops=[aten.squeeze.dim])  # not size 1: no-op
    check(lambda t: t.squeeze((0, 2)), y, ops=[aten.squeeze.dims])
    check(lambda t: t.unsqueeze(0).unsqueeze(-1), S, ops=[aten.unsqueeze.default])
    check(lambda t: t.squeeze(0), S, ops=[aten.squeeze.dim])
    check(lambda t: aten.squeeze_copy.dims(t, [0]), y, ops=[aten.squeeze_copy.dims])
    check(lambda t: aten.unsqueeze_copy(t, 2), y, ops=[aten.unsqueeze_copy.default])


def test_permute_transpose():
    check(lambda t: t.permute(2, 0, 1), X, ops=[aten.permute.default])
    check(lambda t: t.permute(-1, -3, -2), I, ops=[aten.permute.default])
    check(lambda t: t.transpose(0, -1), X, ops=[aten.transpose.int])
    check(lambda t: t.t(), M, ops=[aten.t.default])
    check(lambda t: t[0, 0].t(), M, ops=[aten.t.default])
    check(lambda t: aten.permute_copy(t, [1, 0, 2]), X, ops=[aten.permute_copy.default])
    check(lambda t: aten.transpose_copy(t, 0, 1), M, ops=[aten.transpose_copy.int])
    check_direct(aten.movedim.int, X, 0, -1)
    check_direct(aten.movedim.intlist, X, [0, 1], [2, 0])

def test_expand():
    check(lambda t: t[:, :1].expand(3, 4, 5), X, ops=[aten.expand.default])
    check(lambda t: t.expand(2, -1, -1), M, ops=[aten.expand.default])
    check(lambda t: t.expand(2, 3), S, ops=[aten.expand.default])
    check(lambda t: aten.expand_copy(t, [2, 4, 6]), M, ops=[aten.expand_copy.default])


def test_identity_ops():
    check(lambda t: aten.alias(t) + 1, X, ops=[aten.alias.default])
    check(lambda t: t.clone(memory_format=torch.channels_last), X[None], ops=[aten.clone.default])
    check(lambda t: t.detach(), X, ops=[aten.detach.default])
    check(lambda t: aten.alias_copy(t), X, ops=[aten.alias_copy.default])


# -- slicing --------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "start,end,step",
    [(1, 3, 1), (-3, -1, 1), (None, None, 2), (-100, 100, 3), (4, 2, 1), (2, None, 2), (10, 20, 1)],
)
def test_slice(start, end, step):
    check(lambda t: aten.slice.Tensor(t, 1, start, end, step), X, ops=[aten.slice.Tensor])
    check(lambda t: aten.slice_copy.Tensor(t, -1, start, end, step), I, ops=[aten.slice_copy.Tensor])


def test_indexing_views():
    check(lambda t: t[1:, ::2, -2], X, ops=[aten.slice.Tensor, aten.select.int])
    check(lambda t: t.select(-1, -1), X, ops=[aten.select.int])
    check(lambda t: aten.select_copy.int(t, 0, 2), I, ops=[aten.select_copy.int])
    check_direct(aten.narrow.default, X, 1, -3, 2)


def _splitter(sizes, dim):
    return lambda t: t.split(sizes, dim)


def test_split_unbind():
    check(lambda t: t.split(2, dim=1), X, ops=[aten.split.Tensor])
    check(lambda t: t.split([1, 3, 1], dim=-1), X, ops=[aten.split_with_sizes.default])
    # check_direct cannot take list-returning ops: trace split_with_sizes, then retarget.
    for op, sizes, dim in ((aten.split.default, [2, 1], 0), (aten.split.sizes, [1, 3, 1], -1)):
        gm = make_fx(_splitter(sizes, dim), tracing_mode="fake")(X)
        (node,) = [n for n in gm.graph.nodes if n.target is aten.split_with_sizes.default]
        node.target = op
        gm.recompile()
        torch.testing.assert_close(list(execute(import_graph(gm), [X])), list(op(X, sizes, dim)))
    check(lambda t: t.chunk(3, 0), M, ops=[aten.split.Tensor])
    check(lambda t: t.unbind(1), X, ops=[aten.unbind.int])
    check(lambda t: tuple(aten.unsafe_split.Tensor(t, 4, 1)), M, ops=[aten.unsafe_split.Tensor])
    check(lambda t: tuple(aten.split_with_sizes_copy(t, [0, 4], 0)), M, ops=[aten.split_with_sizes_copy.default])
    check(lambda t: tuple(aten.unbind_copy.int(t, -1)), M, ops=[aten.unbind_copy.int])


@pytest.mark.parametrize("dim,size,step", [(1, 2, 1), (-1, 3, 2), (0, 3, 3), (2, 5, 1)])
def test_unfold(dim, size, step):
    check(lambda t: t.unfold(dim, size, step), X, ops=[aten.unfold.default])


def test_unfold_scalar():
    check(lambda t: t.unfold(0, 1, 1), S, ops=[aten.unfold.default])


# -- concatenation ------------------------------------------------------------------------------------
def test_cat():
    check(lambda a, b: torch.cat([a, b], dim=-1), X, X[..., :2], ops=[aten.cat.default])
    check(lambda a, b: torch.cat([a, b, a]), M, M[:1], ops=[aten.cat.default])


def test_cat_promotes():
    check(lambda a, b: torch.cat([a, b], 1), I, X, ops=[aten.cat.default])
    check(lambda a, b: torch.cat([a, b]), B, B.int(), ops=[aten.cat.default])
    check(lambda a, b: torch.cat([a, b]), M.half(), M.double(), ops=[aten.cat.default])


def test_cat_skips_empty_1d():
    check(lambda a, b: torch.cat([a, b, a], dim=1), M, torch.empty(0), ops=[aten.cat.default])
    check(lambda a, b: torch.cat([b, a]), M, torch.empty(0, dtype=torch.int64), ops=[aten.cat.default])


def test_stack():
    check(lambda a, b: torch.stack([a, b]), M, M * 2, ops=[aten.stack.default])
    check(lambda a, b: torch.stack([a, b], dim=-1), M, I[0, :, :1].expand(4, 6).float(), ops=[aten.stack.default])
    check(lambda a, b: torch.stack([a, b], 0), S, S, ops=[aten.stack.default])


# -- reordering --------------------------------------------------------------------------------------
def _rotator(k):
    return lambda t: t.rot90(k, (1, 2))


def test_flip_roll_rot90():
    check(lambda t: t.flip(0, -1), X, ops=[aten.flip.default])
    check(lambda t: t.flip(()), I, ops=[aten.flip.default])
    check(lambda t: t.roll(2, 1), X, ops=[aten.roll.default])
    check(lambda t: t.roll((-1, 7), (0, 2)), X, ops=[aten.roll.default])
    check(lambda t: t.roll(5), M, ops=[aten.roll.default])
    for k in (-1, 0, 1, 2, 3, 5):
        check(_rotator(k), X, ops=[aten.rot90.default])


def test_repeat():
    check(lambda t: t.repeat(2, 1, 3), X, ops=[aten.repeat.default])
    check(lambda t: t.repeat(2, 3, 1), M, ops=[aten.repeat.default])
    check(lambda t: t.repeat(3, 2), S, ops=[aten.repeat.default])
    check(lambda t: t.repeat(0, 1), M, ops=[aten.repeat.default])
    check(lambda t: t.tile(2), B, ops=[aten.repeat.default])


def test_pixel_shuffle():
    y = torch.randn(2, 8, 3, 5)
    check(lambda t: torch.nn.functional.pixel_shuffle(t, 2), y, ops=[aten.pixel_shuffle.default])
    check(lambda t: torch.nn.functional.pixel_unshuffle(t, 2), torch.randn(2, 2, 4, 6), ops=[aten.pixel_unshuffle.default])
    check(lambda t: torch.nn.functional.pixel_shuffle(t, 2), y[0], ops=[aten.pixel_shuffle.default])


# -- padding -------------------------------------------------------------------------------------
def test_constant_pad():
    check(lambda t: aten.constant_pad_nd(t, [1, 2]), X, ops=[aten.constant_pad_nd.default])
    check(lambda t: aten.constant_pad_nd(t, [1, -2, -1, 3], 2.5), X, ops=[aten.constant_pad_nd.default])
    check(lambda t: aten.constant_pad_nd(t, [0, 1, 1, 0, 2, 2], -1), I, ops=[aten.constant_pad_nd.default])
    check(lambda t: torch.nn.functional.pad(t, (1, 1), value=1.0), B, ops=[aten.constant_pad_nd.default])


@pytest.mark.parametrize("mode", ["reflect", "replicate"])
def test_edge_pads(mode):
    pad = torch.nn.functional.pad
    suffix = "reflection" if mode == "reflect" else "replication"
    x1, x2, x3 = torch.randn(2, 3, 6), torch.randn(2, 3, 5, 6), torch.randn(1, 2, 4, 5, 6)
    check(lambda t: pad(t, (2, 3), mode=mode), x1, ops=[getattr(aten, f"{suffix}_pad1d").default])
    check(lambda t: pad(t, (1, 2, 3, 0), mode=mode), x2, ops=[getattr(aten, f"{suffix}_pad2d").default])
    check(lambda t: pad(t, (1, 2, 0, 3, 2, 1), mode=mode), x3, ops=[getattr(aten, f"{suffix}_pad3d").default])
    check(lambda t: getattr(aten, f"{suffix}_pad1d")(t, [-1, 2]), x1)
    check(lambda t: getattr(aten, f"{suffix}_pad2d")(t, [2, -2, -1, 1]), x2[0])


@pytest.mark.parametrize("n", [1, 2, 3])
@pytest.mark.parametrize("pair", [[2, 1], [-1, 3], [0, -2]])
def test_replication_pad_backward(n, pair):
    x = torch.randn(*([2, 3] + [5, 4, 6][:n]))
    padding = pair * n
    op = getattr(aten, f"replication_pad{n}d_backward").default
    grad = torch.randn(getattr(aten, f"replication_pad{n}d")(x, padding).shape)
    check(lambda g, t: op(g, t, padding), grad, x, ops=[op])


# -- triangles and diagonals -----------------------------------------------------------------------
@pytest.mark.parametrize("k", [0, 1, -2, 10])
def test_tril_triu(k):
    check(lambda t: t.tril(k), X, ops=[aten.tril.default])
    check(lambda t: t.triu(k), I, ops=[aten.triu.default])
    check(lambda t: t.triu(k), B, ops=[aten.triu.default])


@pytest.mark.parametrize("offset,dim1,dim2", [(0, 0, 1), (1, 1, 2), (-2, -1, 0), (2, 2, 1), (7, 0, 1), (-1, 0, 2)])
def test_diagonal(offset, dim1, dim2):
    check(lambda t: t.diagonal(offset, dim1, dim2), X, ops=[aten.diagonal.default])
    check(lambda t: aten.diagonal_copy(t, offset, dim1, dim2), I, ops=[aten.diagonal_copy.default])
    src = torch.zeros_like(X.diagonal(offset, dim1, dim2)) + 7
    check(lambda t, s: torch.diagonal_scatter(t, s, offset, dim1, dim2), X, src, ops=[aten.diagonal_scatter.default])
    check(
        lambda s: aten.diagonal_backward(s, list(X.shape), offset, dim1, dim2), src, ops=[aten.diagonal_backward.default]
    )


def test_diag_embed():
    check(lambda t: torch.diag_embed(t), M, ops=[aten.diag_embed.default])
    check(lambda t: torch.diag_embed(t, 1, 0, 2), M, ops=[aten.diag_embed.default])
    check(lambda t: torch.diag_embed(t, -2, -1, 0), I[0], ops=[aten.diag_embed.default])


# -- scatters into views -------------------------------------------------------------------------------
@pytest.mark.parametrize("dim,start,end,step", [(1, 1, 3, 1), (0, None, None, 2), (-1, -4, None, 3), (2, 2, 2, 1)])
def test_slice_scatter(dim, start, end, step):
    src = aten.slice.Tensor(X, dim, start, end, step) * 0 - 5
    check(lambda t, s: torch.slice_scatter(t, s, dim, start, end, step), X, src, ops=[aten.slice_scatter.default])
    check(
        lambda s: aten.slice_backward(s, list(X.shape), dim, start if start is not None else 0, end if end is not None else 2**62, step),
        src,
        ops=[aten.slice_backward.default],
    )


def test_select_scatter():
    check(lambda t, s: torch.select_scatter(t, s, 1, -1), X, torch.ones(3, 5), ops=[aten.select_scatter.default])
    check(lambda t, s: torch.select_scatter(t, s, 0, 0), M, torch.ones(6), ops=[aten.select_scatter.default])
    check(lambda s: aten.select_backward(s, [3, 4, 5], 2, 1), torch.ones(3, 4), ops=[aten.select_backward.default])


# -- as_strided --------------------------------------------------------------------------------------
def test_as_strided():
    check(lambda t: t.as_strided((2, 2), (1, 2)), M, ops=[aten.as_strided.default])
    check(lambda t: t.as_strided((3, 3), (4, 1), 5), M, ops=[aten.as_strided.default])
    check(lambda t: t.as_strided((4, 4), (0, 1)), X, ops=[aten.as_strided.default])  # overlapping output
    check(lambda t: aten.as_strided_copy(t, [2, 3], [1, 2], 1), M, ops=[aten.as_strided_copy.default])


def test_as_strided_of_permuted_input():
    # The input is a transposed view: its storage is M's, which the lowering rebuilds.
    check(lambda t: t.t().as_strided((3, 2), (2, 1), 1), M, ops=[aten.as_strided.default])


def test_as_strided_scatter():
    check(lambda t, s: torch.as_strided_scatter(t, s, (2, 2), (1, 2)), M, torch.ones(2, 2), ops=[aten.as_strided_scatter.default])
    check(lambda t, s: torch.as_strided_scatter(t, s, (3,), (7,), 2), M, torch.arange(3.0), ops=[aten.as_strided_scatter.default])


def test_as_strided_of_a_view_reads_its_base_storage():
    # The view holds 12 of the 18 elements read: as_strided addresses t's storage.
    check(lambda t: t[:2].as_strided((3, 6), (6, 1)), M, ops=[aten.as_strided.default])
    check(lambda t: t.diagonal().as_strided((2, 2), (3, 1), 1), M[:, :4].contiguous())


def test_as_strided_out_of_bounds_fails():
    # A graph input that is a view: storage outside its elements is not in the program.
    with pytest.raises(LoweringError, match="outside the input"):
        lower_and_run(lambda t: t.as_strided((3, 6), (6, 1)), M[:2])


# -- values: copy, dtype conversion, dtype views ------------------------------------------------------
def test_copy_and_to_copy():
    check(lambda t, s: aten.copy(t, s), X, I[0, 0], ops=[aten.copy.default])
    check(lambda t, s: aten.copy(t, s), I, X, ops=[aten.copy.default])
    check(lambda t: t.to(torch.int32), X * 10, ops=[aten._to_copy.default])
    check(lambda t: t.to(torch.float16), X, ops=[aten._to_copy.default])
    check(lambda t: t.to(torch.bool), I, ops=[aten._to_copy.default])
    check(lambda t: t.to(torch.float64), B, ops=[aten._to_copy.default])
    check(lambda t: t.to(torch.complex64), X, ops=[aten._to_copy.default])
    check(lambda t: t.to(torch.bfloat16).to(torch.float32), X, ops=[aten._to_copy.default])


def test_complex_views():
    c = torch.randn(3, 4, dtype=torch.complex64)
    check(lambda t: torch.view_as_real(t), c, ops=[aten.view_as_real.default])
    check(lambda t: torch.view_as_complex(t), torch.randn(3, 4, 2), ops=[aten.view_as_complex.default])


def test_view_dtype():
    check(lambda t: t.view(torch.int32), X, ops=[aten.view.dtype])
    check(lambda t: t.view(torch.int16), X, ops=[aten.view.dtype])
    check(lambda t: t.view(torch.float64), M, ops=[aten.view.dtype])
    check(lambda t: t.view(torch.uint8), M.half(), ops=[aten.view.dtype])
    check(lambda t: t.view(torch.float32), torch.randn(3, 2, dtype=torch.complex64), ops=[aten.view.dtype])
    check(lambda t: t.view(torch.complex64), M, ops=[aten.view.dtype])


def test_other_dtypes_and_empty():
    c = torch.randn(3, 3, dtype=torch.complex64)
    u8 = torch.randint(0, 255, (2, 3), dtype=torch.uint8)
    check(lambda t: torch.cat([t, t[:0]]), M, ops=[aten.cat.default])
    check(lambda t: t.tril(-1), c, ops=[aten.tril.default])
    check(lambda t: t.diagonal(), c, ops=[aten.diagonal.default])
    check(lambda t: t.flip(0).permute(1, 0), M.bfloat16(), ops=[aten.flip.default])
    check(lambda t: t.repeat(2, 1).roll(1, 1), u8, ops=[aten.repeat.default, aten.roll.default])
    check(lambda t: t.real.to(torch.float64), c, ops=[aten._to_copy.default])
    check(lambda t: t.view(5, 0).unsqueeze(0), torch.empty(0, 5), ops=[aten.view.default])
    check(lambda t: t[2:2].flip(0), M, ops=[aten.flip.default])


def test_remaining_copy_variants():
    check(lambda t: aten._reshape_alias(t, [12, 5], [5, 1]), X, ops=[aten._reshape_alias.default])
    check(lambda t: aten.detach_copy(t), X, ops=[aten.detach_copy.default])
    check(lambda t: aten.t_copy(t), M, ops=[aten.t_copy.default])
    check(lambda t: aten.unfold_copy(t, 1, 2, 2), M, ops=[aten.unfold_copy.default])
    check(lambda t: tuple(aten.split_copy.Tensor(t, 2, 1)), X, ops=[aten.split_copy.Tensor])
    check(lambda t: tuple(aten.unsafe_split_with_sizes(t, [1, 2], 0)), X, ops=[aten.unsafe_split_with_sizes.default])
    check(lambda t: aten.squeeze_copy(t), X[:1], ops=[aten.squeeze_copy.default])
    check(lambda t: aten.squeeze_copy.dim(t, 0), X[:1], ops=[aten.squeeze_copy.dim])
    check(lambda t: aten.view_copy.dtype(t, torch.int32), M, ops=[aten.view_copy.dtype])


@pytest.mark.parametrize(
    "source, target",
    [(torch.float64, torch.float32), (torch.float32, torch.int32), (torch.int64, torch.float16),
     (torch.float32, torch.bool), (torch.complex64, torch.complex128)],
)
def test_prims_convert_element_type(source, target):
    """What aot_autograd emits for a Python float traced as a graph input."""
    x = (torch.randn(7, dtype=torch.float64) * 50).to(source)
    check_direct(torch.ops.prims.convert_element_type.default, x, target)
