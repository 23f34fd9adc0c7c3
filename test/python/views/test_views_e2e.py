"""End to end: graphs with views and in-place ops through the non-functional importer,
torchtpu-decompose-views, torchtpu-inverse-views and the runtime, against eager
(outputs and every argument; tolerance 1e-5)."""

import logging

import pytest
import torch
from torch_tpu.backend import BackendOptions
from torch_tpu.compiler.importer import import_graph
from torch_tpu.compiler.lowering import LoweringError
from views_harness import check_against_eager, trace

torch.manual_seed(0)


def test_kv_cache_decode_step_writes_cache_in_place():
    def step(k_cache, v_cache, k, v, pos):
        k_cache[:, :, pos] = k
        v_cache[:, :, pos] = v
        scores = torch.einsum("bhd,bhsd->bhs", k, k_cache)
        return torch.einsum("bhs,bhsd->bhd", scores.softmax(-1), v_cache)

    cache = torch.zeros(2, 3, 8, 4)
    compiled = check_against_eager(step, cache, cache.clone(), torch.randn(2, 3, 4), torch.randn(2, 3, 4), 5)
    assert sorted(compiled.written) == [0, 1]
    text = compiled.imported.text()
    assert "stablehlo.dynamic_update_slice" in text and "torchtpu." not in text


def test_inplace_optimizer_step():
    def sgd_momentum(params, grads, bufs):
        for p, g, b in zip(params, grads, bufs):
            b.mul_(0.9).add_(g)
            p.add_(b, alpha=-0.1)

    params = [torch.randn(4, 3), torch.randn(3)]
    grads = [torch.randn(4, 3), torch.randn(3)]
    bufs = [torch.randn(4, 3), torch.randn(3)]

    def flat(p0, p1, g0, g1, b0, b1):
        sgd_momentum([p0, p1], [g0, g1], [b0, b1])

    check_against_eager(flat, *params, *grads, *bufs)


def test_index_add_through_setitem():
    def f(x, idx, y):
        x[idx] += y
        return x.sum()

    check_against_eager(f, torch.randn(6, 3), torch.tensor([4, 0, 2]), torch.randn(3, 3))


def test_t_inplace_then_write():
    def f(x, y):
        z = x.clone()
        z.t_()
        z.add_(y)
        w = x * 1
        w.t_()  # metadata only, on an unwritten tensor
        return z, w.sum(0), x.t()

    check_against_eager(f, torch.randn(3, 2), torch.randn(2, 3))


def test_metadata_change_of_a_graph_input_is_rejected():
    def f(x):
        x.t_()
        return x + 1

    with pytest.raises(LoweringError, match="changes the shape/strides of a graph input"):
        import_graph(trace(f, torch.randn(3, 2)), functional=False)


def test_writes_through_views_of_views_are_seen_by_other_views():
    def f(x, y):
        rows = x[1:3]
        row = rows[0]
        col = x.t()[2]
        row.mul_(y)
        first = col.clone()
        x.diagonal().fill_(7)
        return first, col * 1, rows.sum(0)

    check_against_eager(f, torch.randn(4, 4), torch.randn(4))


def test_complex_views_diagonal_unfold_as_strided():
    def f(x, y):
        x.diagonal(1).add_(1)
        x.view(-1).unfold(0, 4, 4).mul_(2)  # non-overlapping windows: writable
        windows = x.view(-1).unfold(0, 3, 2)  # overlapping: read only
        x.as_strided((2, 2), (4, 1), 5).copy_(y)
        return windows.sum(-1), x.as_strided((3,), (5,), 0) * 1

    check_against_eager(f, torch.randn(4, 4), torch.randn(2, 2))


def test_write_through_a_non_overlapping_view_of_an_expanded_view():
    def f(x):
        x.unsqueeze(0).expand(2, 3)[1].mul_(3)
        return x.expand(4, 3).sum(0)

    check_against_eager(f, torch.randn(3))


def test_scalar_view_of_an_irregular_view_keeps_rank_zero():
    # select of a gather_view gives 0-d positions; composing views over it must not turn
    # them into shape [1] (found by the property test).
    def f(x):
        x.add_(1)  # written storage: its views are references
        column = x.as_strided([3], [2], 1)
        first = column.unbind(0)[0]
        return first.clone(), first.view(1).clone()

    check_against_eager(f, torch.randn(3, 2))


