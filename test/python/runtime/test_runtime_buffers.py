"""torch <-> device buffers: every dtype round-trips, the zero-copy rule, clear errors."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import torch
from rt_helpers import add_module, identity_module
from torch_tpu.runtime import ArgumentError, BufferDeletedError, UnsupportedDtypeError, dtypes

ALL_TORCH_DTYPES = [
    torch.float32, torch.float64, torch.float16, torch.bfloat16,
    torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz, torch.float8_e8m0fnu,
    torch.int8, torch.int16, torch.int32, torch.int64,
    torch.uint8, torch.uint16, torch.uint32, torch.uint64,
    torch.bool, torch.complex64, torch.complex128,
]


def _sample(dtype: torch.dtype, shape=(2, 3)) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    n = int(np.prod(shape))
    if dtype == torch.bool:
        return (torch.randint(0, 2, shape, generator=g) == 1)
    if dtype.is_complex:
        return torch.randn(shape, dtype=dtype, generator=g)
    if dtype.is_floating_point:
        if dtype == torch.float8_e8m0fnu:  # powers of two only
            return torch.tensor([2.0 ** (i - 3) for i in range(n)]).reshape(shape).to(dtype)
        return (torch.randn(shape, generator=g) * 4).to(dtype)
    info = torch.iinfo(dtype)
    lo, hi = max(info.min, -1000), min(info.max, 1000)
    return torch.randint(lo, hi, shape, generator=g, dtype=torch.int64).to(dtype)


def _bits(t: torch.Tensor) -> torch.Tensor:
    """Bit pattern, so NaNs and -0.0 compare exactly."""
    if t.dtype == torch.bool:
        return t
    view = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64, 16: torch.int64}[t.element_size()]
    if t.dtype.is_complex:
        return torch.view_as_real(t).contiguous().view(view)
    return t.contiguous().view(view)


def test_dtype_table_covers_every_torch_dtype_stablehlo_has():
    for dt in ALL_TORCH_DTYPES:
        row = dtypes.from_torch(dt)
        assert dtypes.torch_dtype(row) is dt
        assert dtypes.from_numpy(row.numpy) is row
        assert dtypes.from_mlir(row.mlir) is row


@pytest.mark.parametrize("dtype", ALL_TORCH_DTYPES, ids=lambda d: str(d).removeprefix("torch."))
def test_to_device_and_back_round_trips_every_dtype(client, dtype):
    t = _sample(dtype)
    buf = client.to_device(t)
    assert buf.shape == (2, 3)
    assert buf.dtype is dtype
    back = buf.to_torch()
    assert back.dtype is dtype and back.shape == t.shape
    assert torch.equal(_bits(back), _bits(t))


@pytest.mark.parametrize("dtype", ALL_TORCH_DTYPES, ids=lambda d: str(d).removeprefix("torch."))
def test_every_dtype_through_an_executable(client, dtype):
    row = dtypes.from_torch(dtype)
    exe = client.compile(identity_module(row.mlir), name=f"ident-{row.mlir}")
    t = _sample(dtype)
    (out,) = exe(t)
    assert out.dtype is dtype
    assert torch.equal(_bits(out), _bits(t))
    # and to NumPy (ml_dtypes for bf16 / f8)
    host = exe.execute([t])[0].to_numpy()
    assert host.dtype == row.numpy
    assert host.tobytes() == _bits(t).numpy().tobytes()


def test_numpy_inputs_and_outputs_including_ml_dtypes(client):
    for dt in (np.float32, ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn, np.bool_, np.complex64, np.uint16):
        a = (np.arange(6) % 3).astype(dt).reshape(2, 3)
        buf = client.to_device(a)
        got = buf.to_numpy()
        assert got.dtype == np.dtype(dt)
        np.testing.assert_array_equal(got, a)


def test_zero_copy_rule_aligned_contiguous_tensor_is_aliased(client):
    t = torch.arange(64, dtype=torch.float32)
    assert t.data_ptr() % 64 == 0
    buf = client.to_device(t)
    assert buf.to_torch().data_ptr() == t.data_ptr()  # the device buffer is the tensor's memory
    copied = client.to_device(t, copy=True)
    assert copied.to_torch().data_ptr() != t.data_ptr()


def test_zero_copy_rule_unaligned_tensor_is_copied(client):
    base = torch.arange(65, dtype=torch.float32)
    t = base[1:]  # contiguous, 4 bytes past a 64-byte boundary
    assert t.is_contiguous() and t.data_ptr() % 64 != 0
    buf = client.to_device(t)
    back = buf.to_torch()
    assert back.data_ptr() != t.data_ptr()
    assert torch.equal(back, t)
    base.zero_()  # the copy does not see later writes
    assert torch.equal(buf.to_torch(), torch.arange(1, 65, dtype=torch.float32))


def test_non_contiguous_and_special_tensors_are_copied_correctly(client):
    m = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    for t in (m.t(), m[:, ::2], m.expand(2, 3, 4)[1]):
        assert torch.equal(client.to_device(t).to_torch(), t.contiguous())
    z = torch.randn(3, dtype=torch.complex64, generator=torch.Generator().manual_seed(1))
    assert torch.equal(client.to_device(z.conj()).to_torch(), z.conj().resolve_conj())
    g = torch.ones(3, requires_grad=True)
    assert torch.equal(client.to_device(g).to_torch(), torch.ones(3))


def test_zero_size_and_scalar_tensors(client):
    empty = torch.zeros(0, 3)
    buf = client.to_device(empty)
    assert buf.shape == (0, 3) and buf.to_torch().shape == (0, 3)
    s = torch.tensor(2.5)
    assert client.to_device(s).to_torch().item() == 2.5
    assert client.to_device(np.float64(1.25)).to_numpy()[()] == 1.25


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize(
    "dtype",
    [torch.complex32, torch.qint8, torch.quint8, torch.float4_e2m1fn_x2, torch.uint4],
    ids=str,
)
def test_unsupported_dtypes_name_the_dtype(client, dtype):
    t = torch.empty(0, dtype=dtype) if dtype not in (torch.qint8, torch.quint8) else torch.quantize_per_tensor(
        torch.zeros(2), 1.0, 0, dtype
    )
    with pytest.raises(UnsupportedDtypeError, match=str(dtype).replace(".", r"\.")):
        client.to_device(t)


def test_unsupported_host_values(client):
    with pytest.raises(ArgumentError, match="cannot move a builtins.float to a device: .* a Python number has no dtype"):
        client.to_device(3.0)
    with pytest.raises(UnsupportedDtypeError, match="NumPy dtype"):
        client.to_device(np.array(["a", "b"]))


def test_device_buffer_properties_and_delete(client):
    buf = client.to_device(torch.ones(2, 3, dtype=torch.bfloat16))
    assert buf.shape == (2, 3) and buf.ndim == 2
    assert buf.np_dtype == np.dtype(ml_dtypes.bfloat16)
    assert buf.element_type == "bf16" and buf.type_string == "tensor<2x3xbf16>"
    assert buf.nbytes == 12
    assert buf.device is client.devices[0] and str(buf.device) == "cpu:0"
    assert buf.synchronize() is buf and buf.is_ready()
    assert "tensor<2x3xbf16>" in repr(buf)
    buf.delete()
    assert buf.is_deleted
    with pytest.raises(BufferDeletedError, match="deleted, or donated"):
        buf.to_torch()


def test_to_torch_keeps_memory_alive_after_buffer_is_dropped(client):
    exe = client.compile(identity_module("f32", "1024"), name="ident")
    out_buf = exe.execute([torch.full((1024,), 3.0)])[0]
    tensor = out_buf.to_torch()
    del out_buf
    import gc

    gc.collect()
    assert torch.equal(tensor, torch.full((1024,), 3.0))


def test_device_index_out_of_range(client):
    with pytest.raises(ArgumentError, match=r"device index 3 out of range: the cpu client has 1 device\(s\) \(set TORCH_TPU_NUM_CPU_DEVICES"):
        client.to_device(torch.ones(1), device_index=3)



def test_copy_is_a_device_copy_with_its_own_memory(client):
    from torch_tpu.runtime import CompileSpec

    original = client.to_device(torch.arange(16, dtype=torch.float32), copy=True)
    copied = original.copy()
    assert copied.type_string == original.type_string and copied.device is original.device
    # Its own memory (ArrayImpl.clone() would share it), so donating the copy leaves the
    # original's value and buffer intact.
    assert copied.unsafe_data_pointer() != original.unsafe_data_pointer()
    exe = client.compile(add_module("16"), options=CompileSpec(donate_argnums=(0,)), name="add")
    (out,) = exe.execute([copied, torch.ones(16)])
    assert copied.is_deleted and not original.is_deleted
    assert torch.equal(out.to_torch(), torch.arange(16, dtype=torch.float32) + 1)
    assert torch.equal(original.to_torch(), torch.arange(16, dtype=torch.float32))
    original.delete()
    with pytest.raises(BufferDeletedError):
        original.copy()


def test_uploads_up_to_64_megabytes_are_staged_larger_ones_read_in_place():
    """Off XLA:CPU (`_jaxlib.upload_semantics`): staging was ~2x faster up to 64 MB on a TPU
    v5e, reading the host memory in place ~3x faster at 256 MB."""
    from torch_tpu.runtime import _jaxlib

    assert _jaxlib.upload_semantics(0) is _jaxlib.COPY_DURING_CALL
    assert _jaxlib.upload_semantics(64 << 20) is _jaxlib.COPY_DURING_CALL
    assert _jaxlib.upload_semantics((64 << 20) + 1) is _jaxlib.ZERO_COPY
