"""Creation lowerings: deterministic ones against eager; random ones by shape, dtype,
range and statistics (they follow PyTorch's distributions, not its bit streams)."""

import math

import pytest
import torch
from harness import check, execute, lower_and_run
from torch.fx.experimental.proxy_tensor import make_fx

from torch_tpu.compiler.importer import import_graph
from torch_tpu.compiler.lowering import LoweringError

aten = torch.ops.aten
torch.manual_seed(0)
X = torch.randn(3, 4)
I = torch.randint(-5, 5, (3, 4))
N = 200_000  # sample size for statistics


def targets(gm):
    return {n.target for n in gm.graph.nodes if n.op == "call_function"}


def run_random(fn, *args, op, seed=0):
    """Lowers and runs `fn`; asserts `op` is in the graph; returns the outputs."""
    gm = make_fx(fn, tracing_mode="fake")(*args)
    assert op in targets(gm), gm.graph
    return execute(import_graph(gm), [a for a in args if isinstance(a, torch.Tensor)], seed=seed)


# -- constants and fills ---------------------------------------------------------------------------
def test_full():
    check(lambda x: x + torch.full((3, 4), 2.5), X, ops=[aten.full.default])
    check(lambda x: torch.full((2, 0, 3), 7, dtype=torch.int32), X, ops=[aten.full.default])
    check(lambda x: torch.full((), True), X, ops=[aten.full.default])
    check(lambda x: torch.full((2,), 1 + 2j), X, ops=[aten.full.default])
    check(lambda x: torch.full((2,), 2.7, dtype=torch.int64), X, ops=[aten.full.default])
    check(lambda x: torch.full((2,), float("-inf"), dtype=torch.bfloat16), X, ops=[aten.full.default])


def test_like_and_new():
    check(lambda x: torch.full_like(x, 3), I, ops=[aten.full_like.default])
    check(lambda x: torch.full_like(x, 0.5, dtype=torch.float16), I, ops=[aten.full_like.default])
    check(lambda x: torch.zeros_like(x), X, ops=[aten.zeros_like.default])
    check(lambda x: torch.ones_like(x, dtype=torch.bool), X, ops=[aten.ones_like.default])
    check(lambda x: x.new_full((2, 2), 4), I, ops=[aten.new_full.default])
    check(lambda x: x.new_zeros(5), X, ops=[aten.new_zeros.default])
    check(lambda x: x.new_ones((1, 2), dtype=torch.int8), X, ops=[aten.new_ones.default])
    check(lambda x: torch.zeros(2, 3, dtype=torch.float64), X, ops=[aten.zeros.default])
    check(lambda x: torch.ones(4), X, ops=[aten.ones.default])


def test_empty_family_gives_zeros():
    # Contents are unspecified in PyTorch; we produce zeros. Compare shapes/dtypes only.
    cases = [
        (lambda x: torch.empty(2, 3), aten.empty.memory_format, (2, 3), torch.float32),
        (lambda x: torch.empty_like(x), aten.empty_like.default, (3, 4), torch.int64),
        (lambda x: torch.empty_strided((2, 3), (1, 2)), aten.empty_strided.default, (2, 3), torch.float32),
        (lambda x: x.new_empty((4,), dtype=torch.float16), aten.new_empty.default, (4,), torch.float16),
        (lambda x: x.new_empty_strided((2, 2), (1, 2)), aten.new_empty_strided.default, (2, 2), torch.int64),
        (lambda x: torch.empty_permuted((2, 3, 4), (0, 2, 1)), aten.empty_permuted.default, (2, 3, 4), torch.float32),
    ]
    for fn, op, shape, dt in cases:
        out = run_random(fn, I, op=op)
        assert out.shape == shape and out.dtype == dt
        assert not out.any()


def test_scalar_tensor_fill_zero():
    check(lambda x: x + torch.scalar_tensor(2.0), X, ops=[aten.scalar_tensor.default])
    check(lambda x: torch.scalar_tensor(3, dtype=torch.int32), X, ops=[aten.scalar_tensor.default])
    check(lambda x: aten.fill.Scalar(x, 2.5), I, ops=[aten.fill.Scalar])
    check(lambda x: aten.fill.Scalar(x, -1), X, ops=[aten.fill.Scalar])
    check(lambda x, v: aten.fill.Tensor(x, v), I, torch.tensor(3.7), ops=[aten.fill.Tensor])
    check(lambda x: aten.zero(x), X, ops=[aten.zero.default])


def test_lift_fresh_copy():
    check(lambda x: x + torch.tensor([1.0, 2.0, 3.0, 4.0]), X, ops=[aten.lift_fresh_copy.default])


