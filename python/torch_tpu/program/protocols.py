"""What a compiled program offers its callers, declared instead of probed.

The backend's graph wrappers (`_compile.CompiledGraph`, `PendingGraph`, the bounded and
views graphs, ...) and the runtime's executables are different classes; `PrecisionKeyed`
and the fast call path need to know only which of these capabilities one has. A class
states it by defining the members; `isinstance` checks the declaration (these protocols
are runtime-checkable), so a capability is never an attribute attached from outside.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class PrecisionAware(Protocol):
    """A program that knows whether the matmul precision mode changes it (it has matrix
    ops). Programs that do not say so are compiled once per mode."""

    @property
    def precision_sensitive(self) -> bool: ...


@runtime_checkable
class PendingProgram(Protocol):
    """A program still compiling in the background: `resolve()` waits for it and returns
    the callable program (raising the compile's error)."""

    def resolve(self) -> Callable[..., Any]: ...


@runtime_checkable
class FastPathProgram(Protocol):
    """A program that, after its first call, can offer a faster callable for the same
    kind of arguments (`None`: none applies)."""

    def fast_path(self) -> Callable[..., Any] | None: ...


@runtime_checkable
class HostCallable(Protocol):
    """An executable with a precomputed call on host tensors returning its results in a
    `result_type` container (`runtime.Executable.caller`)."""

    def caller(self, result_type: type) -> Callable[..., Any]: ...


@runtime_checkable
class BufferLaunching(Protocol):
    """An executable that launches on DeviceBuffers made for it, skipping the argument
    converters (`runtime.Executable.buffer_launcher`)."""

    def buffer_launcher(self) -> Callable[[Any], list]: ...


def precision_sensitive(program: Any) -> bool:
    """Whether `program` depends on the precision mode: what it declares, else True."""
    return program.precision_sensitive if isinstance(program, PrecisionAware) else True
