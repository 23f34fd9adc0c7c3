"""Indexing, gather/scatter and search lowerings against eager."""

import pytest
import torch
import torch.nn.functional as F
from harness import check, lower_and_run
from torch_tpu.compiler.lowering import LoweringError

aten = torch.ops.aten
torch.manual_seed(0)
X = torch.randn(4, 5, 6)
I4 = torch.tensor([0, 3, -1, 2])
I5 = torch.tensor([[1, -5], [4, 0]])
I6 = torch.tensor([5, 0, -6, 2])


# -- index.Tensor ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "indices",
    [
        (I4,),
        (None, I5),
        (None, None, I6),
        (I4, None, I6),  # separated advanced indices: batch dims first
        (I4[:2, None], I5),  # broadcast together, adjacent
        (None, I5, I6[:2]),
        (I4[:2], I5[0], I6[1:3]),
        (torch.tensor(2), None, I6),  # 0-d index
        (I4.int(),),
        (torch.zeros(0, dtype=torch.long),),
    ],
    ids=lambda ix: "_".join("N" if i is None else "x".join(map(str, i.shape)) or "0d" for i in ix),
)
def test_index(indices):
    tensors = [i for i in indices if i is not None]

    def fn(x, *ts):
        it = iter(ts)
        return aten.index.Tensor(x, [None if i is None else next(it) for i in indices])

    check(fn, X, *tensors, ops=[aten.index.Tensor])


def test_index_python_syntax():
    check(lambda x, i: x[:, i, None, 1:3], X, I5)
    check(lambda x, i, j: x[i, 1:, j], X, I4, I6)
    check(lambda x, i: x[..., i], X, I6)
    check(lambda x, i: x[i], torch.arange(10), torch.tensor([[9, -10], [3, 3]]))


def test_index_int_and_bool_dtypes():
    check(lambda x, i: x[i], torch.randint(-9, 9, (6, 3)), I6)
    check(lambda x, i: x[:, i], torch.rand(3, 6) > 0.5, I6)
    check(lambda x, i: x[i], X.double(), I4)


def test_index_bool_mask_fails():
    with pytest.raises(LoweringError, match="boolean mask"):
        lower_and_run(lambda x, m: aten.index.Tensor(x, [m]), X, X[:, 0, 0] > 0)


def test_unsafe_index():
    check(lambda x, i, j: aten._unsafe_index.Tensor(x, [None, i, j]), X, I5, I6[:2], ops=[aten._unsafe_index.Tensor])


def test_unsafe_masked_index():
    idx = torch.tensor([[0, 7], [-2, 3]])
    mask = (idx >= 0) & (idx < 5)
    check(lambda x, m, i: aten._unsafe_masked_index(x, m, [None, i], 0.5), X, mask[..., None], idx, ops=[aten._unsafe_masked_index.default])
    check(lambda x, m, i: aten._unsafe_masked_index(x, m, [i], -1), torch.arange(5), mask, idx)


# -- index_put -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("accumulate", [False, True])
def test_index_put(accumulate):
    unique = torch.tensor([3, 0, -1])
    check(lambda x, i, v: aten.index_put(x, [i], v, accumulate), X, unique, torch.randn(3, 5, 6), ops=[aten.index_put.default])
    check(lambda x, i, v: aten.index_put(x, [None, i], v, accumulate), X, unique, torch.randn(6))  # broadcast values
    check(lambda x, i, j, v: aten.index_put(x, [i, None, j], v, accumulate), X, unique, torch.tensor([0, 5, 2]), torch.randn(3, 5))
    check(lambda x, i, v: aten.index_put(x, [i], v, accumulate), torch.arange(8), torch.tensor([1, 5]), torch.tensor(7))


def test_index_put_accumulate_duplicates():
    check(lambda x, i, v: aten.index_put(x, [i], v, True), torch.zeros(5), torch.tensor([1, 1, 4, 1]), torch.tensor([1.0, 2.0, 3.0, 4.0]))
    check(lambda x, i, v: aten._unsafe_index_put(x, [i], v, True), torch.zeros(5, 2), torch.tensor([1, 1]), torch.ones(2, 2), ops=[aten._unsafe_index_put.default])


def test_index_put_bool_mask_scalar():
    # (constants are passed as inputs: 0-d get_attr constants hit an importer bug)
    check(lambda x, m, v: aten.index_put(x, [m], v), X, X > 0, torch.tensor(2.0))
    check(lambda x, m, v: aten.index_put(x, [None, m], v, False), X, X[0] > 0, torch.randn(4, 1))
    check(lambda x, m, v: aten.index_put(x, [m], v, True), X, X[:, :, 0] > 0, torch.tensor(1.5))
    check(lambda x, m, v: aten.index_put(x, [m], v), X, X[:, :, 0] > 0, torch.randn(1, 6))


