"""The capabilities of compiled programs are declared (`program/protocols.py`), and
`PrecisionKeyed` reads the declarations: nothing is probed or attached from outside."""

from __future__ import annotations

import torch

from torch_tpu.backend._compile import CompiledGraph, PendingGraph
from torch_tpu.backend._invoker import PrecisionKeyed
from torch_tpu.program.protocols import (
    FastPathProgram, HostCallable, PendingProgram, PrecisionAware, precision_sensitive,
)


class _Plain:
    def __call__(self, x):
        return x + 1


class _Insensitive(_Plain):
    precision_sensitive = False


class _WithFastPath(_Insensitive):
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, x):
        self.calls += 1
        return x + 1

    def fast_path(self):
        return lambda x: x + 2  # distinguishable from the program itself


def test_the_backend_classes_declare_what_they_offer():
    assert issubclass(PendingGraph, PendingProgram)
    assert issubclass(CompiledGraph, FastPathProgram)
    assert not issubclass(CompiledGraph, PendingProgram)
    pending = PendingGraph(lambda: _Plain(), precision_sensitive=False)
    assert isinstance(pending, PrecisionAware) and not precision_sensitive(pending)
    assert precision_sensitive(_Plain())  # undeclared: compiled per mode


def test_precision_keyed_follows_the_declarations():
    built = []

    def build():
        built.append(1)
        return _Plain()

    keyed = PrecisionKeyed(build)
    assert keyed.single_program is None  # undeclared sensitivity: one program per mode
    program = _WithFastPath()
    keyed = PrecisionKeyed(lambda: program)
    assert keyed.single_program is not None
    x = torch.zeros(1)
    assert keyed(x).item() == 1 and program.calls == 1  # the first call runs the program
    assert keyed(x).item() == 2 and program.calls == 1  # then its declared fast path


def test_runtime_executables_declare_a_host_call():
    from torch_tpu.runtime import get_client

    executable = get_client().compile(
        "func.func @main(%x: tensor<2xf32>) -> tensor<2xf32> {\n  return %x : tensor<2xf32>\n}\n")
    assert isinstance(executable, HostCallable)
    assert not isinstance(_Plain(), HostCallable)
