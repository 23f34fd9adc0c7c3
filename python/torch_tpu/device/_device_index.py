"""Tensors on `tpu:1`, `tpu:2`, ...: PyTorch's Python backend API builds tensors only on
device index 0 (`torch._C._acc.create_empty_tensor` hard-codes it), and a tensor's
device is that of its storage's data pointer: `set_` refuses a storage on another device
("Attempted to set the storage of a tensor on device tpu:0 to a storage on different
device tpu:1").

The one C++ path a Python backend can reach that makes a PrivateUse1 tensor on any index
is DLPack import: a DLPack tensor on `kDLExtDev` with `device_id` N becomes a tensor on
`PrivateUse1:N` (ATen's `getATenDevice`). So each (device, dtype) gets one *template*: an
empty tensor imported once from a hand-built DLPack capsule (it owns no memory and is
never freed). A new tensor on that device is the template's alias (a new TensorImpl on
the same device, made by the CPU kernel below autograd), whose storage `set_` then
replaces -- exactly what `create_empty_tensor` gives for device 0.

Autograd on those devices: see `_autograd.py`."""

from __future__ import annotations

import ctypes
import threading

import torch

_CPU = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)
_ALIAS = torch.ops.aten.alias.default
_VIEW_DTYPE = torch.ops.aten.view.dtype
_CREATE_EMPTY = torch._C._acc.create_empty_tensor  # makes tensors on tpu:0 only
_EXT_DEV = 12  # DLDeviceType::kDLExtDev: ATen maps it to PrivateUse1
# Never dereferenced (the template has no elements); outside any host allocation.
_TEMPLATE_ADDRESS = 1 << 45


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int), ("device_id", ctypes.c_int)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int), ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)), ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class _DLManagedTensor(ctypes.Structure):
    pass


_DELETER = ctypes.CFUNCTYPE(None, ctypes.POINTER(_DLManagedTensor))
_DLManagedTensor._fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", _DELETER)]

_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]

_lock = threading.Lock()
_bytes_templates: dict[int, torch.Tensor] = {}
_templates: dict[tuple[int, torch.dtype], torch.Tensor] = {}
# The DLPack structs the imported templates point at: they must outlive the templates,
# which live as long as the process.
_keep_alive: list = []


def _import_bytes_template(index: int) -> torch.Tensor:
    """An empty uint8 tensor on tpu:`index`, imported from a DLPack capsule."""
    shape = (ctypes.c_int64 * 1)(0)
    strides = (ctypes.c_int64 * 1)(1)
    managed = _DLManagedTensor()
    managed.dl_tensor = _DLTensor(ctypes.c_void_p(_TEMPLATE_ADDRESS), _DLDevice(_EXT_DEV, index), 1,
                                  _DLDataType(1, 8, 1), shape, strides, 0)  # kDLUInt, 8 bits
    managed.deleter = ctypes.cast(None, _DELETER)  # nothing to free
    _keep_alive.append((managed, shape, strides))
    template = torch.utils.dlpack.from_dlpack(_capsule_new(ctypes.addressof(managed), b"dltensor", None))
    if template.device != torch.device("tpu", index):
        raise RuntimeError(f"torch_tpu: internal error: a DLPack tensor on ext_dev:{index} imported on "
                           f"{template.device}, not tpu:{index}; report this to torch_tpu")
    return template


def empty_tensor(dtype: torch.dtype, index: int) -> torch.Tensor:
    """A new empty tensor of `dtype` on tpu:`index`, ready for `set_`: PyTorch's own for
    tpu:0, an alias of the device's template above."""
    if not index:
        return _CREATE_EMPTY([0], dtype)
    template = _templates.get((index, dtype))
    if template is None:
        with _lock:
            bytes_template = _bytes_templates.get(index)
            if bytes_template is None:
                from ._autograd import install_same_thread_backward

                install_same_thread_backward()
                bytes_template = _bytes_templates[index] = _import_bytes_template(index)
            template = _templates[(index, dtype)] = _VIEW_DTYPE.redispatch(_CPU, bytes_template, dtype)
    return _ALIAS.redispatch(_CPU, template)