def test_index_put_bool_mask_per_element_fails():
    with pytest.raises(LoweringError, match="boolean mask"):
        lower_and_run(lambda x, m, v: aten.index_put(x, [m], v), torch.zeros(4), torch.tensor([True, False, True, False]), torch.ones(2))


def test_unsafe_masked_index_put_accumulate():
    idx = torch.tensor([[0, 7], [-2, 3], [1, 1]])
    mask = (idx >= 0) & (idx < 5)
    fn = lambda x, m, i, v: aten._unsafe_masked_index_put_accumulate(x, m, [i], v)
    check(fn, torch.zeros(5), mask, idx, torch.randn(3, 2), ops=[aten._unsafe_masked_index_put_accumulate.default])


# -- index_select / gather / take / put --------------------------------------------------------------
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_index_select(dim):
    check(lambda x, i: torch.index_select(x, dim, i), X, torch.tensor([0, 3, 3, 1]), ops=[aten.index_select.default])


def test_index_select_edge():
    check(lambda x, i: torch.index_select(x, 1, i), X, torch.tensor(2))
    check(lambda x, i: torch.index_select(x, 0, i), torch.tensor(3.0), torch.tensor([0]))
    check(lambda x, i: torch.index_select(x, 0, i), torch.arange(6), torch.zeros(0, dtype=torch.long))


@pytest.mark.parametrize("dim", [0, 1, 2, -2])
def test_gather(dim):
    size = X.shape[dim]
    index = torch.randint(0, size, (3, 4, 2))
    check(lambda x, i: torch.gather(x, dim, i), X, index, ops=[aten.gather.default])
    check(lambda x, i: torch.gather(x, dim, i), X, torch.randint(0, size, X.shape))


def test_gather_edge():
    check(lambda x, i: torch.gather(x, 0, i), torch.tensor(5.0), torch.tensor(0))
    check(lambda x, i: torch.gather(x, 1, i), torch.randint(0, 9, (3, 4)), torch.tensor([[3], [0], [1]]))
    check(lambda x, i: torch.gather(x, 1, i), X, torch.zeros(4, 0, 6, dtype=torch.long))
    check(lambda x, i: torch.take_along_dim(x, i, 2), X, torch.randint(0, 6, (4, 5, 1)))


def test_take_put():
    check(lambda x, i: torch.take(x, i), X, torch.tensor([[0, 119], [-1, 37]]), ops=[aten.take.default])
    check(lambda x, i, s: torch.put(x, i, s), X, torch.tensor([3, -1, 50]), torch.randn(3), ops=[aten.put.default])
    check(lambda x, i, s: torch.put(x, i, s, accumulate=True), torch.zeros(2, 3), torch.tensor([[1, 1], [5, -1]]), torch.ones(2, 2))


