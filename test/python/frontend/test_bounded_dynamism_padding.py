"""Bounded dynamism never reads padding: the padding classes of the lowering table
(compiler/lowering/registry.py `Padding`) and the repros of issues #11 and #19, each
compiled against eager with a bound (`mark_dynamic(min=2, max=64)`) and without one
(`mark_dynamic(x, d)`); the #19 argmax repro also with automatic dynamic (a second shape
turns it on; `MODES` says why only there).

Tolerances: float32, atol/rtol 1e-4 (reassociation at the bound); integers exact."""

from __future__ import annotations

import logging

import pytest
import torch
import torch.fx.experimental._config as fx_config
import torch.nn.functional as F
from torch_tpu.backend import _compile
from torch_tpu.compiler.lowering import LOWERINGS, Padding
from torch_tpu.compiler.lowering.registry import declare_padding, lowers

aten = torch.ops.aten
TOL = {"atol": 1e-4, "rtol": 1e-4}
# "automatic" (nothing marked: Dynamo makes a dimension dynamic when a second size arrives)
# hands the backend the graph and bounds "unbounded" does: dumps of both runs of this file
# (TORCH_TPU_DUMP_DIR) held the same graph fingerprints (FX graph + bounds) for every test
# but the argmax repro of #19, where automatic dynamic chose other bounds. It runs there only;
# its first, static compile is the ordinary static path.
MODES = ("bounded", "unbounded")
WITH_AUTOMATIC = (*MODES, "automatic")


@pytest.fixture(autouse=True)
def _fresh():
    torch._dynamo.reset()
    _compile._reported_fallbacks.clear()
    with fx_config.patch(backed_size_oblivious=True):
        yield
    torch._dynamo.reset()


def _run(fn, make, dims, mode: str, sizes=(3, 5, 7, 9, 11)):
    """Compiles `fn` once and compares it with eager at each size; `make(n)` builds the
    inputs, `dims` lists (input, dim) pairs marked dynamic."""
    compiled = torch.compile(fn, backend="tpu")
    for n in sizes:
        inputs = make(n)
        expected = fn(*[t.clone() for t in inputs])
        if mode != "automatic":
            for i, d in dims:
                if mode == "bounded":
                    torch._dynamo.mark_dynamic(inputs[i], d, min=2, max=64)
                else:
                    torch._dynamo.mark_dynamic(inputs[i], d)
        actual = compiled(*inputs)
        torch.testing.assert_close(actual, expected, **TOL, msg=f"size {n}, {mode}")


def _fallbacks(caplog) -> set[str]:
    return {
        r.getMessage().split("torch_tpu: ", 1)[1].split(" cannot be compiled")[0]
        for r in caplog.records
        if "cannot be compiled" in r.getMessage()
    }


# -- the table ---------------------------------------------------------------------------------
def test_every_lowering_declares_its_padding_class():
    undeclared = [str(op) for op, low in LOWERINGS.items() if low.padding is None]
    assert undeclared == []


def test_classes_and_rules_are_declared_only_for_lowered_overloads():
    """The real table (scratch-table cases: test/python/lowering/test_registry.py)."""
    with pytest.raises(ValueError, match="has no lowering"):
        declare_padding(Padding.SAFE, aten.chunk.default)
    with pytest.raises(ValueError, match="declared SAFE and MASKED"):
        declare_padding(Padding.MASKED, aten.trunc.default)
    with pytest.raises(ValueError, match="two lowerings"):
        lowers(aten.trunc.default)(lambda ctx, x: x)
    with pytest.raises(ValueError, match="two lowerings"):
        lowers(aten.mean.dim, dynamic=Padding.COUNT, dynamic_rule=lambda ctx, *a: NotImplemented)(lambda ctx, x: x)


def test_undeclared_lowering_falls_back_with_a_dynamic_operand(monkeypatch, caplog):
    """The safe default: a lowering with no class is not trusted with padding."""
    from dataclasses import replace

    monkeypatch.setitem(LOWERINGS, aten.trunc.default, replace(LOWERINGS[aten.trunc.default], padding=None))
    with caplog.at_level(logging.WARNING, logger="torch_tpu"):
        _run(lambda x: torch.trunc(x * 3), lambda n: [torch.randn(n, 2)], [(0, 0)], "bounded", (3, 5))
    messages = [r.getMessage() for r in caplog.records if "aten.trunc.default" in r.getMessage()]
    assert messages and "declares no padding class" in messages[0]


