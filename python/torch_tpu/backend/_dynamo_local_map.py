"""Dynamo's local_map check, without importing context parallelism to make it.

When Dynamo wraps a function it meets while tracing (`VariableBuilder._wrap`, called for
`F.scaled_dot_product_attention`, `F.gelu`, ...), it asks
`LocalMapWrappedHigherOrderVariable.should_wrap_in_hop(value)` whether the function is
`torch.distributed.tensor.experimental._func_map._local_map_wrapped`, and that question
imports the module: `torch.distributed.tensor.experimental` with its context-parallel
attention, flex attention and sharding registrations, 0.04-0.1 s of the calling thread's
CPU on the quickstart model's first call (bench/first_call.py), for a function the
program cannot hold unless it imported that module itself.

`install()` answers False while the module is not imported (no object can then be that
function), and asks Dynamo's check otherwise: every answer is the one Dynamo gives.
"""

from __future__ import annotations

import sys
from typing import Any, Callable

_MODULE = "torch.distributed.tensor.experimental._func_map"
_MARK = "_torch_tpu_imports_nothing"


def install() -> bool:
    """Wraps `LocalMapWrappedHigherOrderVariable.should_wrap_in_hop` (once); False when this
    torch has no such check, leaving Dynamo as it is."""
    try:
        from torch._dynamo.variables.higher_order_ops import LocalMapWrappedHigherOrderVariable as variable
    except ImportError:
        return False
    check = variable.__dict__.get("should_wrap_in_hop")
    if not isinstance(check, classmethod):
        return False
    if getattr(check.__func__, _MARK, False):
        return True
    variable.should_wrap_in_hop = classmethod(only_once_imported(check.__func__))
    return True


def only_once_imported(check: Callable[[Any, Any], bool]) -> Callable[[Any, Any], bool]:
    def should_wrap_in_hop(cls: Any, value: Any) -> bool:
        if _MODULE not in sys.modules:
            return False  # `value is _local_map_wrapped` needs the module: it is not there
        return check(cls, value)

    setattr(should_wrap_in_hop, _MARK, True)
    should_wrap_in_hop.__wrapped__ = check  # type: ignore[attr-defined]
    return should_wrap_in_hop
