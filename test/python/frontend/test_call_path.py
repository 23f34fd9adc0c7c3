"""The per-call path of compiled graphs (issue 17): what each call skips because it was
answered before (a resident position's buffer, a DeviceBuffer already accepted, the tpu
device guard's type), and that skipping never serves a stale, deleted or freed value."""

from __future__ import annotations

import gc
import sys
import weakref

import pytest
import torch

from torch_tpu.backend import _invoker
from torch_tpu.program import invoker as program_invoker
from torch_tpu.runtime import BufferDeletedError, get_client

from test_invoker import _ADD_MUL  # this folder's test module


class _Spec:
    def __init__(self, shape, dtype) -> None:
        self.shape, self.dtype, self.name, self.role = shape, dtype, "arg", "input"


def _python_frames_during(fn) -> list[str]:
    seen: list[str] = []

    def profile(frame, event, arg):
        if event == "call":
            seen.append(f"{frame.f_code.co_filename}:{frame.f_code.co_name}")

    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return seen


def test_the_stream_query_of_every_compiled_call_runs_no_python_of_ours():
    """With the tpu accelerator registered, every Dynamo-compiled frame asks for the current
    stream, and PyTorch's C++ asks our device guard for its type each time."""
    import torch_tpu.device  # noqa: F401 - registers the device where autoload is off

    stream = torch._C._accelerator_getStream(0)
    assert stream.device == torch.device("tpu", 0)
    frames = _python_frames_during(lambda: torch._C._accelerator_getStream(0))
    assert not [f for f in frames if "torch_tpu" in f], frames
    assert torch.accelerator.current_stream(torch.device("tpu", 0)).device.type == "tpu"


def test_an_accepted_device_buffer_is_still_checked_for_deletion():
    client = get_client()
    exe = client.compile(_ADD_MUL, name="add_mul")
    a, b = torch.randn(4), torch.randn(4)
    a_buf, b_buf = client.to_device(a), client.to_device(b)
    torch.testing.assert_close(exe(a_buf, b_buf)[0], (a + b) * b)
    torch.testing.assert_close(exe(a_buf, b_buf)[0], (a + b) * b)  # accepted before
    a_buf.delete()
    with pytest.raises(BufferDeletedError, match="argument 0"):
        exe(a_buf, b_buf)
    # Another buffer at the same position is checked in full.
    with pytest.raises(Exception, match="expected tensor<4xf32>"):
        exe(client.to_device(torch.randn(3)), b_buf)


def test_an_accepted_device_buffer_is_not_kept_alive_by_the_executable():
    client = get_client()
    exe = client.compile(_ADD_MUL, name="add_mul")
    a_buf, b_buf = client.to_device(torch.randn(4)), client.to_device(torch.randn(4))
    exe(a_buf, b_buf)
    arrays = weakref.ref(a_buf._array)
    del a_buf
    gc.collect()
    assert arrays() is None


def test_a_resident_position_sees_new_versions_objects_and_storages():
    spec = _Spec((4,), torch.float32)
    plan = program_invoker.ArgumentPlan([spec, spec], get_client(), resident=[0])
    p, x = torch.nn.Parameter(torch.randn(4)), torch.randn(4)
    first = plan([p, x])[0]
    assert plan([p, x])[0] is first  # the same state: the same buffer
    with torch.no_grad():
        p.add_(1.0)
    bumped = plan([p, x])[0]
    assert bumped is not first
    torch.testing.assert_close(bumped.to_torch(), p.detach())
    p.data = torch.randn(4)  # same object, new storage
    torch.testing.assert_close(plan([p, x])[0].to_torch(), p.detach())
    q = torch.nn.Parameter(torch.randn(4))  # another object at that position
    torch.testing.assert_close(plan([q, x])[0].to_torch(), q.detach())


def test_a_resident_position_lets_a_freed_parameter_go():
    spec = _Spec((4,), torch.float32)
    plan = program_invoker.ArgumentPlan([spec, spec], get_client(), resident=[0])
    p = torch.nn.Parameter(torch.randn(4))
    buffer = weakref.ref(plan([p, torch.randn(4)])[0])
    del p
    gc.collect()
    assert buffer() is None  # neither the plan nor the process-wide table holds it


