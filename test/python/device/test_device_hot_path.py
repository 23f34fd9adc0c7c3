"""The eager tpu device's hot path (issue 13): a repeated op goes from its fast signature
straight to its plan (no description, no meta run, no compile), every distinct layout /
dtype / argument still gets its own plan, and a training loop stops making plans after
its first step (single-op modules do not pile up)."""

import pytest
import torch

import torch_tpu.device  # noqa: F401 - registers the device where autoload is off
from torch_tpu.device import _ops, _storage


def _no_slow_path(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a cached op took the slow path (describe / build)")

    monkeypatch.setattr(_ops, "describe", refuse)
    monkeypatch.setattr(_ops, "_build_plan", refuse)


def test_cached_op_skips_description_and_meta(monkeypatch):
    x, y = torch.randn(1000), torch.randn(1000)
    xt, yt = x.to("tpu"), y.to("tpu")
    (xt + yt).cpu()
    _no_slow_path(monkeypatch)
    for _ in range(3):
        torch.testing.assert_close((xt + yt).cpu(), x + y)
    # A run-time scalar operand: another value reuses the plan and is honoured.
    monkeypatch.undo()
    (xt * 2.0).cpu()
    _no_slow_path(monkeypatch)
    torch.testing.assert_close((xt * 3.5).cpu(), x * 3.5)


@pytest.mark.parametrize("view", [
    lambda t: t.view(4, 6).t(),                 # transposed: other strides
    lambda t: t[4:].view(4, 5),                 # offset into a larger storage
    lambda t: t.view(4, 6)[:, ::2].reshape(4, 3).expand(2, 4, 3)[1],  # strided
])
def test_same_shape_other_layout_gets_its_own_plan(view):
    base = torch.arange(24, dtype=torch.float32)
    device = base.to("tpu")
    a_cpu, a_tpu = view(base), view(device)
    other_cpu = torch.randn(a_cpu.shape)
    # Warm a plan for a contiguous operand of the same shape first: the view must not reuse it.
    contiguous = torch.randn(a_cpu.shape)
    (contiguous.to("tpu") + other_cpu.to("tpu")).cpu()
    torch.testing.assert_close((a_tpu + other_cpu.to("tpu")).cpu(), a_cpu + other_cpu)


def test_argument_kinds_are_part_of_the_signature():
    x = torch.randn(3, 4)
    t = x.to("tpu")
    torch.testing.assert_close(t.sum(1, keepdim=True).cpu(), x.sum(1, keepdim=True))
    torch.testing.assert_close(t.sum(1, keepdim=False).cpu(), x.sum(1, keepdim=False))
    torch.testing.assert_close(t.sum(0).cpu(), x.sum(0))
    # Same shape, other dtype.
    xi = torch.arange(12).view(3, 4)
    torch.testing.assert_close((xi.to("tpu") + 1).cpu(), xi + 1)
    torch.testing.assert_close((t + 1).cpu(), x + 1)
    # An int and a float scalar: different result dtypes on an int tensor.
    torch.testing.assert_close((xi.to("tpu") * 2).cpu(), xi * 2)
    torch.testing.assert_close((xi.to("tpu") * 2.5).cpu(), xi * 2.5)


def test_in_place_op_through_the_hot_path():
    x = torch.randn(8)
    t = x.to("tpu")
    view = t[2:6]
    for _ in range(3):
        t.add_(1.0)
        x.add_(1.0)
    torch.testing.assert_close(t.cpu(), x)
    torch.testing.assert_close(view.cpu(), x[2:6])


def test_training_loop_stops_planning_after_its_first_steps():
    """Each new signature makes one plan and one compiled module; repeated steps must add
    none (neither plans nor fast-path entries), so nothing grows per step."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)).to("tpu")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    data, target = torch.randn(8, 16).to("tpu"), torch.randn(8, 4).to("tpu")

    def step():
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(data), target)
        loss.backward()
        optimizer.step()
        return loss.item()

    for _ in range(3):  # momentum buffers appear on the first step, then the signatures settle
        step()
    plans, fast = len(_ops._PLANS), len(_ops._FAST)
    assert fast > 0
    for _ in range(5):
        step()
    assert (len(_ops._PLANS), len(_ops._FAST)) == (plans, fast)


def test_scalar_arguments_are_run_time_operands_not_one_plan_per_value():
    """`Scalar` arguments (schema type "number": div_.Scalar's `other`, addcdiv_'s
    `value`) are operands: new values reuse the plan. Baking them made Adam compile new
    modules on every step. (add.Scalar's rule needs constants: it is planned per value,
    and must still be right.)"""
    x, a, b = torch.randn(6), torch.rand(6) + 0.5, torch.rand(6) + 0.5
    t, ta, tb = x.to("tpu"), a.to("tpu"), b.to("tpu")
    for value in (0.3, 0.7, 1.9):
        t.div_(value)
        x.div_(value)
        t.addcdiv_(ta, tb, value=-value)
        x.addcdiv_(a, b, value=-value)
        torch.testing.assert_close(torch.ops.aten.add.Scalar(t, value, alpha=value).cpu(),
                                   torch.ops.aten.add.Scalar(x, value, alpha=value))
    torch.testing.assert_close(t.cpu(), x)
    plans = len(_ops._PLANS)
    for value in (2.5, -4.0):
        t.div_(value)
        t.addcdiv_(ta, tb, value=value)
    assert len(_ops._PLANS) == plans


def test_numbers_that_decide_the_result_shape_are_baked():
    """arange's `end` is a Scalar, but it decides the result's size: one plan per value,
    never a shared plan with a stale size."""
    for n in (3, 5, 2):
        torch.testing.assert_close(torch.arange(n, device="tpu").cpu(), torch.arange(n))
        torch.testing.assert_close(torch.arange(1.0, n + 0.5, 0.5, device="tpu").cpu(), torch.arange(1.0, n + 0.5, 0.5))


@pytest.mark.parametrize("shape", [(), (5,), (2, 3), (5, 1), (1, 5), (0,), (3, 0), (2, 0, 4)])
def test_op_results_have_pytorchs_sizes_strides_and_own_storage(shape):
    """An op's row-major result takes its storage address by a data-pointer swap into the
    new tensor's own storage (`_storage.new_tensor`); size-0 results and other layouts
    take `set_`. Either way: PyTorch's sizes and strides, the device, and a storage in
    the buffer table that lives exactly as long as the tensor and its views."""
    from torch_tpu.device._buffers import TABLE

    a = torch.randn(shape)
    t = a.to("tpu")
    before = len(TABLE)
    r = t * 2
    expected = a * 2
    assert (r.shape, r.stride(), r.storage_offset()) == (expected.shape, expected.stride(), 0)
    assert r.device == torch.device("tpu", 0) and r.untyped_storage().device == r.device
    torch.testing.assert_close(r.cpu(), expected)
    assert len(TABLE) == before + 1
    view = r.view(-1)[1:] if r.numel() > 1 else r.view(-1)
    del r
    assert len(TABLE) == before + 1  # the view keeps the storage (and its buffer)
    torch.testing.assert_close(view.cpu(), expected.reshape(-1)[1:] if expected.numel() > 1 else expected.reshape(-1))
    del view
    assert len(TABLE) == before  # freed with its last tensor


def test_permuted_result_layout_keeps_its_strides():
    """A dense non-row-major result (an elementwise op on a transposed operand keeps its
    layout, as on CPU) is built with `set_`, not the row-major shortcut."""
    a = torch.randn(3, 4).t()
    r = a.to("tpu") + 1
    expected = a + 1
    assert r.stride() == expected.stride() != (3, 1)
    torch.testing.assert_close(r.cpu(), expected)


def test_eager_mode_is_read_from_another_thread_without_a_set_mode():
    """The eager mode's thread-local has a class default: a thread that never set a mode
    reads the process's mode (and an op there runs)."""
    import threading

    from torch_tpu.device import EagerMode, get_eager_mode, set_eager_mode

    seen = []
    x = torch.randn(4)

    def worker():
        seen.append(get_eager_mode())
        seen.append((x.to("tpu") + 1).cpu())

    with set_eager_mode(EagerMode.DEBUG):
        thread = threading.Thread(target=worker)
        thread.start()
        thread.join()
    assert seen[0] is EagerMode.DEBUG
    torch.testing.assert_close(seen[1], x + 1)


def _launched_plans(monkeypatch) -> list:
    """Records the plan of each op that runs (its launcher is called)."""
    seen = []
    launch_of = {}

    def spy(plan):
        def launch(buffers):
            seen.append(plan)
            return launch_of[id(plan)](buffers)
        return launch

    original_post_init = _ops.Plan.__post_init__

    def post_init(plan):
        original_post_init(plan)
        launch_of[id(plan)] = plan.launch
        plan.launch = spy(plan)

    monkeypatch.setattr(_ops.Plan, "__post_init__", post_init)
    return seen


@pytest.mark.parametrize("set_mode", ["torch", "torch_tpu.precision"])
def test_matrix_op_plan_follows_the_precision_mode_other_ops_share_one(monkeypatch, set_mode):
    """The hot path reads the precision mode only for plans whose module has matrix ops:
    a matmul cached under one mode must not serve another (its dot_general carries the
    mode's precision_config), while an elementwise op has one plan for every mode."""
    import torch_tpu

    seen = _launched_plans(monkeypatch)  # (plans made from here on: new shapes per case)
    n = 5 if set_mode == "torch" else 6
    a, b = torch.randn(n, 7).to("tpu"), torch.randn(7, 3).to("tpu")
    x = torch.randn(n + 4).to("tpu")
    previous = torch.get_float32_matmul_precision()

    def under(mode, fn):
        if set_mode == "torch":
            torch.set_float32_matmul_precision(mode)
            try:
                return fn()
            finally:
                torch.set_float32_matmul_precision(previous)
        with torch_tpu.precision(mode):
            return fn()

    try:
        mm_plans = {}
        for mode in ("highest", "medium", "highest", "medium", "high"):
            seen.clear()
            under(mode, lambda: (a @ b, x + x))
            mm_plan, add_plan = seen
            precision = dict(highest="HIGHEST", high="HIGH", medium="DEFAULT")[mode]
            assert f"precision = [{precision}, {precision}]" in str(mm_plan.module)
            assert mm_plans.setdefault(mode, mm_plan) is mm_plan  # cached per mode
            assert not add_plan.precision_sensitive and mm_plan.precision_sensitive
        assert len({id(p) for p in mm_plans.values()}) == 3
        add_plans = set()
        for mode in ("highest", "medium", "high"):
            seen.clear()
            under(mode, lambda: x + x)
            add_plans.add(id(seen[0]))
        assert len(add_plans) == 1
    finally:
        torch.set_float32_matmul_precision(previous)


def test_deleted_operand_of_a_cached_op_names_the_op_and_tensor():
    """The hot path does not look for deleted buffers (PjRT refuses them): the refusal is
    still reported as the deleted tensor, naming the op and line -- for a cached plan,
    for an in-place op, and in Debug mode."""
    import inspect

    from torch_tpu.device import EagerMode, set_eager_mode
    from torch_tpu.device._buffers import entry_of
    from torch_tpu.runtime.errors import BufferDeletedError

    x = torch.ones(4, device="tpu") * 3
    y = torch.ones(4, device="tpu") * 2
    (x + y).cpu()  # cached
    for mode in (EagerMode.STRICT, EagerMode.DEBUG):
        with set_eager_mode(mode):
            entry_of(y).buffer.delete()
            for fn in (lambda: x + y, lambda: x.add_(y)):
                line = inspect.currentframe().f_lineno + 2
                with pytest.raises(BufferDeletedError, match="device buffer was deleted") as info:
                    fn()
                assert "aten.add" in str(info.value) and f"{__file__}:" in str(info.value)
            y = torch.ones(4, device="tpu") * 2
    torch.testing.assert_close((x + y).cpu(), torch.full((4,), 5.0))


def test_python_numbers_of_equal_value_and_other_types_get_their_own_plans():
    """`2`, `2.0` and `True` are equal dict keys; as constants of a plan they give
    different results: each type plans its own (was: the first one's plan served all)."""
    for fill in (2, 2.0, True, 1, 1.0):
        want = torch.full((3,), fill)
        got = torch.full((3,), fill, device="tpu")
        assert got.dtype == want.dtype, (fill, got.dtype, want.dtype)
        # The program too: a baked `1.0` once reused `1`'s int64 program from the program
        # cache, under a float32 tensor (its read converted the dtype back, hiding it).
        assert _storage.entry_of(got).buffer.dtype == want.dtype, fill
        torch.testing.assert_close(got.cpu(), want)


# Issue 28: the FUSED training step's host cost per recorded op.
def test_tensor_lists_and_scalar_lists_take_the_fast_path(monkeypatch):
    """`cat`'s inputs and a foreach op's lists (and its `Scalar[]`, new values every step)
    go from the fast signature to the plan; each list element's layout is in the key."""
    a, b = torch.randn(2, 3), torch.randn(4, 3)
    ta, tb = a.to("tpu"), b.to("tpu")
    xs = [torch.randn(3), torch.randn(2, 2)]
    txs = [x.to("tpu") for x in xs]
    torch.cat([ta, tb]).cpu()
    torch.cat([tb, ta]).cpu()
    torch._foreach_addcdiv_(txs, txs, [t.abs() + 1 for t in txs], [0.5, 2.0])
    torch._foreach_addcdiv_(xs, xs, [t.abs() + 1 for t in xs], [0.5, 2.0])
    _no_slow_path(monkeypatch)
    torch.testing.assert_close(torch.cat([ta, tb]).cpu(), torch.cat([a, b]))
    torch.testing.assert_close(torch.cat((tb, ta)).cpu(), torch.cat((b, a)))
    for values in ([0.25, -1.5], [3.0, 0.125]):
        torch._foreach_addcdiv_(txs, txs, [t.abs() + 1 for t in txs], values)
        torch._foreach_addcdiv_(xs, xs, [t.abs() + 1 for t in xs], values)
    torch.testing.assert_close([t.cpu() for t in txs], xs)
    # Another layout of one element is another signature: planned, not the first plan.
    monkeypatch.undo()
    torch.testing.assert_close(torch.cat([ta.t().contiguous().t(), tb]).cpu(), torch.cat([a, b]))
    torch.testing.assert_close(torch.cat([tb[::2], ta]).cpu(), torch.cat([b[::2], a]))


def test_an_in_place_foreach_op_reading_a_written_storage_elsewhere_through_the_fast_path():
    """The aliasing check of list-writing ops reads the fast signature's operands: a
    written storage read at another position (or by a shared tensor) still runs PyTorch's
    element-by-element kernel; the same storage at the same position is one plan's."""
    generator = torch.Generator().manual_seed(5)
    for _ in range(2):  # the second time through plans found on the fast path
        c = [torch.randn(4, generator=generator) for _ in range(3)]
        tc = [t.to("tpu") for t in c]
        torch._foreach_add_(tc, [tc[2], tc[0], tc[1]])
        torch._foreach_add_(c, [c[2], c[0], c[1]])
        torch._foreach_addcmul_(tc, [tc[0], tc[1], tc[2]], [tc[1], tc[2], tc[0]], value=0.5)
        torch._foreach_addcmul_(c, [c[0], c[1], c[2]], [c[1], c[2], c[0]], value=0.5)
        d = [torch.randn(4, generator=generator) for _ in range(3)]
        td = [t.to("tpu") for t in d]
        torch._foreach_addcmul_(tc, td, td, value=2.0)  # read twice at its own position
        torch._foreach_addcmul_(c, d, d, value=2.0)
        torch.testing.assert_close([t.cpu() for t in tc], c)


def test_a_plan_baked_per_value_is_found_on_the_fast_path(monkeypatch):
    """`fill_.Scalar`'s rule takes its value as a constant (a plan per value): a value seen
    before finds its plan from the fast signature and the value, not `describe`; another
    value gets its own plan, never a neighbour's."""
    t = torch.empty(3, 4, device="tpu")
    for value in (1.5, 2, -3.25):
        t.fill_(value)
    _no_slow_path(monkeypatch)
    for value in (2, -3.25, 1.5):
        torch.testing.assert_close(t.fill_(value).cpu(), torch.full((3, 4), float(value)))
    monkeypatch.undo()
    torch.testing.assert_close(t.fill_(7.0).cpu(), torch.full((3, 4), 7.0))
    xi = torch.empty(3, dtype=torch.int64, device="tpu")
    torch.testing.assert_close(xi.fill_(2).cpu(), torch.full((3,), 2))
    torch.testing.assert_close(xi.fill_(True).cpu(), torch.full((3,), 1))


def test_unsafe_view_is_an_alias_as_on_cpu():
    """`_unsafe_view` (what `nn.Linear` returns for a batch of sequences: mm's result seen
    as (batch, seq, features)) is PyTorch's aliasing kernel on the device, as on CPU: the
    same storage, no op -- FUSED mode records one op for the linear, not two."""
    from torch_tpu.device import EagerMode, _fused, set_eager_mode

    x = torch.randn(6, 4)
    t = x.to("tpu")
    y = torch.ops.aten._unsafe_view(t, [2, 3, 4])
    assert y.untyped_storage().data_ptr() == t.untyped_storage().data_ptr()
    assert (y.shape, y.stride()) == ((2, 3, 4), (12, 4, 1))
    torch.testing.assert_close(y.cpu(), x.view(2, 3, 4))
    with pytest.raises(RuntimeError, match="view size is not compatible"):
        torch.ops.aten._unsafe_view(t.t(), [24])
    linear = torch.nn.Linear(4, 5)
    device_linear = torch.nn.Linear(4, 5).to("tpu")
    device_linear.load_state_dict(linear.state_dict())
    inputs = torch.randn(2, 3, 4)
    with set_eager_mode(EagerMode.FUSED):
        torch.tpu.synchronize()
        out = device_linear(inputs.to("tpu"))
        recorded = [plan for plan, _, _ in _fused._current[0].ops]
    assert len(recorded) == 1, [getattr(p.executable, "name", p) for p in recorded]
    torch.testing.assert_close(out.cpu(), linear(inputs))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_silu_backward_is_one_op_with_its_derivative(dtype):
    """`silu_backward` (CompositeImplicitAutograd: 8 small ops) runs through its lowering:
    one recorded op in FUSED mode; gradients as PyTorch's CPU kernel computes them, and a
    second derivative through the op's own formula."""
    from torch_tpu.device import EagerMode, _fused, set_eager_mode

    x = torch.randn(5, 7).to(dtype)
    grad = torch.randn(5, 7).to(dtype)
    with set_eager_mode(EagerMode.FUSED):
        torch.tpu.synchronize()
        out = torch.ops.aten.silu_backward(grad.to("tpu"), x.to("tpu"))
        recorded = len(_fused._current[0].ops)
    assert recorded == 1
    torch.testing.assert_close(out.cpu(), torch.ops.aten.silu_backward(grad, x))

    def grads(device):
        xd = x.float().to(device).requires_grad_()
        g, = torch.autograd.grad(torch.nn.functional.silu(xd * 1.5).sum(), xd, create_graph=True)
        g2, = torch.autograd.grad((g * g).sum(), xd)
        return g.detach().cpu(), g2.cpu()

    torch.testing.assert_close(grads("tpu"), grads("cpu"))


def test_negative_zero_is_not_the_plan_baked_with_positive_zero():
    """-0.0 == 0.0 and both hash alike: a plan baked with one must not serve the other
    (fill_ bakes its value), on the fast path and through `describe`."""
    import math

    x = torch.empty(3, device="tpu")
    for value in (0.0, -0.0, 0.0, -0.0):
        x.fill_(value)
        assert math.copysign(1.0, x.cpu()[0].item()) == math.copysign(1.0, value)
    assert math.copysign(1.0, torch.full((2,), -0.0, device="tpu").cpu()[0].item()) == -1.0