# -- ranges -----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "args,kwargs",
    [((5,), {}), ((2, 9), {}), ((1, 10, 3), {}), ((10, 1, -3), {}), ((0.5, 3.0, 0.25), {}), ((3.0, -1.0, -0.7), {}),
     ((0, 5), {"dtype": torch.float64}), ((1.5, 7.9, 1.1), {"dtype": torch.int32}), ((0, 1, 0.1), {}),
     ((-3, 4, 2), {"dtype": torch.float16}), ((4,), {"dtype": torch.bfloat16}), ((5, 5), {})],
)
def test_arange(args, kwargs):
    op = {1: aten.arange.default, 2: aten.arange.start, 3: aten.arange.start_step}[len(args)]
    check(lambda x: torch.arange(*args, **kwargs), X, ops=[op])


@pytest.mark.parametrize(
    "args,kwargs",
    [((0, 1, 5), {}), ((-2.5, 7, 11), {}), ((3, -3, 7), {"dtype": torch.float64}), ((0, 10, 4), {"dtype": torch.int64}),
     ((5, 0, 1), {}), ((1, 2, 0), {}), ((-7, 7, 6), {"dtype": torch.int32}), ((0, 1, 9), {"dtype": torch.float16})],
)
def test_linspace(args, kwargs):
    check(lambda x: torch.linspace(*args, **kwargs), X, ops=[aten.linspace.default])


def test_logspace():
    check(lambda x: torch.logspace(0, 2, 5), X, ops=[aten.logspace.default])
    check(lambda x: torch.logspace(-1, 1, 4, base=2.0, dtype=torch.float64), X, ops=[aten.logspace.default])
    check(lambda x: torch.logspace(0, 3, 4, dtype=torch.int64), X, ops=[aten.logspace.default])


def test_eye_and_indices():
    check(lambda x: torch.eye(3), X, ops=[aten.eye.default])
    check(lambda x: torch.eye(2, 4, dtype=torch.int32), X, ops=[aten.eye.m])
    check(lambda x: torch.eye(3, dtype=torch.bool), X, ops=[aten.eye.default])
    check(lambda x: torch.tril_indices(4, 3, -1), X, ops=[aten.tril_indices.default])
    check(lambda x: torch.triu_indices(3, 5, 1), X, ops=[aten.triu_indices.default])


# -- random ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dt", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_rand(dt):
    out = run_random(lambda x: torch.rand(N, dtype=dt), X, op=aten.rand.default)
    assert out.shape == (N,) and out.dtype == dt
    assert out.min() >= 0 and out.max() < 1
    assert abs(out.double().mean() - 0.5) < 0.01 and abs(out.double().std() - math.sqrt(1 / 12)) < 0.01


@pytest.mark.parametrize("dt", [torch.float32, torch.float64, torch.bfloat16])
def test_randn(dt):
    out = run_random(lambda x: torch.randn(N, dtype=dt), X, op=aten.randn.default)
    assert out.shape == (N,) and out.dtype == dt
    assert abs(out.double().mean()) < 0.01 and abs(out.double().std() - 1) < 0.02
    assert torch.isfinite(out).all()


def test_randn_complex():
    out = run_random(lambda x: torch.randn(N, dtype=torch.complex64), X, op=aten.randn.default)
    assert out.dtype == torch.complex64
    assert abs(out.real.std() - math.sqrt(0.5)) < 0.01 and abs(out.imag.mean()) < 0.01


def test_rand_like_randn_like():
    y = torch.empty(400, 500, dtype=torch.float16)
    u = run_random(lambda x: torch.rand_like(x), y, op=aten.rand_like.default)
    z = run_random(lambda x: torch.randn_like(x, dtype=torch.float32), y, op=aten.randn_like.default)
    assert u.shape == y.shape and u.dtype == torch.float16 and 0 <= u.min() and u.max() < 1
    assert z.dtype == torch.float32 and abs(z.mean()) < 0.01 and abs(z.std() - 1) < 0.01


def test_random_streams_differ_between_ops_and_seeds():
    a, b = run_random(lambda x: (torch.rand(100), torch.rand(100)), X, op=aten.rand.default)
    assert not torch.equal(a, b)
    c = run_random(lambda x: torch.rand(100), X, op=aten.rand.default, seed=0)
    d = run_random(lambda x: torch.rand(100), X, op=aten.rand.default, seed=1)
    assert not torch.equal(c, d)