def _add_mul():
    return get_client().compile(_ADD_MUL, name="add_mul")


def test_a_host_tensor_passed_again_is_read_afresh_every_call():
    """The array aliasing a repeated host tensor is reused: writes between calls are seen."""
    exe = _add_mul()
    a, b = torch.randn(4), torch.randn(4)
    for step in range(4):
        torch.testing.assert_close(exe(a, b)[0], (a + b) * b)
        a.add_(1.0)  # in place: same object, same memory
        b.copy_(torch.randn(4))
        if step == 2:
            a.data = torch.randn(4)  # same object, new storage


@pytest.mark.parametrize("change", ["transpose", "resize", "set_"])
def test_a_repeated_host_tensor_changed_in_place_is_not_served_stale(change):
    square = get_client().compile("""
module @sq {
  func.func public @main(%a: tensor<2x2xf32>) -> tensor<2x2xf32> {
    %0 = stablehlo.add %a, %a : tensor<2x2xf32>
    return %0 : tensor<2x2xf32>
  }
}""", name="sq")
    a = torch.arange(4, dtype=torch.float32).view(2, 2).clone()
    square(a), square(a)  # the second call caches an aliasing array
    if change == "transpose":
        a.t_()  # same memory, other strides
        torch.testing.assert_close(square(a)[0], a + a)
    elif change == "resize":
        a.resize_(4)
        with pytest.raises(Exception, match="expected tensor<2x2xf32>"):
            square(a)
    else:
        a.set_(torch.full((2, 2), 7.0))
        torch.testing.assert_close(square(a)[0], a + a)


def test_a_repeated_host_tensor_is_not_kept_alive():
    from torch_tpu.runtime import _jaxlib

    client = get_client()
    exe = _add_mul()
    a, b = torch.randn(4), torch.randn(4)
    exe(a, b), exe(a, b)  # the second call caches an array aliasing `a`
    gc.collect()
    cached = len(_jaxlib.live_arrays(client._raw))
    tensor = weakref.ref(a)
    del a
    gc.collect()
    assert tensor() is None
    assert len(_jaxlib.live_arrays(client._raw)) == cached - 1  # the array went with the tensor
    # A new tensor at that position (maybe at the freed address) is read, not the old array.
    c = torch.randn(4)
    torch.testing.assert_close(exe(c, b)[0], (c + b) * b)
    torch.testing.assert_close(exe(c, b)[0], (c + b) * b)


def test_a_donated_or_enqueued_host_tensor_is_never_aliased():
    """`execute` returns before the program reads its arguments: host tensors are copied
    there, so writing them right after the call cannot change the result."""
    exe = _add_mul()
    a, b = torch.randn(4), torch.randn(4)
    expected = (a + b) * b
    exe(a, b), exe(a, b)  # cached for `__call__`
    out = exe.execute([a, b])[0]
    a.fill_(100.0)
    torch.testing.assert_close(out.to_torch(), expected)


_DOUBLE_F32 = """
module @double {
  func.func public @main(%a: tensor<4xf32>) -> tensor<4xf32> {
    %0 = stablehlo.add %a, %a : tensor<4xf32>
    return %0 : tensor<4xf32>
  }
}
"""

_DOUBLE_C64 = """
module @double_c {
  func.func public @main(%a: tensor<2xcomplex<f32>>) -> tensor<2xcomplex<f32>> {
    %0 = stablehlo.add %a, %a : tensor<2xcomplex<f32>>
    return %0 : tensor<2xcomplex<f32>>
  }
}
"""


def test_a_repeated_host_tensor_whose_data_changed_dtype_or_bits_is_checked_again():
    """`.data = ...` keeps the object and may keep the address: an int32 view is refused
    as a fresh int32 tensor is, and conj/neg bits are resolved, not served the old array."""
    client = get_client()
    double = client.compile(_DOUBLE_F32, name="double")
    a = torch.tensor([1.0, 2.0, 3.0, 4.0])
    double(a), double(a)
    a.data = a.data.view(torch.int32)
    with pytest.raises(Exception, match="torch.int32"):
        double(a)

    n = torch.tensor([1.0, 2.0, 3.0, 4.0])
    double(n), double(n)
    n.data = torch._neg_view(n.data)
    torch.testing.assert_close(double(n)[0], torch.tensor([-2.0, -4.0, -6.0, -8.0]))

    double_c = client.compile(_DOUBLE_C64, name="double_c")
    c = torch.tensor([1 + 1j, 2 + 2j], dtype=torch.complex64)
    double_c(c), double_c(c)
    c.data = c.data.conj()
    torch.testing.assert_close(double_c(c)[0], torch.tensor([2 - 2j, 4 - 4j], dtype=torch.complex64))


