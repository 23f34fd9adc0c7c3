"""Property test of FUSED mode (issue 14): random programs of ops, views, in-place writes
(through views too), dropped references and flush points on tpu tensors equal the same
program in CPU eager, value by value, at every flush point and at the end."""

import os

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import torch_tpu.device  # noqa: F401 - registers the device where autoload is off
from torch_tpu.device import EagerMode, set_eager_mode

NUMBERS = [0.5, 2.0, -1.0, 3.0, 0.25]
UNARY = {
    "neg": torch.neg, "abs": torch.abs, "tanh": torch.tanh, "relu": torch.relu,
    "sum0": lambda t: t.sum(0) if t.dim() else t * 1, "clone": torch.clone,
}
BINARY = {"add": torch.add, "mul": torch.mul, "sub": torch.sub, "maximum": torch.maximum}
IN_PLACE = ["add_", "mul_", "copy_", "fill_", "addcmul_"]


def _views(t: torch.Tensor) -> list:
    views = [lambda t: t.unsqueeze(0)]
    if t.dim() >= 1 and t.shape[0] > 1:
        views += [lambda t: t[1:], lambda t: t[0], lambda t: t[::2]]
    if t.dim() == 2:
        views += [lambda t: t.t(), lambda t: t.diagonal(), lambda t: t[:, 1:3]]
    if t.is_contiguous() and t.dim() >= 1:
        views.append(lambda t: t.view(-1))
    return views


def _same_shape(pool, t):
    return [k for k, (c, _) in enumerate(pool) if c.shape == t.shape]


def _check(cpu: torch.Tensor, tpu: torch.Tensor) -> None:
    assert tpu.shape == cpu.shape and tpu.dtype == cpu.dtype
    # Strides of size-1 dimensions are arbitrary in PyTorch (and in the plans' layouts).
    assert [s for s, n in zip(tpu.stride(), tpu.shape) if n > 1] == [s for s, n in zip(cpu.stride(), cpu.shape) if n > 1]
    torch.testing.assert_close(tpu.cpu(), cpu, rtol=1e-5, atol=1e-5)


def _new(data):
    shape = data.draw(st.sampled_from([(4, 6), (6,), (3, 4)]))
    value = torch.randint(-4, 5, shape, generator=torch.Generator().manual_seed(data.draw(st.integers(0, 99)))).float()
    return value, value.to("tpu")


def _step(data, pool: list) -> None:
    kind = data.draw(st.sampled_from(["new", "unary", "binary", "scalar", "view", "view", "in_place", "in_place",
                                      "flush", "drop"]))
    if kind == "new" or not pool:
        pool.append(_new(data))
        return
    i = data.draw(st.integers(0, len(pool) - 1))
    c, t = pool[i]
    if kind == "unary":
        f = UNARY[data.draw(st.sampled_from(sorted(UNARY)))]
        pool.append((f(c), f(t)))
    elif kind == "binary":
        j = data.draw(st.sampled_from(_same_shape(pool, c)))
        f = BINARY[data.draw(st.sampled_from(sorted(BINARY)))]
        pool.append((f(c, pool[j][0]), f(t, pool[j][1])))
    elif kind == "scalar":
        number = data.draw(st.sampled_from(NUMBERS))
        op = data.draw(st.sampled_from(["mul", "add", "rsub"]))
        pool.append((getattr(c, op)(number), getattr(t, op)(number)) if op != "rsub" else (number - c, number - t))
    elif kind == "view":
        views = _views(c)
        v = views[data.draw(st.integers(0, len(views) - 1))]
        pool.append((v(c), v(t)))
    elif kind == "in_place":
        op = data.draw(st.sampled_from(IN_PLACE))
        j = data.draw(st.sampled_from(_same_shape(pool, c)))
        oc, ot = pool[j]
        number = data.draw(st.sampled_from(NUMBERS))
        if op == "add_":
            c.add_(oc, alpha=number), t.add_(ot, alpha=number)
        elif op == "mul_":
            c.mul_(number), t.mul_(number)
        elif op == "copy_":
            # A copy between overlapping views of one storage is undefined in PyTorch.
            if c.untyped_storage().data_ptr() != oc.untyped_storage().data_ptr():
                c.copy_(oc), t.copy_(ot)
        elif op == "fill_":
            c.fill_(number), t.fill_(number)
        else:
            if c.untyped_storage().data_ptr() != oc.untyped_storage().data_ptr():
                c.addcmul_(oc, oc, value=number), t.addcmul_(ot, ot, value=number)
    elif kind == "flush":
        _check(c, t)
    else:
        pool.pop(i)  # the value may die (an intermediate that is not an output)


def _run_program(data) -> None:
    pool: list = []
    for _ in range(data.draw(st.integers(1, 14))):
        _step(data, pool)
    for c, t in pool:
        _check(c, t)


@pytest.fixture(scope="module")
def fused_mode():
    """FUSED mode where every flush runs the trace's fused program (compiled on first sight)."""
    previous = os.environ.get("TORCH_TPU_FUSED_FIRST_RUN")
    os.environ["TORCH_TPU_FUSED_FIRST_RUN"] = "1"
    with set_eager_mode(EagerMode.FUSED):
        yield
    if previous is None:
        del os.environ["TORCH_TPU_FUSED_FIRST_RUN"]
    else:
        os.environ["TORCH_TPU_FUSED_FIRST_RUN"] = previous


@pytest.fixture(scope="module")
def recorded_mode():
    """FUSED mode where every flush runs the recorded ops one by one (what a trace's first
    flush does while its program compiles): recording, wiring, liveness and aliasing
    without an XLA compile per random program, so many programs fit in the test's time."""
    from torch_tpu.device import _fused

    compile_trace = _fused.Trace._compile
    _fused.Trace._compile = lambda self, key, outputs: _fused._INTERPRET
    try:
        with set_eager_mode(EagerMode.FUSED):
            yield
    finally:
        _fused.Trace._compile = compile_trace
        for key in [k for k, v in _fused._PROGRAMS.items() if v is _fused._INTERPRET]:
            del _fused._PROGRAMS[key]


_SETTINGS = dict(deadline=None, derandomize=True, print_blob=False,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


@settings(max_examples=int(os.environ.get("FUSED_PROPERTY_EXAMPLES", 500)), **_SETTINGS)
@given(data=st.data())
def test_random_programs_recorded_equal_cpu_eager(recorded_mode, data):
    _run_program(data)


@settings(max_examples=int(os.environ.get("FUSED_PROPERTY_COMPILED_EXAMPLES", 40)), **_SETTINGS)
@given(data=st.data())
def test_random_programs_fused_equal_cpu_eager(fused_mode, data):
    _run_program(data)