def test_randint():
    out = run_random(lambda x: torch.randint(-3, 4, (N,)), X, op=aten.randint.low)
    assert out.dtype == torch.int64 and out.min() == -3 and out.max() == 3
    counts = torch.bincount(out + 3).double() / N
    assert (counts - 1 / 7).abs().max() < 0.01
    out = run_random(lambda x: torch.randint(10, (50, 40), dtype=torch.float32), X, op=aten.randint.default)
    assert out.dtype == torch.float32 and out.shape == (50, 40) and out.min() == 0 and out.max() == 9
    assert torch.equal(out, out.round())


def test_randint_like():
    out = run_random(lambda x: torch.randint_like(x, 5), I, op=aten.randint_like.default)
    assert out.shape == I.shape and out.dtype == torch.int64 and 0 <= out.min() and out.max() < 5
    out = run_random(lambda x: torch.randint_like(x, 2, 6), X, op=aten.randint_like.low_dtype)
    assert out.dtype == torch.float32 and 2 <= out.min() and out.max() < 6


def test_random_functional():
    big = torch.empty(N, dtype=torch.int8)
    out = run_random(lambda x: aten.random.default(x), big, op=aten.random.default)
    assert out.dtype == torch.int8 and out.min() >= 0 and out.max() == 127
    out = run_random(lambda x: aten.random.to(x, 3), X, op=aten.random.to)
    assert set(out.unique().tolist()) <= {0.0, 1.0, 2.0}


def test_uniform_normal():
    y = torch.empty(N)
    out = run_random(lambda x: aten.uniform(x, -2.0, 3.0), y, op=aten.uniform.default)
    assert out.min() >= -2 and out.max() < 3 and abs(out.mean() - 0.5) < 0.03
    out = run_random(lambda m: torch.normal(m, 2.0), torch.full((N,), 5.0), op=aten.normal.Tensor_float)
    assert abs(out.mean() - 5) < 0.02 and abs(out.std() - 2) < 0.02
    out = run_random(lambda s: torch.normal(-1.0, s), torch.full((N,), 0.5), op=aten.normal.float_Tensor)
    assert abs(out.mean() + 1) < 0.01 and abs(out.std() - 0.5) < 0.01
    out = run_random(lambda m, s: torch.normal(m, s), torch.zeros(N), torch.ones(1), op=aten.normal.Tensor_Tensor)
    assert out.shape == (N,) and abs(out.std() - 1) < 0.01
    out = run_random(lambda x: torch.normal(3.0, 0.1, (N,), dtype=torch.float64), X, op=aten.normal.float_float)
    assert out.dtype == torch.float64 and abs(out.mean() - 3) < 0.01 and abs(out.std() - 0.1) < 0.002


def test_other_distributions():
    y = torch.empty(N)
    out = run_random(lambda x: aten.exponential(x, 2.0), y, op=aten.exponential.default)
    assert out.min() >= 0 and abs(out.mean() - 0.5) < 0.01
    out = run_random(lambda x: aten.geometric(x, 0.25), y, op=aten.geometric.default)
    assert out.min() >= 1 and torch.equal(out, out.round()) and abs(out.mean() - 4) < 0.05
    out = run_random(lambda x: aten.cauchy(x, 1.0, 2.0), y, op=aten.cauchy.default)
    assert abs(out.median() - 1) < 0.05 and abs((out - 1).abs().median() - 2) < 0.05
    out = run_random(lambda x: aten.log_normal(x, 0.0, 0.5), y, op=aten.log_normal.default)
    assert out.min() > 0 and abs(out.log().mean()) < 0.01 and abs(out.log().std() - 0.5) < 0.01