def test_module_state_relaid_out_through_data_is_uploaded_again():
    """`p.data = p.data.t()` keeps the address and the version: the layout is part of
    what a resident buffer depends on (the compiled result equals eager's)."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 4, bias=False)
    compiled = torch.compile(model, backend="tpu")
    x = torch.randn(2, 4)
    with torch.no_grad():
        compiled(x), compiled(x)
        pointer, version = model.weight.data_ptr(), model.weight._version
        model.weight.data = model.weight.data.t()
        assert (model.weight.data_ptr(), model.weight._version) == (pointer, version)
        torch.testing.assert_close(compiled(x), model(x))


# -- the fast path: a graph whose plan passes its arguments through -------------------------


def _ours(frames: list[str]) -> list[str]:
    return [f.rsplit(":", 1)[1] for f in frames if "torch_tpu" in f or "/runtime/" in f]


@pytest.mark.parametrize("grad", [False, True])
def test_x_plus_1_calls_the_executable_closure_from_the_second_call(grad):
    """From the second call, a graph of plain host tensors runs through `PrecisionKeyed`
    and the executable's closure (`Executable.caller`) only; with grad mode on or off
    (x needs no gradient: aot_autograd's wrappers are skipped either way). The input is
    still read afresh: an in-place write between calls is seen."""
    torch._dynamo.reset()
    compiled = torch.compile(lambda x: x + 1, backend="tpu")
    x = torch.randn(8)
    with torch.set_grad_enabled(grad):
        for _ in range(2):
            compiled(x)
        frames = _ours(_python_frames_during(lambda: compiled(x)))
        # (buffer_to_dlpack: the runtime's gateway counts the zero-copy hand-over of each
        # result, torch.tpu.transfer_stats' `dlpack_exports`)
        assert frames == ["__call__", "call_one", "convert", "buffer_to_dlpack"], frames
        x.add_(1.0)
        got = compiled(x)
    assert isinstance(got, torch.Tensor)
    torch.testing.assert_close(got, x + 1)
    assert not got.requires_grad


def test_the_fast_path_keeps_the_output_structure_and_several_arguments():
    torch._dynamo.reset()

    def fn(x, y):
        return [x * y, x - y]

    compiled = torch.compile(fn, backend="tpu")
    x, y = torch.randn(5), torch.randn(5)
    with torch.no_grad():
        for _ in range(3):
            got = compiled(x, y)
            assert type(got) is list and len(got) == 2
            torch.testing.assert_close(got, fn(x, y))
            x, y = torch.randn(5), torch.randn(5)  # new tensors: converted afresh


def test_module_state_goes_through_the_plan_steps_on_the_fast_path():
    """A graph with parameters: from the second call the plan's steps (resident module
    state) run in the fast closure; an in-place update, a new parameter object and a
    re-laid-out `.data` are still seen, as on the full path."""
    torch._dynamo.reset()
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 3))
    compiled = torch.compile(model, backend="tpu")
    x = torch.randn(2, 4)
    with torch.no_grad():
        compiled(x)
        compiled(x)
        frames = _ours(_python_frames_during(lambda: compiled(x)))
        assert "planned" in frames and "run" not in frames and frames.count("__call__") == 1, frames
        model[0].weight.add_(1.0)  # a new version: uploaded again
        torch.testing.assert_close(compiled(x), model(x))
        model[2].bias.data = torch.randn(3)  # a new storage at the same position
        torch.testing.assert_close(compiled(x), model(x))
        model[0].weight.data = model[0].weight.data.t().contiguous().t()  # same values, new layout
        torch.testing.assert_close(compiled(x), model(x))


def test_executable_caller_keeps_the_executables_errors_and_donation():
    from torch_tpu.runtime import ArgumentError

    exe = _add_mul()
    a, b = torch.randn(4), torch.randn(4)
    for result_type in (list, tuple):
        call = exe.caller(result_type)
        got = call(a, b)
        assert type(got) is result_type
        torch.testing.assert_close(got[0], (a + b) * b)
    call = exe.caller(tuple)
    with pytest.raises(ArgumentError, match=r"add_mul: argument 1: expected tensor<4xf32>, got a torch\.int64"):
        call(a, torch.arange(4))
    with pytest.raises(ArgumentError, match="add_mul: takes 2 arguments"):
        call(a)

    client = get_client()
    double = client.compile(_DOUBLE_F32, name="double")
    one = double.caller(tuple)
    t = torch.arange(4, dtype=torch.float32)
    assert torch.equal(one(t)[0], 2 * t) and torch.equal(one(t)[0], 2 * t)
    with pytest.raises(ArgumentError, match=r"double: argument 0: expected tensor<4xf32>, got a torch\.float32 tensor of shape \[5\]"):
        one(torch.zeros(5))
    with pytest.raises(ArgumentError, match="double: takes 1 argument"):
        one(t, t)

    # A donated position copies the caller's tensor in, every call (never aliased).
    accumulate = client.compile(_ACCUMULATE, name="accumulate").caller(tuple)
    acc = torch.zeros(4)
    for _ in range(2):
        assert torch.equal(accumulate(acc, t)[0], t)
    assert torch.equal(acc, torch.zeros(4))


_ACCUMULATE = """
module @accumulate {
  func.func public @main(%acc: tensor<4xf32> {tf.aliasing_output = 0 : i32}, %x: tensor<4xf32>) -> tensor<4xf32> {
    %0 = stablehlo.add %acc, %x : tensor<4xf32>
    return %0 : tensor<4xf32>
  }
}
"""


class _ModeProgram:
    """A stand-in for a compiled graph under `PrecisionKeyed`: answers the mode it was built
    in, offers a fast path (or one that fails, as a graph whose executable has no `caller`)."""

    precision_sensitive = True

    def __init__(self, mode, fast_path_fails=False):
        self.mode, self.fast_path_fails = mode, fast_path_fails

    def __call__(self, *args):
        return self.mode

    def fast_path(self):
        if self.fast_path_fails:
            raise AttributeError("'DistributedGraphProgram' object has no attribute 'signature'")
        return lambda *args: self.mode


def test_a_program_whose_fast_path_fails_keeps_its_own_call_path():
    # The review's repro: a tpu_dist graph's first call computed its collectives, then raised
    # looking for the fast path -- on every call.
    from torch_tpu.program.precision import current_mode

    keyed = _invoker.PrecisionKeyed(lambda: _ModeProgram(current_mode(), fast_path_fails=True))
    assert [keyed(), keyed(), keyed()] == [current_mode()] * 3


def test_precision_modes_first_used_on_several_threads_are_built_once_each():
    # The review's repro: one thread's first call replaced its slot while others added their
    # modes' slots (dict changed size during iteration), and a mode could be compiled twice.
    import collections
    import threading

    import torch_tpu
    from torch_tpu.program.precision import current_mode

    builds, errors = collections.Counter(), []

    def build():
        builds[current_mode()] += 1
        return _ModeProgram(current_mode())

    def calls(modes):
        def run():
            barrier.wait()
            try:
                for mode in modes:
                    with torch_tpu.precision(mode) if mode else _nothing():
                        keyed()
            except Exception as exc:  # noqa: BLE001 - collected for the assertion
                errors.append(repr(exc))
        return run

    import contextlib
    _nothing = contextlib.nullcontext
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        for _ in range(300):
            builds.clear()
            keyed = _invoker.PrecisionKeyed(build)
            barrier = threading.Barrier(3)
            threads = [threading.Thread(target=calls(m)) for m in (("medium", "high"), (None, None), ("high",))]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert not errors, errors[0]
            assert max(builds.values()) == 1, builds
    finally:
        sys.setswitchinterval(interval)