def test_empty_views_read_and_write():
    def f(x):
        empty = x[4:4]
        empty.zero_()
        windows = empty.unfold(1, 2, 3)
        empty.neg_()
        return windows.clone(), empty.clone()

    check_against_eager(f, torch.randn(4, 2))


def test_in_place_ops_of_many_kinds():
    def f(x, m, idx, src):
        x.mul_(2).sub_(1)
        x[:, 0].fill_(3.0)
        x.masked_fill_(m, -1.0)
        x.index_copy_(0, idx, src)
        x.scatter_(1, torch.zeros(4, 1, dtype=torch.long), src[:, :1])
        torch.add(x[0], 1, out=x[1])
        x.select(1, 2).zero_()
        x.clamp_(min=-0.5)
        return x.relu()

    x = torch.randn(4, 3)
    check_against_eager(f, x, torch.rand(4, 3) > 0.5, torch.tensor([3, 1, 0, 2]), torch.randn(4, 3))


def test_written_local_tensor_and_split_views():
    def f(x):
        buf = torch.zeros(6, 2)
        a, b, c = buf.split(2)
        a.copy_(x)
        b.add_(x * 2)
        c[1] = x[0]
        return buf, x.unbind(0)[1]

    check_against_eager(f, torch.randn(2, 2))


def test_dtype_view_and_reshape_write():
    def f(x, bits):
        x.view(torch.int32).copy_(bits)
        x.view(2, 3).t().add_(1)
        return x

    check_against_eager(f, torch.randn(6), torch.arange(6, dtype=torch.int32) * 1000000)


def test_unwritten_graph_keeps_functional_import():
    gm = trace(lambda x: x.t().sin(), torch.randn(2, 3))
    text = import_graph(gm, functional=False).text()
    assert "torchtpu." not in text


def test_write_to_attribute_constant_is_an_error():
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("state", torch.zeros(3))

        def forward(self, x):
            self.state.add_(x)
            return x

    gm = torch.fx.experimental.proxy_tensor.make_fx(M(), tracing_mode="real")(torch.randn(3))
    with pytest.raises(LoweringError, match="writes a constant/attribute tensor in place"):
        import_graph(gm, functional=False)


# -- the backend option -----------------------------------------------------------------
def _compile(fn):
    torch._dynamo.reset()
    return torch.compile(fn, backend="tpu", options={"functionalize": "torchtpu"})


def test_backend_option_kv_cache_decode_loop():
    class Decoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(8, 16)

        def forward(self, x, k_cache, v_cache, pos):
            k, v = self.proj(x).chunk(2, dim=-1)
            k_cache[:, pos] = k.unsqueeze(1)
            v_cache[:, pos] = v.unsqueeze(1)
            att = (k_cache @ k.unsqueeze(-1)).squeeze(-1).softmax(-1)
            return (att.unsqueeze(-1) * v_cache).sum(1)

    model = Decoder()
    compiled = _compile(model)
    caches = [torch.zeros(2, 6, 8) for _ in range(4)]
    with torch.no_grad():
        for pos in range(3):
            x = torch.randn(2, 8)
            pos_t = torch.tensor([pos])
            expected = model(x, caches[0], caches[1], pos_t)
            got = compiled(x, caches[2], caches[3], pos_t)
            torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(caches[2], caches[0], atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(caches[3], caches[1], atol=1e-5, rtol=1e-5)


def _torch_tpu_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name.startswith("torch_tpu") and r.levelno >= logging.WARNING]