def test_bernoulli():
    p = torch.linspace(0, 1, 5).repeat(N // 5)
    out = run_random(lambda x: torch.bernoulli(x), p, op=aten.bernoulli.default)
    assert out.dtype == torch.float32 and set(out.unique().tolist()) <= {0.0, 1.0}
    means = out.reshape(-1, 5).mean(0)
    assert (means - torch.linspace(0, 1, 5)).abs().max() < 0.01
    out = run_random(lambda x: aten.bernoulli.p(x, 0.3), torch.empty(N, dtype=torch.float64), op=aten.bernoulli.p)
    assert out.dtype == torch.float64 and abs(out.mean() - 0.3) < 0.01
    out = run_random(lambda x, q: aten.bernoulli.Tensor(x, q), torch.empty(N), torch.tensor(0.8), op=aten.bernoulli.Tensor)
    assert abs(out.mean() - 0.8) < 0.01


@pytest.mark.parametrize("p", [0.0, 0.2, 0.5, 1.0])
def test_native_dropout(p):
    x = torch.randn(N) + 3
    out, mask = run_random(lambda t: aten.native_dropout(t, p, True), x, op=aten.native_dropout.default)
    assert mask.dtype == torch.bool and out.shape == x.shape
    assert abs(mask.double().mean() - (1 - p)) < 0.01
    scale = 0.0 if p == 1 else 1 / (1 - p)
    torch.testing.assert_close(out, torch.where(mask, x * scale, 0.0))


def test_native_dropout_eval():
    check(lambda t: aten.native_dropout(t, 0.5, False), X, ops=[aten.native_dropout.default])


def test_randperm():
    out = run_random(lambda x: torch.randperm(1000), X, op=aten.randperm.default)
    assert out.dtype == torch.int64 and torch.equal(out.sort().values, torch.arange(1000))
    assert not torch.equal(out, torch.arange(1000))
    out = run_random(lambda x: torch.randperm(7, dtype=torch.float32), X, op=aten.randperm.default)
    assert torch.equal(out.sort().values, torch.arange(7.0))
    # Position statistics: each value lands uniformly.
    perms = run_random(lambda x: torch.stack([torch.randperm(4) for _ in range(120)]), X, op=aten.randperm.default)
    assert len({tuple(p) for p in perms.tolist()}) > 15  # of the 24 permutations
    assert torch.bincount(perms[:, 0], minlength=4).min() > 12


def test_explicit_generator_fails():
    gen = torch.Generator().manual_seed(0)
    with pytest.raises(LoweringError, match="Generator"):
        lower_and_run(lambda x: torch.rand(3, generator=gen), X)


def test_generator_none_overloads():
    """The `.generator` overloads with generator=None draw from the graph's state."""
    y = torch.empty(50, 40)
    cases = [
        (lambda x: aten.rand.generator([50, 40], generator=None), aten.rand.generator, (0, 1)),
        (lambda x: aten.rand_like.generator(x, generator=None), aten.rand_like.generator, (0, 1)),
        (lambda x: aten.randn.generator([50, 40], generator=None), aten.randn.generator, None),
        (lambda x: aten.randn_like.generator(x, generator=None), aten.randn_like.generator, None),
        (lambda x: aten.randint.generator(7, [50, 40], generator=None), aten.randint.generator, (0, 7)),
        (lambda x: aten.randint.low_generator(-2, 3, [50, 40], generator=None), aten.randint.low_generator, (-2, 3)),
        (lambda x: aten.randint_like.generator(x, 4, generator=None), aten.randint_like.generator, (0, 4)),
        (lambda x: aten.randint_like.low_generator_dtype(x, 1, 4, generator=None), aten.randint_like.low_generator_dtype, (1, 4)),
    ]
    for fn, op, bounds in cases:
        out = run_random(fn, y, op=op)
        assert out.shape == (50, 40)
        if bounds is not None:
            assert bounds[0] <= out.min() and out.max() < bounds[1]
    out = run_random(lambda x: aten.randperm.generator(6, generator=None), y, op=aten.randperm.generator)
    assert torch.equal(out.sort().values, torch.arange(6))


def run_one_node(op, *args, **kwargs):
    """Lowers and runs a hand-built one-node graph `op(*args, **kwargs)` (for overloads
    make_fx cannot trace); the result's metadata is `op` run on meta tensors."""
    graph = torch.fx.Graph()
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    feed = iter([graph.placeholder(f"t{i}") for i in range(len(tensors))])
    node_args = []
    for a in args:
        if isinstance(a, torch.Tensor):
            node = next(feed)
            node.meta["val"] = a
            node_args.append(node)
        else:
            node_args.append(a)
    node = graph.call_function(op, tuple(node_args), kwargs)
    node.meta["val"] = op(*args, **kwargs)
    graph.output(node)
    return execute(import_graph(torch.fx.GraphModule({}, graph)), tensors)


def test_randint_like_tensor_high():
    # make_fx cannot trace these (high must be a concrete CPU scalar); graphs can hold them.
    out = run_one_node(aten.randint_like.Tensor, torch.empty(N, dtype=torch.int32), torch.tensor(3))
    assert out.dtype == torch.int32 and out.min() == 0 and out.max() == 2
    out = run_one_node(aten.randint_like.Tensor_generator, torch.empty(10), torch.tensor(2), generator=None)
    assert set(out.unique().tolist()) <= {0.0, 1.0}


def test_lift_fresh():
    torch.testing.assert_close(run_one_node(aten.lift_fresh.default, X), X)  # make_fx makes it lift_fresh_copy