def test_documented_limit_is_logged_without_asking_for_a_report(caplog):
    with caplog.at_level(logging.WARNING, logger="torch_tpu"):
        _run(lambda x: x.flip(0) * 2, lambda n: [torch.randn(n, 2)], [(0, 0)], "bounded", (3, 5))
    [message] = [r.getMessage() for r in caplog.records if "aten.flip.default" in r.getMessage()]
    assert "not supported with bounded dynamism" in message and "report" not in message


# -- issue #19 item 1: bounded repros ----------------------------------------------------------
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", ["median", "nanmedian"])
def test_median_falls_back_along_a_dynamic_dim(name, mode, caplog):
    fn = (lambda x: x.median(0).values) if name == "median" else (lambda x: x.nanmedian(0).values)
    with caplog.at_level(logging.WARNING, logger="torch_tpu"):
        _run(fn, lambda n: [torch.arange(2.0 * n).reshape(n, 2) + 1], [(0, 0)], mode)
    assert f"aten.{name}.dim" in _fallbacks(caplog)


def test_median_along_a_static_dim_compiles(monkeypatch):
    monkeypatch.setenv("TORCH_TPU_STRICT", "1")
    _run(lambda x: x.median(1).values, lambda n: [torch.randn(n, 5)], [(0, 0)], "bounded")


@pytest.mark.parametrize("mode", MODES)
def test_histc_does_not_count_padding(mode, caplog):
    with caplog.at_level(logging.WARNING, logger="torch_tpu"):
        _run(
            lambda x: torch.histc(x, bins=4, min=-2, max=2),
            lambda n: [torch.full((n, 2), 1.5)],
            [(0, 0)],
            mode,
        )
    assert "aten.histc.default" in _fallbacks(caplog)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("how", ["sum", "mean"])
def test_embedding_bag_with_a_dynamic_index_length(how, mode):
    weight = torch.randn(10, 3, generator=torch.Generator().manual_seed(0))
    _run(
        lambda i, o: F.embedding_bag(i, weight, o, mode=how),
        lambda n: [torch.randint(0, 10, (2 * n,)), torch.tensor([0, 2, n])],
        [(0, 0)],
        mode,
    )


# -- issue #19 item 2: unbounded / automatic dynamic -------------------------------------------
@pytest.mark.parametrize("mode", WITH_AUTOMATIC)
def test_argmax_flattened_automatic_dynamic(mode, monkeypatch):
    """The issue's repro: n = 3..11 on rand(n, n + 2) gave 20, 39, 152 for 11, 29, 125."""
    monkeypatch.setenv("TORCH_TPU_STRICT", "1")  # compiled, not a fallback
    g = torch.Generator().manual_seed(0)
    _run(torch.argmax, lambda n: [torch.rand(n, n + 2, generator=g)], [(0, 0), (0, 1)], mode)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    "fn",
    [
        lambda x: torch.argmin(x),
        lambda x: torch.argmax(x, 1, keepdim=True),
        lambda x: torch.argmin(x, 0, keepdim=True),
        lambda x: x.max(1),
        lambda x: x.min(0),
    ],
    ids=["argmin", "argmax_dim_keepdim", "argmin_dim0_keepdim", "max_dim", "min_dim"],
)
@pytest.mark.parametrize("dt", [torch.float32, torch.int64])
def test_arg_reductions_never_pick_padding(fn, dt, mode, monkeypatch):
    """Negative values: the zero padding would win an argmax; ties go to the first one."""
    monkeypatch.setenv("TORCH_TPU_STRICT", "1")
    g = torch.Generator().manual_seed(1)

    def make(n):
        return [(-(torch.rand(n, n + 2, generator=g) * 5) - 1).round().to(dt)]

    _run(fn, make, [(0, 0), (0, 1)], mode)