# -- scatter family ------------------------------------------------------------------------------------------
def _unique_index(shape, dim, size):
    """An index of `shape` whose entries along `dim` are distinct (scatter is
    nondeterministic with duplicates)."""
    dim = dim % len(shape)
    perm = torch.stack([torch.randperm(size)[: shape[dim]] for _ in range(torch.Size(shape).numel() // shape[dim])])
    moved = list(shape[:dim]) + list(shape[dim + 1:]) + [shape[dim]]
    return perm.reshape(moved).movedim(-1, dim).contiguous()


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_scatter(dim):
    size = X.shape[dim]
    full_index = _unique_index(list(X.shape), dim, size)
    small = list(X.shape)
    small[dim] = 2
    small[(dim + 1) % 3] = 3  # smaller than self in another dim, too
    small_index = _unique_index(small, dim, size)
    src = torch.randn(4, 5, 6)
    check(lambda x, i, s: torch.scatter(x, dim, i, s), X, full_index, src, ops=[aten.scatter.src])
    check(lambda x, i, s: torch.scatter(x, dim, i, s), X, small_index, src)
    check(lambda x, i: torch.scatter(x, dim, i, 2.5), X, small_index, ops=[aten.scatter.value])


def test_scatter_edge():
    check(lambda x, i, s: torch.scatter(x, 0, i, s), torch.tensor(2.0), torch.tensor(0), torch.tensor(7.0))
    check(lambda x, i: torch.scatter(x, 1, i, True), torch.zeros(2, 3, dtype=torch.bool), torch.tensor([[0], [2]]))
    check(lambda x, i, s: torch.scatter(x, 1, i, s), torch.zeros(2, 3, dtype=torch.long), torch.tensor([[0, 2], [2, 1]]), torch.tensor([[5, 6], [7, 8]]))


@pytest.mark.parametrize("reduce", ["add", "multiply"])
def test_scatter_reduce_legacy(reduce):
    index = torch.randint(0, 4, (3, 5, 6))
    check(lambda x, i, s: torch.scatter(x, 0, i, s, reduce=reduce), X, index, torch.randn(3, 5, 6), ops=[aten.scatter.reduce])
    check(lambda x, i: torch.scatter(x, 0, i, 1.5, reduce=reduce), X, index, ops=[aten.scatter.value_reduce])


def test_scatter_add():
    index = torch.randint(0, 5, (4, 3, 6))
    check(lambda x, i, s: torch.scatter_add(x, 1, i, s), X, index, torch.randn(4, 3, 6), ops=[aten.scatter_add.default])
    check(lambda i, s: torch.zeros(3, dtype=torch.long).scatter_add(0, i, s), torch.tensor([0, 2, 2, 2]), torch.tensor([1, 2, 3, 4]))


@pytest.mark.parametrize("reduce", ["sum", "prod", "mean", "amax", "amin"])
@pytest.mark.parametrize("include_self", [True, False])
def test_scatter_reduce_two(reduce, include_self):
    index = torch.randint(0, 5, (4, 3, 6))
    fn = lambda x, i, s: torch.scatter_reduce(x, 1, i, s, reduce, include_self=include_self)
    check(fn, X, index, torch.randn(4, 3, 6), ops=[aten.scatter_reduce.two])
    ints = torch.randint(-20, 20, (4, 5, 6))
    check(fn, ints, index, torch.randint(-20, 20, (4, 3, 6)))


def test_scatter_reduce_nan():
    x = torch.tensor([1.0, 2.0, 3.0])
    check(lambda x, i, s: torch.scatter_reduce(x, 0, i, s, "amax"), x, torch.tensor([0, 0, 2]), torch.tensor([float("nan"), 5.0, 1.0]))


# -- index_add / copy / fill / reduce ---------------------------------------------------------------------------
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_index_add_copy(dim):
    size = X.shape[dim]
    index = torch.randperm(size)[:3]
    shape = list(X.shape)
    shape[dim] = 3
    src = torch.randn(shape)
    check(lambda x, i, s: torch.index_add(x, dim, i, s), X, index, src, ops=[aten.index_add.default])
    check(lambda x, i, s: torch.index_add(x, dim, i, s, alpha=-2.0), X, index.repeat(1)[[0, 0, 1]], src)
    check(lambda x, i, s: torch.index_copy(x, dim, i, s), X, index, src, ops=[aten.index_copy.default])


@pytest.mark.parametrize("dim", [0, 1, -1])
@pytest.mark.parametrize("index_shape", [(1,), ()], ids=["one", "scalar"])
def test_index_copy_of_one_slice_is_a_dynamic_update_slice(dim, index_shape):
    """A single index (a KV cache's new position) lowers to dynamic_update_slice, not a
    scatter; each position, first and last included, matches eager."""
    for position in (0, X.shape[dim] - 1, 1):
        index = torch.tensor(position).reshape(index_shape)
        shape = list(X.shape)
        shape[dim] = 1
        src = torch.randn(shape)
        check(lambda x, i, s: torch.index_copy(x, dim, i, s), X, index, src, ops=[aten.index_copy.default])
    gm = torch.fx.experimental.proxy_tensor.make_fx(lambda x, i, s: torch.index_copy(x, dim, i, s))(
        X, torch.tensor(1).reshape(index_shape), torch.randn(shape))
    from torch_tpu.compiler.importer import import_graph

    text = str(import_graph(gm).module)
    assert "stablehlo.dynamic_update_slice" in text and "stablehlo.scatter" not in text


def test_index_add_int_scalar_index():
    check(lambda x, i, s: torch.index_add(x, 0, i, s, alpha=3), torch.zeros(5, 3, dtype=torch.long), torch.tensor(1), torch.ones(1, 3, dtype=torch.long))


@pytest.mark.parametrize("dim", [0, 2, -2])
def test_index_fill(dim):
    check(lambda x, i: torch.index_fill(x, dim, i, -1.5), X, torch.tensor([0, -1, 0]), ops=[aten.index_fill.int_Scalar])
    check(lambda x, i, v: torch.index_fill(x, dim, i, v), X, torch.tensor([1]), torch.tensor(3.0), ops=[aten.index_fill.int_Tensor])


@pytest.mark.parametrize("reduce", ["prod", "mean", "amax", "amin"])
@pytest.mark.parametrize("include_self", [True, False])
def test_index_reduce(reduce, include_self):
    fn = lambda x, i, s: torch.index_reduce(x, 1, i, s, reduce, include_self=include_self)
    check(fn, X, torch.tensor([0, 4, 0, 2]), torch.randn(4, 4, 6), ops=[aten.index_reduce.default])
    check(fn, torch.randint(-9, 9, (3, 5)), torch.tensor([1, 1, 3]), torch.randint(-9, 9, (3, 3)))


# -- masked ops ------------------------------------------------------------------------------------------------------
def test_masked_fill():
    check(lambda x, m: x.masked_fill(m, 0.25), X, X > 0, ops=[aten.masked_fill.Scalar])
    check(lambda x, m, v: x.masked_fill(m, v), X, X[0, :, :1] > 0, torch.tensor(-3.0), ops=[aten.masked_fill.Tensor])
    check(lambda x, m: x.masked_fill(m, 7), torch.arange(6).reshape(2, 3), torch.tensor([True, False, True]))
    check(lambda x, m: x.masked_fill(m, 1.0), torch.zeros(3), torch.tensor([[True], [False]]))  # broadcasts self


def test_masked_scatter():
    check(lambda x, m, s: x.masked_scatter(m, s), X, X > 0, torch.randn(200), ops=[aten.masked_scatter.default])
    check(lambda x, m, s: x.masked_scatter(m, s), torch.zeros(3, 4), torch.tensor([True, False, True, True]), torch.arange(12.0).reshape(4, 3))
    check(lambda x, m, s: x.masked_scatter(m, s), torch.zeros(5, dtype=torch.long), torch.tensor([False] * 5), torch.arange(3))


def test_masked_scatter_backward():
    fn = lambda g, m: aten.masked_scatter_backward(g, m, [4, 7])
    check(fn, torch.randn(3, 5), torch.rand(3, 5) > 0.4, ops=[aten.masked_scatter_backward.default])
    check(fn, torch.randn(3, 5), torch.rand(5) > 0.4)


def test_nonzero_static():
    fn = lambda x: torch.nonzero_static(x, size=8)
    check(fn, torch.tensor([[0, 1, 1], [1, 0, 0]]), ops=[aten.nonzero_static.default])
    check(lambda x: torch.nonzero_static(x, size=2, fill_value=9), torch.tensor([0.0, 1.0, 2.0, 3.0]))


def _import_single_op(op, *args):
    """A one-node FX graph `op(*args)` with fake-tensor metadata (make_fx refuses to
    trace data-dependent ops such as .item() itself)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch_tpu.compiler.importer import import_graph

    graph = torch.fx.Graph()
    mode = FakeTensorMode()
    nodes = []
    for i, a in enumerate(args):
        node = graph.placeholder(f"x{i}")
        node.meta["val"] = mode.from_tensor(a)
        nodes.append(node)
    out = graph.call_function(op, tuple(nodes))
    graph.output(out)
    return import_graph(torch.fx.GraphModule(torch.nn.Module(), graph))


@pytest.mark.parametrize(
    "op, args, match",
    [
        (aten.nonzero.default, (X,), "nonzero"),
        (aten.masked_select.default, (X, X > 0), "masked_select"),
        (aten._local_scalar_dense.default, (X.sum(),), r"data-dependent \.item\(\) cannot be compiled"),
        (aten.bincount.default, (torch.tensor([1, 2]),), "bincount"),
    ],
    ids=["nonzero", "masked_select", "item", "bincount"],
)
def test_data_dependent_fails(op, args, match):
    with pytest.raises(LoweringError, match=match):
        _import_single_op(op, *args)


# -- searchsorted / bucketize ---------------------------------------------------------------------------------------------
SEQ = torch.tensor([-2.0, -1.0, 0.0, 0.0, 0.5, 3.0, 3.0, 7.0])
VALS = torch.tensor([[-3.0, -2.0, 0.0, 0.1], [3.0, 7.0, 8.0, float("nan")]])


@pytest.mark.parametrize("right", [False, True])
def test_searchsorted(right):
    check(lambda s, v: torch.searchsorted(s, v, right=right), SEQ, VALS, ops=[aten.searchsorted.Tensor])
    check(lambda s, v: torch.searchsorted(s, v, right=right, out_int32=True), SEQ, VALS)
    batched = torch.sort(torch.randn(2, 3, 9), dim=-1).values
    check(lambda s, v: torch.searchsorted(s, v, right=right), batched, torch.randn(2, 3, 4))
    check(lambda s: torch.searchsorted(s, 0.25, right=right), SEQ, ops=[aten.searchsorted.Scalar])
    check(lambda s, v: torch.searchsorted(s, v, right=right), torch.tensor([1, 3, 3, 9]), torch.tensor([0, 3, 4, 10]))


def test_searchsorted_side_sorter_nan():
    unsorted = torch.tensor([3.0, -1.0, 7.0, 0.0, 0.5])
    sorter = torch.argsort(unsorted)
    check(lambda s, v, o: torch.searchsorted(s, v, side="right", sorter=o), unsorted, VALS, sorter)
    check(lambda s, v: torch.searchsorted(s, v), torch.tensor([1.0, 2.0, float("nan")]), torch.tensor([1.5, 3.0, float("nan")]))
    check(lambda s, v: torch.searchsorted(s, v), torch.tensor([5.0]), torch.tensor([1.0, 5.0, 9.0]))


@pytest.mark.parametrize("right", [False, True])
def test_bucketize(right):
    check(lambda v, b: torch.bucketize(v, b, right=right), VALS, SEQ, ops=[aten.bucketize.Tensor])
    check(lambda b: torch.bucketize(0.0, b, right=right, out_int32=True), SEQ, ops=[aten.bucketize.Scalar])


# -- isin / histc / histogram -------------------------------------------------------------------------------------------------------
def test_isin():
    check(lambda a, b: torch.isin(a, b), torch.arange(12).reshape(3, 4), torch.tensor([3, 7, 7, 11, 20]), ops=[aten.isin.Tensor_Tensor])
    check(lambda a, b: torch.isin(a, b, invert=True), torch.tensor([1.0, float("nan"), -0.0]), torch.tensor([0.0, float("nan")]))
    check(lambda a: torch.isin(a, 3), torch.arange(6), ops=[aten.isin.Tensor_Scalar])
    check(lambda b: torch.isin(3, b), torch.arange(6), ops=[aten.isin.Scalar_Tensor])
    check(lambda a, b: torch.isin(a, b), torch.arange(4), torch.zeros(0, dtype=torch.long))


# Values on the edges (exact for these ranges), on the rightmost edge, outside, NaN, infinite.
ON_EDGES = torch.tensor([-2.0, -1.5, 0.0, 0.5, 2.0, 2.5, -3.0, float("nan"), float("inf"), float("-inf"), 1.75])


def _edges_and_neighbours(edges: torch.Tensor) -> torch.Tensor:
    """Each edge and the floats just below and above it: where the interpolated bin is
    off by one and the kernel's search against the edges corrects it. Subnormals are left
    out: XLA flushes them to zero."""
    x = torch.cat([edges, torch.nextafter(edges, edges - 1), torch.nextafter(edges, edges + 1)])
    return x[(x.abs() >= torch.finfo(x.dtype).tiny) | (x == 0)]


def test_histc():
    x = torch.cat([torch.randn(50), torch.tensor([2.0, -2.0, 1.0, float("nan"), 5.0])])
    check(lambda x: torch.histc(x, bins=8, min=-2, max=2), x, ops=[aten.histc.default])
    check(lambda x: torch.histc(x, bins=5), torch.randn(40))  # the data's range
    check(lambda x: torch.histc(x, bins=3), torch.full((4,), 2.0))  # a single value: [v - 1, v + 1]
    check(lambda x: torch.histc(x, bins=4, min=0, max=1), torch.rand(30).double())
    # Near the edges the bin hangs on the last bit of (x - min) * bins / (max - min).
    edges = torch.histogram(torch.zeros(1), 6, range=(0.1, 0.7)).bin_edges
    check(lambda x: torch.histc(x, bins=6, min=0.1, max=0.7), torch.cat([_edges_and_neighbours(edges), torch.rand(2000) * 0.6 + 0.1]))


@pytest.mark.parametrize("density", [False, True])
def test_histogram_bin_count(density):
    x = torch.cat([torch.randn(60), ON_EDGES])
    hist = lambda x: torch.histogram(x, bins=8, range=(-2.0, 2.0), density=density)
    check(hist, x, ops=[aten.histogram.bin_ct])
    check(lambda x: torch.histogram(x, bins=5, density=density), torch.randn(3, 4, 5))  # the data's range
    check(lambda x, w: torch.histogram(x, bins=6, range=(-1.0, 3.0), weight=w, density=density), torch.randn(40), torch.rand(40))
    check(lambda x: torch.histogram(x, bins=7, density=density), torch.randn(33).double())


def test_histogram_bin_count_follows_the_edges():
    for lo, hi, bins in [(-1.0, 1.0, 7), (0.1, 0.7, 6), (-3.3, 2.9, 13)]:
        edges = torch.histogram(torch.zeros(1), bins, range=(lo, hi)).bin_edges
        check(lambda x: torch.histogram(x, bins, range=(lo, hi)), _edges_and_neighbours(edges))
        check(lambda x: torch.histogram(x, bins), _edges_and_neighbours(edges))  # the data's range: the same edges


def test_histogram_degenerate_and_empty():
    check(lambda x: torch.histogram(x, bins=3), torch.full((4,), 2.0))  # a single value: [v - 0.5, v + 0.5]
    check(lambda x: torch.histogram(x, bins=4, range=(1.0, 1.0)), torch.tensor([0.5, 1.0, 1.2, 1.5, 2.0]))
    check(lambda x: torch.histogram(x, bins=3), torch.zeros(0))  # no data: [0, 1]
    check(lambda x: torch.histogram(x, bins=3, density=True), torch.zeros(0, 2))  # 0 / 0: NaN


@pytest.mark.parametrize("density", [False, True])
def test_histogram_bins_tensor(density):
    edges = torch.tensor([-2.0, -1.5, -1.0, 0.0, 0.25, 2.0])  # not evenly spaced
    x = torch.cat([torch.randn(66), ON_EDGES])
    check(lambda x, e: torch.histogram(x, e, density=density), x, edges, ops=[aten.histogram.bins_tensor])
    check(lambda x, e, w: torch.histogram(x, e, weight=w, density=density), x.reshape(7, 11), edges, torch.rand(7, 11))
    check(lambda x, e: torch.histogram(x, e, density=density), x.double(), edges.double())


@pytest.mark.parametrize("density", [False, True])
def test_histogramdd_bin_counts(density):
    ops = [aten._histogramdd_bin_edges.default, aten._histogramdd_from_bin_cts.default]
    points = torch.randn(50, 2)
    check(lambda x: torch.histogramdd(x, bins=4, density=density), points, ops=ops)
    check(lambda x: torch.histogramdd(x, bins=[3, 5], range=[-1.0, 1.0, 0.0, 2.0], density=density), points)
    on_edges = torch.stack([ON_EDGES, ON_EDGES.flip(0)], dim=1)
    check(lambda x: torch.histogramdd(x, bins=[8, 4], range=[-2.0, 2.0, -2.0, 2.0], density=density), on_edges)
    check(lambda x, w: torch.histogramdd(x, bins=[2, 3, 4], weight=w, density=density), torch.randn(6, 7, 3), torch.rand(6, 7))
    check(lambda x: torch.histogramdd(x, bins=[3, 2, 2], density=density), torch.randn(30, 3).double())


@pytest.mark.parametrize("density", [False, True])
def test_histogramdd_bin_tensors(density):
    e0 = torch.tensor([-2.0, -1.5, -1.0, 0.0, 0.25, 2.0])
    e1 = torch.tensor([-1.0, 0.5, 2.0])
    e2 = torch.tensor([-3.0, -0.5, 0.0, 1.0])
    on_edges = torch.stack([ON_EDGES, ON_EDGES.flip(0)], dim=1)
    fn = lambda x, a, b: torch.histogramdd(x, bins=[a, b], density=density)
    check(fn, torch.cat([torch.randn(40, 2), on_edges]), e0, e1, ops=[aten._histogramdd_from_bin_tensors.default])
    fn = lambda x, a, b, c, w: torch.histogramdd(x, bins=[a, b, c], weight=w, density=density)
    check(fn, torch.randn(5, 8, 3), e0, e1, e2, torch.rand(5, 8))


# -- _embedding_bag -------------------------------------------------------------------------------------------------------------
W = torch.randn(10, 3)
BAG_IDX = torch.tensor([1, 2, 4, 5, 4, 3, 2, 9])
BAG_OFF = torch.tensor([0, 4, 4, 6])


@pytest.mark.parametrize("mode", [0, 1, 2])
@pytest.mark.parametrize("include_last_offset", [False, True])
def test_embedding_bag(mode, include_last_offset):
    # With include_last_offset the last offset is len(indices) (ATen's kernels disagree otherwise).
    offsets = torch.cat([BAG_OFF, torch.tensor([8])]) if include_last_offset else BAG_OFF
    fn = lambda w, i, o: aten._embedding_bag(w, i, o, False, mode, False, None, include_last_offset)
    check(fn, W, BAG_IDX, offsets, ops=[aten._embedding_bag.default])
    fn = lambda w, i, o: aten._embedding_bag(w, i, o, False, mode, False, None, include_last_offset, 4)
    check(fn, W.double(), BAG_IDX.int(), offsets.int())


def test_embedding_bag_per_sample_weights_and_functional():
    fn = lambda w, i, o, p: aten._embedding_bag(w, i, o, False, 0, False, p)
    check(fn, W, BAG_IDX, BAG_OFF, torch.rand(8))
    check(lambda w, i: F.embedding_bag(i, w, mode="max"), W, BAG_IDX.reshape(2, 4), ops=[aten._embedding_bag_forward_only.default])
    check(lambda w, i, o: F.embedding_bag(i, w, o, mode="mean", padding_idx=2), W, BAG_IDX, BAG_OFF)
    check(lambda w, i, o: F.embedding_bag(i, w, o, mode="sum", include_last_offset=True), W, BAG_IDX, torch.tensor([0, 3, 8]))


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
@pytest.mark.parametrize("padding_idx", [None, 4])
def test_embedding_bag_backward(mode, padding_idx):
    def grad(w, i, o, g):
        w = w.detach().requires_grad_()
        out = F.embedding_bag(i, w, o, mode=mode, padding_idx=padding_idx)
        return torch.autograd.grad(out, w, g)[0]

    check(grad, W, BAG_IDX, BAG_OFF, torch.randn(4, 3), ops=[aten._embedding_bag_backward.default])

@pytest.mark.parametrize("mode", ["sum", "mean"])
def test_embedding_bag_backward_scale_grad_by_freq(mode):
    # ATen's CPU kernel divides by the count of the wrong index when an index repeats
    # (counts[indices[group]] instead of counts[indices[start of group]]); the lowering
    # divides by each index's own frequency, as CUDA and F.embedding do. Unique indices
    # agree with eager; repeated ones are checked against a hand-written reference.
    fn = lambda w, i, o, g: _grad_of(lambda w: F.embedding_bag(i, w, o, mode=mode, scale_grad_by_freq=True), w, g)
    g = torch.randn(4, 3)
    check(fn, W, torch.tensor([1, 2, 4, 5, 0, 3, 7, 9]), BAG_OFF, g)
    actual, _, _ = lower_and_run(fn, W, BAG_IDX, BAG_OFF, g)
    bags = [0, 0, 0, 0, 2, 2, 3, 3]
    sizes = [4, 0, 2, 2]
    counts = torch.bincount(BAG_IDX, minlength=10)
    expected = torch.zeros(10, 3)
    for i, v in enumerate(BAG_IDX.tolist()):
        scale = 1.0 / counts[v].item() / (sizes[bags[i]] if mode == "mean" else 1)
        expected[v] += g[bags[i]] * scale
    torch.testing.assert_close(actual, expected)


def _grad_of(f, w, g):
    w = w.detach().requires_grad_()
    return torch.autograd.grad(f(w), w, g)[0]


def test_embedding_bag_per_sample_weights_backward():
    def grads(w, i, o, p, g):
        w = w.detach().requires_grad_()
        p = p.detach().requires_grad_()
        out = F.embedding_bag(i, w, o, mode="sum", per_sample_weights=p, padding_idx=2)
        return torch.autograd.grad(out, (w, p), g)

    check(grads, W, BAG_IDX, BAG_OFF, torch.rand(8), torch.randn(4, 3), ops=[aten._embedding_bag_per_sample_weights_backward.default])


@pytest.mark.parametrize("mode", [1, 2])
def test_embedding_bag_dense_backward(mode):
    _, offset2bag, bag_size, max_indices = aten._embedding_bag(W, BAG_IDX, BAG_OFF, False, mode)
    fn = lambda g, i, ob, bs, mi: aten._embedding_bag_dense_backward(g, i, ob, bs, mi, 10, False, mode, None)
    check(fn, torch.randn(4, 3), BAG_IDX, offset2bag, bag_size, max_indices, ops=[aten._embedding_bag_dense_backward.default])


# -- segment_reduce -------------------------------------------------------------------------------
SEG_REDUCTIONS = ["sum", "mean", "max", "min", "prod"]
SEG_LENGTHS = torch.tensor([2, 0, 3, 1])  # an empty segment between full ones
SEG_OFFSETS = torch.tensor([0, 2, 2, 5, 6])


def _segment(reduce, by="lengths", **kwargs):
    return lambda d, b: torch.segment_reduce(d, reduce, **{by: b}, **kwargs)


@pytest.mark.parametrize("reduce", SEG_REDUCTIONS)
@pytest.mark.parametrize("initial", [None, 2.5])
def test_segment_reduce_lengths_and_offsets(reduce, initial):
    data = torch.randn(6)
    check(_segment(reduce, initial=initial), data, SEG_LENGTHS, ops=[aten.segment_reduce.default])
    check(_segment(reduce, by="offsets", initial=initial), data, SEG_OFFSETS, ops=[aten.segment_reduce.default])
    check(_segment(reduce, by="offsets", initial=initial), data, SEG_OFFSETS.int())


@pytest.mark.parametrize("reduce", SEG_REDUCTIONS)
def test_segment_reduce_axis0_with_inner_dims(reduce):
    check(_segment(reduce), torch.randn(6, 3, 2), SEG_LENGTHS)
    check(_segment(reduce, by="offsets", initial=-1.0), torch.randn(6, 4).double(), SEG_OFFSETS)


@pytest.mark.parametrize("reduce", SEG_REDUCTIONS)
def test_segment_reduce_nonzero_axis_batched_lengths(reduce):
    # lengths batched over data's leading dims; axis is the lengths' last dim.
    lengths = torch.tensor([[2, 0, 3, 1], [0, 6, 0, 0], [1, 1, 1, 3]])
    check(_segment(reduce, axis=1), torch.randn(3, 6), lengths)
    check(_segment(reduce, axis=1, initial=0.5), torch.randn(3, 6, 2), lengths)
    offsets = torch.cat([torch.zeros(3, 1, dtype=torch.long), lengths.cumsum(1)], 1).reshape(3, 1, 5).expand(3, 2, 5)
    check(_segment(reduce, by="offsets", axis=2), torch.randn(3, 2, 6).double(), offsets.contiguous())


@pytest.mark.parametrize("reduce", SEG_REDUCTIONS)
def test_segment_reduce_nan_and_partial_coverage(reduce):
    data = torch.tensor([1.0, float("nan"), 3.0, -2.0, 0.0, 4.0, 7.0])
    check(_segment(reduce), data, torch.tensor([2, 2, 0, 3]))
    # unsafe lengths summing short of the axis, offsets not starting at 0: the rest is unused.
    check(_segment(reduce, unsafe=True), data, torch.tensor([1, 2, 0]))
    check(_segment(reduce, by="offsets"), data, torch.tensor([2, 4, 4, 6]))


@pytest.mark.parametrize("reduce", SEG_REDUCTIONS)
def test_segment_reduce_empty_data(reduce):
    check(_segment(reduce), torch.randn(0, 3), torch.tensor([0, 0]))
    check(_segment(reduce, initial=3.0), torch.randn(0), torch.tensor([0]))
    check(_segment(reduce, by="offsets", axis=1), torch.randn(2, 4), torch.tensor([[0], [0]]))


def _segment_grad(reduce, by="lengths", **kwargs):
    def grad(d, b, g):
        d = d.detach().requires_grad_()
        out = torch.segment_reduce(d, reduce, **{by: b}, **kwargs)
        return torch.autograd.grad(out, d, g)[0]

    return grad


@pytest.mark.parametrize("reduce", SEG_REDUCTIONS)
def test_segment_reduce_backward(reduce):
    # Ties (5, 5 and -1, -1), zeros and a NaN: max/min split positive gradients among ties,
    # prod takes the exclusive product at zeros and NaNs.
    data = torch.tensor([1.0, 5.0, 5.0, 2.0, -1.0, -1.0, 0.0, 0.0, 3.0, 0.0, 2.0, 4.0, float("nan"), 2.0, 1.0])
    lengths = torch.tensor([3, 3, 3, 0, 3, 3])
    g = torch.tensor([2.0, -4.0, 1.0, 9.0, 3.0, -2.0])
    check(_segment_grad(reduce), data, lengths, g, ops=[aten._segment_reduce_backward.default])
    check(_segment_grad(reduce, initial=1.5), data, lengths, g)
    offsets = torch.tensor([1, 4, 7, 7, 10, 13, 15])
    check(_segment_grad(reduce, by="offsets"), data, offsets, g)


@pytest.mark.parametrize("reduce", SEG_REDUCTIONS)
def test_segment_reduce_backward_axis1_float64(reduce):
    data = torch.randn(2, 6, 3).double()
    data[0, 1] = data[0, 0]  # a tie along the axis
    data[1, 4, 1] = 0.0
    lengths = torch.tensor([[2, 0, 4], [3, 3, 0]])
    check(_segment_grad(reduce, axis=1), data, lengths, torch.randn(2, 3, 3).double())


def test_segment_reduce_backward_direct():
    data = torch.randn(6, 2)
    out = torch.segment_reduce(data, "max", lengths=SEG_LENGTHS)
    fn = lambda g, o, d, b: aten._segment_reduce_backward(g, o, d, "max", lengths=b)
    check(fn, torch.randn(4, 2), out, data, SEG_LENGTHS, ops=[aten._segment_reduce_backward.default])
