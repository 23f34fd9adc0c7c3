"""Executables: compile from text / bytecode / ir.Module, run on one device or as N
replicas, donation, asynchronous dispatch, and errors that say what to do."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from rt_helpers import add_module, allreduce_module, identity_module
from torch_tpu.runtime import (
    ArgumentError,
    BufferDeletedError,
    CompileError,
    CompileSpec,
    DeviceOutOfMemoryError,
    fingerprint,
)
from torch_tpu.runtime.errors import TorchTPURuntimeError

TWO_RESULTS = """
module @two {
  func.func public @main(%a: tensor<3xf32>, %n: tensor<i32>) -> (tensor<3xf32>, tensor<i32>, tensor<3xi1>) {
    %0 = stablehlo.multiply %a, %a : tensor<3xf32>
    %1 = stablehlo.add %n, %n : tensor<i32>
    %z = stablehlo.constant dense<0.0> : tensor<3xf32>
    %2 = stablehlo.compare GT, %a, %z : (tensor<3xf32>, tensor<3xf32>) -> tensor<3xi1>
    return %0, %1, %2 : tensor<3xf32>, tensor<i32>, tensor<3xi1>
  }
}
"""

ALIASED = """
module @accumulate {
  func.func public @main(%acc: tensor<4xf32> {tf.aliasing_output = 0 : i32}, %x: tensor<4xf32>) -> tensor<4xf32> {
    %0 = stablehlo.add %acc, %x : tensor<4xf32>
    return %0 : tensor<4xf32>
  }
}
"""

NO_RESULTS = """
module @nothing {
  func.func public @main(%a: tensor<2xf32>) -> () {
    return
  }
}
"""


def _mlir_module(text: str):
    """An ir.Module built the way the compiler builds them (its context factory)."""
    from torch_tpu.compiler.context import ir, make_context

    ctx = make_context()
    with ctx:
        return ctx, ir.Module.parse(text)


def test_compile_text_and_call_with_torch(client):
    exe = client.compile(add_module(), name="add.mlir")
    a = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    (out,) = exe(a, a)
    assert torch.equal(out, a * 2)
    assert exe.num_args == 2 and exe.origin == "compile"
    assert [str(s) for s in exe.signature.args] == ["tensor<2x3xf32>", "tensor<2x3xf32>"]
    assert "add.mlir" in repr(exe)


def test_compile_ir_module_operation_and_bytecode(client):
    text = add_module("4", "i32")
    ctx, module = _mlir_module(text)
    with ctx:
        buf = io.BytesIO()
        module.operation.write_bytecode(buf)
        bytecode = buf.getvalue()
        a = torch.tensor([1, 2, 3, 4], dtype=torch.int32)
        for source in (module, module.operation, bytecode):
            exe = client.compile(source)
            assert torch.equal(exe(a, a)[0], a * 2)
        # an ir.Module is keyed by its printed form (locations left out)
        assert fingerprint(module) == fingerprint(module.operation.get_asm(enable_debug_info=False))


def test_execute_returns_device_buffers_that_chain(client):
    exe = client.compile(add_module("3"), name="add")
    x = torch.tensor([1.0, 2.0, 3.0])
    b = client.to_device(x)
    (y,) = exe.execute([b, b])
    (z,) = exe.execute([y, x])  # a device buffer and a torch tensor mixed
    (w,) = exe.execute([z, np.ones(3, np.float32)])  # and NumPy
    assert torch.equal(w.to_torch(), x * 3 + 1)
    assert not b.is_deleted and torch.equal(b.to_torch(), x)


def test_several_results_and_no_results(client):
    exe = client.compile(TWO_RESULTS, name="two")
    a = torch.tensor([-1.0, 0.5, 2.0])
    sq, n2, pos = exe(a, torch.tensor(21, dtype=torch.int32))
    assert torch.equal(sq, a * a)
    assert n2.item() == 42 and n2.dtype == torch.int32
    assert pos.tolist() == [False, True, True]
    nothing = client.compile(NO_RESULTS, name="nothing")
    assert nothing(torch.ones(2)) == []
    assert nothing.execute([torch.ones(2)]) == []


def test_argument_errors_say_what_the_program_takes(client):
    exe = client.compile(add_module(), name="add.mlir")
    good = torch.ones(2, 3)
    with pytest.raises(ArgumentError, match=r"add\.mlir: takes 2 arguments \(tensor<2x3xf32>, tensor<2x3xf32>\), got 1"):
        exe(good)
    with pytest.raises(ArgumentError, match=r"argument 1: expected tensor<2x3xf32>, got a torch\.float64 tensor of shape \[2, 3\]"):
        exe(good, torch.ones(2, 3, dtype=torch.float64))
    with pytest.raises(ArgumentError, match=r"argument 0: expected tensor<2x3xf32>, got a torch\.float32 tensor of shape \[3, 2\]"):
        exe(torch.ones(3, 2), good)
    with pytest.raises(ArgumentError, match=r"argument 1: expected tensor<2x3xf32>, got a tensor<2x3xi32> NumPy array"):
        exe(good, np.ones((2, 3), np.int32))
    with pytest.raises(ArgumentError, match=r"argument 0: expected tensor<2x3xf32>, got a list"):
        exe([1, 2, 3], good)
    with pytest.raises(ArgumentError, match="compiled for 1 replica, got arguments for 2"):
        exe.execute_replicated([[good, good], [good, good]])


def test_donated_argument_is_consumed_and_host_tensor_untouched(client):
    exe = client.compile(ALIASED, name="accumulate")
    assert exe.donated_args == (0,)
    acc_host = torch.zeros(4)
    x = torch.arange(4, dtype=torch.float32)
    acc = client.to_device(acc_host)  # aliases acc_host's memory on CPU
    for _ in range(3):
        (acc,) = exe.execute([acc, x])
    assert torch.equal(acc.to_torch(), x * 3)
    assert torch.equal(acc_host, torch.zeros(4))  # donation never writes into torch memory
    # a torch tensor passed at a donated position is copied in, never overwritten
    t = torch.ones(4)
    (out,) = exe(t, x)
    assert torch.equal(out, 1 + x) and torch.equal(t, torch.ones(4))


def test_host_tensors_are_imported_zero_copy_except_where_donated(client):
    """An aligned CPU tensor becomes a device array over its own memory (no copy); at a
    donated position it is copied (XLA may write the donated buffer)."""
    from torch_tpu.runtime import _jaxlib

    plain = client.compile(add_module("4"), name="add")
    donated = client.compile(ALIASED, name="accumulate")
    t = torch.arange(4, dtype=torch.float32)
    assert t.data_ptr() % 64 == 0
    for _ in range(2):  # the first tensor primes the converter; the second takes its fast path
        array = plain._converters[0](t, plain.devices[0])
        assert _jaxlib.data_pointer(array) == t.data_ptr()
        array = donated._converters[0](t, donated.devices[0])
        assert _jaxlib.data_pointer(array) != t.data_ptr()
    (out,) = donated(t, t)
    assert torch.equal(out, 2 * t) and torch.equal(t, torch.arange(4, dtype=torch.float32))


def test_execute_copies_host_arguments_it_does_not_wait_for(client):
    """`execute` returns before the program ran: a host tensor or array the caller writes
    right after must not change what the program reads (copied during the call), while
    `__call__`, which waits, may alias it."""
    from torch_tpu.runtime import _jaxlib

    exe = client.compile(add_module("4"), name="add")
    t = torch.arange(4, dtype=torch.float32)
    n = np.arange(4, dtype=np.float32)
    for value in (t, n):
        for _ in range(2):  # the second takes the converter's fast path
            array = exe._enqueuing_converters()[0](value, exe.devices[0])
            pointer = value.data_ptr() if isinstance(value, torch.Tensor) else value.ctypes.data
            assert _jaxlib.data_pointer(array) != pointer
    outs = [exe.execute([t, t]) for _ in range(3)]
    t.fill_(100.0)  # the caller reuses its tensor at once
    for (out,) in outs:
        assert torch.equal(out.to_torch(), 2 * torch.arange(4, dtype=torch.float32))


def test_every_kind_of_host_tensor_after_the_first_call(client):
    """The converter recognises a plain tensor by identity after the first one; tensors
    of other kinds (subclasses, requiring grad, strided, negated or conjugated views)
    still convert, and dtype and shape are still checked."""
    exe = client.compile(add_module(), name="add.mlir")
    a = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    assert torch.equal(exe(a, a)[0], 2 * a)
    kinds = {
        "parameter": torch.nn.Parameter(a.clone()),
        "requires_grad": a.clone().requires_grad_(),
        "strided": a.t().contiguous().t(),
        "negated view": torch._neg_view(-a),
        "unaligned": torch.arange(-1, 6, dtype=torch.float32)[1:].reshape(2, 3),
    }
    for name, value in kinds.items():
        (out,) = exe(value, a)
        assert torch.equal(out, 2 * a), name
        assert not out.requires_grad, name
    with pytest.raises(ArgumentError, match=r"argument 0: expected tensor<2x3xf32>, got a torch\.int32 tensor"):
        exe(a.int(), a)
    with pytest.raises(ArgumentError, match=r"argument 1: expected tensor<2x3xf32>, got a torch\.float32 tensor of shape \[6\]"):
        exe(a, a.reshape(6))


def test_donated_buffer_cannot_be_reused(client):
    exe = client.compile(ALIASED, name="accumulate")
    acc = client.to_device(torch.zeros(4), copy=True)
    exe.execute([acc, torch.ones(4)])
    assert acc.is_deleted
    with pytest.raises(BufferDeletedError, match="donated to an earlier call; pass that call's output"):
        exe.execute([acc, torch.ones(4)])
    with pytest.raises(BufferDeletedError):
        acc.to_torch()


def test_donating_a_buffer_shared_with_torch_donates_a_copy(client):
    exe = client.compile(ALIASED, name="accumulate")
    acc = client.to_device(torch.zeros(4), copy=True)
    viewed = acc.to_torch()  # shares the buffer's memory
    (out,) = exe.execute([acc, torch.ones(4)])
    assert torch.equal(out.to_torch(), torch.ones(4))
    assert torch.equal(viewed, torch.zeros(4))


def test_compile_spec_donate_argnums_marks_buffer_donors(client):
    exe = client.compile(add_module("4"), options=CompileSpec(donate_argnums=(0,)), name="add")
    assert exe.donated_args == (0,)
    a = client.to_device(torch.ones(4), copy=True)
    (out,) = exe.execute([a, torch.ones(4)])
    assert a.is_deleted and torch.equal(out.to_torch(), torch.full((4,), 2.0))
    plain = client.compile(add_module("4"), name="add")
    assert plain.donated_args == () and plain.key != exe.key
    with pytest.raises(CompileError, match=r"donate_argnums \[5\] out of range; @main has 2 arguments"):
        client.compile(add_module("4"), options=CompileSpec(donate_argnums=(5,)), name="add")


def test_dispatch_is_asynchronous_and_synchronize_waits(client):
    n = 256
    chain = "\n".join(
        f"    %m{i + 1} = stablehlo.dot_general %m{i}, %w, contracting_dims = [1] x [0] : "
        f"(tensor<{n}x{n}xf32>, tensor<{n}x{n}xf32>) -> tensor<{n}x{n}xf32>"
        for i in range(8)
    )
    text = (
        f"module @chain {{\n  func.func public @main(%m0: tensor<{n}x{n}xf32>, %w: tensor<{n}x{n}xf32>) -> tensor<{n}x{n}xf32> {{\n"
        f"{chain}\n    return %m8 : tensor<{n}x{n}xf32>\n  }}\n}}\n"
    )
    exe = client.compile(text, name="chain")
    g = torch.Generator().manual_seed(0)
    m = torch.randn(n, n, generator=g)
    w = torch.eye(n) * 0.5
    outs = [exe.execute([m, w])[0] for _ in range(4)]
    client.synchronize()
    assert all(o.is_ready() for o in outs)
    expected = m * (0.5**8)
    for o in outs:
        torch.testing.assert_close(o.to_torch(), expected, rtol=1e-5, atol=1e-6)
    # to_torch right after dispatch waits for the value by itself
    torch.testing.assert_close(exe.execute([m, w])[0].to_torch(), expected, rtol=1e-5, atol=1e-6)


def test_replicated_execution_with_collectives(cpu4):
    exe = cpu4.compile(allreduce_module(4), options=CompileSpec(num_replicas=4), name="allreduce")
    args = [[torch.full((4,), float(r + 1))] for r in range(4)]
    outs = exe.execute_replicated(args)
    assert len(outs) == 4
    for r, (total, rid) in enumerate(outs):
        assert total.device is cpu4.devices[r]
        assert torch.equal(total.to_torch(), torch.full((4,), 10.0))
        assert rid.to_numpy()[()] == r
    # outputs feed the next replicated run in place (each already on its replica's device)
    again = exe.execute_replicated([[outs[r][0]] for r in range(4)])
    assert torch.equal(again[2][0].to_torch(), torch.full((4,), 40.0))
    with pytest.raises(ArgumentError, match="compiled for 4 replicas, got arguments for 2"):
        exe.execute_replicated(args[:2])
    with pytest.raises(ArgumentError, match=r"takes 1 argument \(tensor<4xf32>\), got 2 \(replica 1\)"):
        exe.execute_replicated([args[0], args[1] * 2, args[2], args[3]])
    with pytest.raises(ArgumentError, match="compiled for 4 replicas; call execute_replicated"):
        exe(torch.ones(4))
    with pytest.raises(ArgumentError, match=r"replica 1, argument 0: expected tensor<4xf32>, got a DeviceBuffer on cpu:0"):
        exe.execute_replicated([[outs[0][0]], [outs[0][0]], [outs[2][0]], [outs[3][0]]])


def test_explicit_devices_and_wrong_device_buffers(cpu4):
    exe = cpu4.compile(add_module("2"), options=CompileSpec(device_indices=(2,)), name="add")
    assert exe.devices == (cpu4.devices[2],)
    on2 = cpu4.to_device(torch.ones(2), device_index=2)
    (out,) = exe.execute([on2, on2])
    assert out.device is cpu4.devices[2] and torch.equal(out.to_torch(), torch.full((2,), 2.0))
    on0 = cpu4.to_device(torch.ones(2))
    with pytest.raises(ArgumentError, match=r"got a DeviceBuffer on cpu:0 \(the program runs on cpu:2\)"):
        exe.execute([on0, on2])
    other = cpu4.compile(add_module("2"), name="add")
    assert other.key != exe.key  # the device assignment is part of the key
    with pytest.raises(ArgumentError, match="need 8 devices; the cpu client has 4"):
        cpu4.compile(add_module("2"), options=CompileSpec(num_replicas=8))


def test_compile_errors_are_located_and_clear(client):
    with pytest.raises(CompileError) as info:
        client.compile("module {\n  func.func @main( }\n", name="bad.mlir")
    first = str(info.value).splitlines()[0]
    assert first.startswith("bad.mlir:2:")
    assert "error:" in first and "Failed to parse using StableHLO" not in str(info.value)
    mismatch = """module @m { func.func public @main(%a: tensor<4xf32>) -> tensor<3xf32> {
      return %a : tensor<4xf32> } }"""
    with pytest.raises(CompileError, match=r"m\.mlir:2:7: error: type of return operand 0"):
        client.compile(mismatch, name="m.mlir")
    unknown = """module @m { func.func public @main(%a: tensor<4xf32>) -> tensor<4xf32> {
      %0 = stablehlo.custom_call @no_such_target(%a) : (tensor<4xf32>) -> tensor<4xf32>
      return %0 : tensor<4xf32> } }"""
    with pytest.raises(CompileError, match=r"cc\.mlir: error: the module calls the custom-call target 'no_such_target', which has no handler"):
        client.compile(unknown, name="cc.mlir")
    with pytest.raises(TypeError, match="cannot fingerprint a int"):
        client.compile(42)
    with pytest.raises(TypeError, match="needs fingerprint"):
        client.compile(lambda: add_module())


def test_lazy_module_with_explicit_fingerprint_is_built_only_on_a_miss(client):
    built = []

    def build():
        built.append(1)
        return add_module("5")

    class Graph:
        def cache_fingerprint(self):
            return b"graph: add", b"5"

    exe = client.compile(build, fingerprint=Graph())
    exe2 = client.compile(build, fingerprint=Graph())
    assert exe2 is exe and built == [1]
    assert torch.equal(exe(torch.ones(5), torch.ones(5))[0], torch.full((5,), 2.0))
    exe3 = client.compile(add_module("5"), fingerprint=(1234, 5678))
    assert exe3.key.shapeless == 1234 and exe3.key.dims == 5678


def test_device_out_of_memory_is_a_clear_error(client):
    oom = """module @oom { func.func public @main(%a: tensor<f32>) -> tensor<200000000000xf32> {
      %0 = stablehlo.broadcast_in_dim %a, dims = [] : (tensor<f32>) -> tensor<200000000000xf32>
      return %0 : tensor<200000000000xf32> } }"""
    exe = client.compile(oom, name="oom.mlir")
    with pytest.raises(DeviceOutOfMemoryError, match="ran out of memory .*free device buffers"):
        exe.execute([torch.tensor(1.0)])[0].synchronize()
    # the client is still usable afterwards
    assert client.compile(identity_module("f32", "2"))(torch.ones(2))[0].tolist() == [1.0, 1.0]


def test_compile_async_and_stats(client):
    futures = [client.compile_async(add_module(str(n)), name=f"add{n}") for n in (1, 2, 3)]
    exes = [f.result() for f in futures]
    assert [e.signature.args[0].shape for e in exes] == [(1,), (2,), (3,)]
    assert client.cache.stats.compiles == 3
    assert client.compile(add_module("2")) is exes[1]
    assert client.cache.stats.l1_hits == 1


def test_buffer_launcher_runs_donates_and_still_rejects_bad_buffers(client):
    """`buffer_launcher()` (the eager device's hot path) skips the per-argument
    conversion of `execute`, not its guarantees: results are DeviceBuffers of the
    program's result types, a donated buffer shared with torch is copied first (the
    torch tensor keeps its value), and a buffer of the wrong size or a deleted one is
    still an error raised as the runtime's class, never a crash."""
    exe = client.compile(ALIASED, name="accumulate")
    launch = exe.buffer_launcher()
    acc = client.to_device(torch.zeros(4), copy=True)
    x = client.to_device(torch.arange(4, dtype=torch.float32), copy=True)
    for _ in range(2):
        (acc,) = launch([acc, x])
    assert acc.type_string == "tensor<4xf32>" and acc.device is exe.devices[0]
    assert torch.equal(acc.to_torch(), torch.arange(4, dtype=torch.float32) * 2)
    viewed = acc.to_torch()  # exported: donating it would write into this tensor
    (out,) = launch([acc, x])
    assert torch.equal(out.to_torch(), torch.arange(4, dtype=torch.float32) * 3)
    assert torch.equal(viewed, torch.arange(4, dtype=torch.float32) * 2)
    assert not acc.is_deleted  # the copy was donated, not the exported buffer
    wrong = client.to_device(torch.zeros(5), copy=True)
    with pytest.raises(TorchTPURuntimeError, match="accumulate"):
        launch([wrong, x])
    with pytest.raises(ArgumentError, match="takes 2 arguments"):
        launch([x])
    gone = client.to_device(torch.zeros(4), copy=True)
    gone.delete()
    with pytest.raises(TorchTPURuntimeError, match="accumulate"):
        launch([gone, x])