_SCATTERS = {
    "value": lambda x, i, s: x.scatter(0, i, 2.5 if x.is_floating_point() else 3),
    "src": lambda x, i, s: x.scatter(0, i, s),
    "add": lambda x, i, s: x.scatter_add(0, i, s),
    "dim1": lambda x, i, s: x.scatter_add(1, i.remainder(3), s),
    **{
        f"{how}_{include}": (
            lambda how, include: lambda x, i, s: x.scatter_reduce(0, i, s, how, include_self=include)
        )(how, include)
        for how in ("sum", "prod", "mean", "amax", "amin")
        for include in (True, False)
    },
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dt", [torch.float32, torch.int64])
@pytest.mark.parametrize("form", sorted(_SCATTERS))
def test_scatter_forms_never_scatter_padding(form, dt, mode):
    g = torch.Generator().manual_seed(2)

    def make(n):
        # The index has fewer rows than self and src: its own dynamic size.
        return [
            (torch.rand(n + 1, 3, generator=g) * 4).to(dt) + 1,
            torch.randint(0, n + 1, (n, 3), generator=g),
            (torch.rand(n + 2, 3, generator=g) * 4).to(dt) + 1,
        ]

    _run(_SCATTERS[form], make, [(0, 0), (1, 0), (2, 0)], mode)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("right", [False, True])
def test_bucketize_with_dynamic_boundaries(right, mode):
    g = torch.Generator().manual_seed(3)
    _run(
        lambda x, b: torch.bucketize(x, b, out_int32=True, right=right),
        lambda n: [torch.rand(n + 1, generator=g), torch.sort(torch.rand(n, generator=g)).values],
        [(0, 0), (1, 0)],
        mode,
    )


@pytest.mark.parametrize("mode", MODES)
def test_bucketize_with_static_boundaries_compiles(mode, monkeypatch):
    monkeypatch.setenv("TORCH_TPU_STRICT", "1")
    boundaries = torch.tensor([0.1, 0.5, 0.5, 0.9])
    _run(
        lambda x: torch.bucketize(x, boundaries, right=True),
        lambda n: [torch.tensor([0.5, 0.1, 0.95, 0.3] * n)],
        [(0, 0)],
        mode,
    )


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("longer", ["key", "query"])
def test_sdpa_causal_with_different_lengths(longer, mode):
    g = torch.Generator().manual_seed(4)

    def make(n):
        lq, lk = (n, n + 3) if longer == "key" else (n + 3, n)
        return [torch.randn(1, 2, lq, 4, generator=g), torch.randn(1, 2, lk, 4, generator=g),
                torch.randn(1, 2, lk, 4, generator=g)]

    _run(
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
        make,
        [(0, 2), (1, 2), (2, 2)],
        mode,
    )


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    "fn",
    [
        lambda x: F.interpolate(x, scale_factor=2, mode="nearest"),
        lambda x: F.interpolate(x, size=7, mode="nearest"),
        lambda x: F.interpolate(x[:, :, None], scale_factor=(1, 2), mode="nearest")[:, :, 0],
        lambda x: F.interpolate(x[:, :, None].expand(-1, -1, 3, -1), size=(5, 6), mode="bilinear"),
        lambda x: F.interpolate(x[:, :, None].expand(-1, -1, 3, -1), scale_factor=1.5, mode="bilinear"),
    ],
    ids=["nearest1d_scale", "nearest1d_size", "nearest2d_scale", "bilinear_size", "bilinear_scale"],
)
def test_upsample_and_interpolate_along_a_dynamic_dim(fn, mode):
    g = torch.Generator().manual_seed(5)
    _run(fn, lambda n: [torch.randn(1, 2, n, generator=g)], [(0, 2)], mode)


@pytest.mark.parametrize("mode", MODES)
def test_trunc_compiles_with_a_dynamic_operand(mode, monkeypatch):
    monkeypatch.setenv("TORCH_TPU_STRICT", "1")
    _run(lambda x: torch.trunc(x * 3), lambda n: [torch.randn(n, 2)], [(0, 0)], mode)


@pytest.mark.parametrize("mode", ["bounded", "unbounded"])
def test_index_with_negative_indices_counts_from_the_runtime_end(mode, monkeypatch):
    monkeypatch.setenv("TORCH_TPU_STRICT", "1")
    index = torch.tensor([-1, 0, -2])
    _run(lambda x: x[index] * 2, lambda n: [torch.randn(n, 3)], [(0, 0)], mode)