def test_backend_option_inputs_that_alias_each_other_run_safely(caplog):
    def f(a, b):
        a.add_(1)
        return b * 2

    compiled = _compile(f)
    base = torch.zeros(4)
    expected_base = torch.zeros(4)
    expected = f(expected_base[:2], expected_base[1:])
    with torch.no_grad(), caplog.at_level(logging.WARNING, logger="torch_tpu"):
        got = compiled(base[:2], base[1:])
    # b[0] is a[1]: eager reads it after the write, so b * 2 sees the 1 there (a program
    # that reads its inputs before writing them would return 0).
    assert expected.tolist() == [2.0, 0.0, 0.0]
    torch.testing.assert_close(got, expected, atol=0, rtol=0)
    torch.testing.assert_close(base, expected_base, atol=0, rtol=0)
    [message] = _torch_tpu_warnings(caplog)
    assert "writes an input that shares memory with another input" in message, message
    assert "this call runs in PyTorch eager" in message, message


def test_backend_option_falls_back_to_aot_autograd_when_grads_are_needed(caplog, monkeypatch):
    from torch_tpu.backend import _inplace

    # The message is logged once per process: start from a process that has not logged it.
    monkeypatch.setattr(_inplace, "_logged", set())
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 3)
    reference = torch.nn.Linear(3, 3)
    reference.load_state_dict(model.state_dict())
    compiled = _compile(lambda x, buf: (buf.add_(1), model(x))[1])
    x = torch.randn(2, 3)
    x_ref = x.clone().requires_grad_(True)
    x.requires_grad_(True)
    buf = torch.zeros(3)
    with caplog.at_level(logging.WARNING, logger="torch_tpu"):
        out = compiled(x, buf)
    out.square().sum().backward()
    expected = reference(x_ref)
    expected.square().sum().backward()
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(buf, torch.ones(3), atol=0, rtol=0)
    for name, grad in (("x", x.grad), ("weight", model.weight.grad), ("bias", model.bias.grad)):
        assert grad is not None, name
    torch.testing.assert_close(x.grad, x_ref.grad, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(model.weight.grad, reference.weight.grad, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(model.bias.grad, reference.bias.grad, atol=1e-5, rtol=1e-5)
    # The graph went through aot_autograd (said once) and compiled whole: no op fell back.
    [message] = _torch_tpu_warnings(caplog)
    assert "applies to inference graphs only" in message and "aot_autograd" in message, message


def test_backend_option_values():
    assert BackendOptions.parse({"functionalize": "torchtpu"}).functionalize == "torchtpu"
    with pytest.raises(ValueError, match="functionalize='nope' is not known"):
        BackendOptions.parse({"functionalize": "nope"})


@pytest.mark.parametrize("options", [{}, {"functionalize": "torchtpu"}], ids=["aot_autograd", "torchtpu"])
def test_dynamic_shapes_apply_input_mutations_once(options):
    """Graphs Dynamo traces with symbolic sizes are specialized per shape; tracing them
    must not run their in-place ops on the caller's tensors (it used to, once more)."""

    def f(a, b):
        a.add_(1)
        return a + b

    torch._dynamo.reset()
    compiled = torch.compile(f, backend="tpu", options=options, dynamic=True)
    for n in (3, 4):
        a, b = torch.arange(float(n)), torch.ones(n)
        a_eager = a.clone()
        with torch.no_grad():
            out = compiled(a, b)
        torch.testing.assert_close(out, f(a_eager, b.clone()))
        torch.testing.assert_close(a, a_eager)


@pytest.mark.parametrize("donate", ["1", "0"])
def test_donation_switch_keeps_results(monkeypatch, donate):
    """TORCH_TPU_DONATE_WRITTEN_INPUTS=1 (default) donates written inputs
    (tf.aliasing_output), 0 does not; the caller's tensor is updated either way."""
    monkeypatch.setenv("TORCH_TPU_DONATE_WRITTEN_INPUTS", donate)

    def f(cache, k):
        cache[:, 2] = k
        return cache.sum(1)

    compiled = check_against_eager(f, torch.zeros(3, 5), torch.randn(3))
    assert ("tf.aliasing_output" in compiled.imported.text()) == (donate == "1")
    assert compiled.executable.donated_args == ((0,) if donate == "1" else ())


# -- outputs that alias inputs or each other --------------------------------------------
def _returned_views(x):
    y = x * 2
    return y, y[0], y.t()[1:]


def _inplace_then_views_of_a_local(x):
    y = x * 2
    y.add_(1)
    return y[0], y[1:]


ALIASING_OUTPUTS = {
    "inplace_result_is_input": lambda x: x.add_(1),
    "chained_inplace_is_input": lambda x: x.add_(1).mul_(2),
    "written_input_returned": lambda x: (x.mul_(3), x + 1)[::-1],
    "view": lambda x: x.view(-1),
    "slice": lambda x: x[1:],
    "transpose": lambda x: x.t(),
    "write_then_view": lambda x: x.mul_(2).view(-1),
    "view_of_offset_input_after_write": lambda x: x[1:].add_(1)[1:],
    "dtype_view_of_written_input": lambda x: x.add_(1)[1:].view(torch.int32),
    "dtype_view_of_input_narrower": lambda x: x.view(torch.int16)[1:, 2:],
    "views_of_one_local_tensor": lambda x: (lambda y: (y[0], y[1]))(x + 1),
    "one_view_of_a_local_tensor": lambda x: (x * 2).diagonal(1),
    "as_strided_of_a_view_of_a_local_tensor": lambda x: (x * 2)[1:].as_strided((2, 2), (3, 1), 1),
    "local_tensor_and_its_views": _returned_views,
    "views_of_a_written_local_tensor": _inplace_then_views_of_a_local,
}


def _aliasing(outputs, x):
    """Per output: (is x, shares x's storage, which outputs share its storage, size,
    stride, storage offset)."""
    def ptr(t):
        return t.untyped_storage().data_ptr()
    return [(o is x, ptr(o) == ptr(x), [ptr(o) == ptr(p) for p in outputs], tuple(o.shape),
             o.stride(),
             o.storage_offset() - (x.storage_offset() if ptr(o) == ptr(x) else 0)) for o in outputs]


@pytest.mark.parametrize("name", sorted(ALIASING_OUTPUTS))
def test_outputs_alias_like_eager(name):
    """Values, aliasing (identity, shared storage, strides, offsets) and a later write
    through each output, against eager (tolerance 1e-5: XLA may fuse `x * 3 + 1`)."""
    fn = ALIASING_OUTPUTS[name]
    storage = torch.randn(5, 4)
    x_eager, x_ours = storage.clone()[1:], storage.clone()[1:]  # a non-zero storage offset
    compiled = _compile(fn)
    with torch.no_grad():
        expected, got = fn(x_eager), compiled(x_ours)
        expected = expected if isinstance(expected, tuple) else (expected,)
        got = got if isinstance(got, tuple) else (got,)
        assert _aliasing(got, x_ours) == _aliasing(expected, x_eager)
        for g, e in zip(got, expected):
            torch.testing.assert_close(g, e, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(x_ours, x_eager, atol=1e-5, rtol=1e-5)
        for i, (g, e) in enumerate(zip(got, expected)):
            g.add_(10 * (i + 1))
            e.add_(10 * (i + 1))
        torch.testing.assert_close(x_ours, x_eager, atol=1e-5, rtol=1e-5)
        for g, e in zip(got, expected):
            torch.testing.assert_close(g, e, atol=1e-5, rtol=1e-5)


def test_aliased_outputs_are_not_computed_by_the_program():
    def f(x):
        x.add_(1)
        return x.view(-1), x.t(), x * 2

    compiled = check_against_eager(f, torch.randn(3, 4))
    # Only `x * 2` is a graph output (the written input is an extra result added by the
    # view passes); the views are rebuilt on the host.
    assert len([o for o in compiled.imported.outputs if o.kind == "tensor"]) == 1
    assert len(compiled.output_aliases.aliased) == 2


def test_outputs_aliasing_a_parameter_written_in_place():
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(3, 4))

        def forward(self, x):
            self.w.add_(x)
            return self.w, self.w[0]

    eager, ours = M(), M()
    ours.load_state_dict(eager.state_dict())
    compiled = _compile(ours)
    x = torch.randn(3, 4)
    with torch.no_grad():
        expected, got = eager(x), compiled(x)
    assert got[0] is ours.w and expected[0] is eager.w
    assert got[1].untyped_storage().data_ptr() == ours.w.untyped_storage().data_ptr()
    torch.testing.assert_close(got[1], expected[1], atol=0, rtol=0)