_INDEX_WRITES = {
    "index_put": lambda x, i, v: x.index_put((i,), v),
    "index_put_accumulate": lambda x, i, v: x.index_put((i,), v, accumulate=True),
    "index_add": lambda x, i, v: x.index_add(0, i.abs(), v),
    "index_copy": lambda x, i, v: x.index_copy(0, i + 1, v),
    "index_fill": lambda x, i, v: x.index_fill(0, i, 7.0),
    "index_reduce_amax": lambda x, i, v: x.index_reduce(0, i.abs(), v, "amax", include_self=False),
}


@pytest.mark.parametrize("mode", ["bounded", "unbounded"])
@pytest.mark.parametrize("form", sorted(_INDEX_WRITES))
def test_index_writes_never_write_padding(form, mode, monkeypatch):
    """Compiled (no fallback): padded index entries write nothing, negative ones count
    from the run-time end (index_add/index_copy/index_reduce take non-negative ones)."""
    monkeypatch.setenv("TORCH_TPU_STRICT", "1")
    g = torch.Generator().manual_seed(6)

    def make(n):
        index = torch.randperm(n + 2, generator=g)[:n] - 1  # distinct, one may be -1
        return [torch.zeros(n + 2, 3), index, torch.rand(n, 3, generator=g) + 1]

    _run(_INDEX_WRITES[form], make, [(0, 0), (1, 0), (2, 0)], mode, (3, 5, 7))


# -- ops XLA's dynamic padder rejected ("XLA cannot compile the module: Dynamic ...") --------
@pytest.mark.parametrize("mode", ["bounded", "unbounded"])
@pytest.mark.parametrize(
    "name, fn, make, dims",
    [
        # A while loop inside the op: run on the static layout.
        ("igamma", lambda a, x: torch.igamma(a, x), lambda n: [torch.rand(n, 3) + 0.5, torch.rand(n, 3) + 0.1], [(0, 0), (1, 0)]),
        ("polygamma", lambda x: torch.polygamma(2, x), lambda n: [torch.rand(n, 3) + 0.5], [(0, 0)]),
        # "Dynamic dimension propagation on DynamicSlice where a partial dimension is selected".
        ("narrow_copy_bool", lambda x: x.narrow_copy(0, 0, 2), lambda n: [torch.rand(n, 3) > 0.5], [(0, 0)]),
        # "Asked to propagate a dynamic dimension ... to fft": along a static dim, batch dynamic.
        ("fft_static_dim", lambda x: torch.fft.fft(x, dim=1).abs(), lambda n: [torch.randn(n, 8)], [(0, 0)]),
        ("conv1d_dynamic_batch", lambda x, w: F.conv1d(x, w), lambda n: [torch.randn(n, 3, 7), torch.randn(4, 3, 3)], [(0, 0)]),
    ],
)
def test_ops_xla_rejected_compile_on_static_layouts(name, fn, make, dims, mode, monkeypatch):
    monkeypatch.setenv("TORCH_TPU_STRICT", "1")
    _run(fn, make, dims, mode, (3, 5))


@pytest.mark.parametrize("mode", ["bounded", "unbounded"])
@pytest.mark.parametrize(
    "name, fn, make, dims, op",
    [
        # "Dynamic output feature dim on convolution kernel is not supported".
        ("conv1d_dynamic_channels", lambda x, w: F.conv1d(x, w), lambda n: [torch.randn(2, 3, 7), torch.randn(n, 3, 3)],
         [(1, 0)], "aten.convolution.default"),
        ("fft_dynamic_dim", lambda x: torch.fft.fft(x, dim=0).abs(), lambda n: [torch.randn(n, 8)], [(0, 0)],
         "aten._fft_r2c.default"),
    ],
)
def test_ops_xla_rejects_fall_back(name, fn, make, dims, op, mode, caplog):
    if name == "fft_dynamic_dim" and mode == "bounded":
        pytest.skip("Dynamo's FFT decomposition guards the size against the other dim: a range is a constraint violation")
    with caplog.at_level(logging.WARNING, logger="torch_tpu"):
        _run(fn, make, dims, mode, (3, 5))
    assert op in _fallbacks(caplog)
