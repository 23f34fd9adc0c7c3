"""Everything of `torch_tpu.jax_op` that touches `jax`: tracing and lowering a JAX
function for given input shapes, and the function `jax.vjp` makes its backward from.

`jax` is imported here, on the first trace, never when torch_tpu (or a jax_op) is
merely imported or defined. A trace is a pure function of (function, input shapes and
dtypes); `JaxOp` caches it per signature.
"""

from __future__ import annotations

import contextlib
import os
import traceback
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
import xxhash

_SIXTY_FOUR_BIT = frozenset({torch.float64, torch.int64, torch.uint64, torch.complex128})


class JaxOpError(RuntimeError):
    """A jax_op whose function cannot be traced or lowered, or that is called wrongly;
    the message names the op, the function and the user's line."""


@dataclass(frozen=True)
class ArraySpec:
    """The shape and dtype of one input or output array."""

    shape: tuple[int, ...]
    dtype: torch.dtype

    @classmethod
    def of(cls, tensor: torch.Tensor) -> "ArraySpec":
        return cls(tuple(int(s) for s in tensor.shape), tensor.dtype)

    def __str__(self) -> str:
        return f"{str(self.dtype).removeprefix('torch.')}[{','.join(map(str, self.shape))}]"


@dataclass(frozen=True)
class Traced:
    """A JAX function lowered for one signature."""

    stablehlo: str  # MLIR text of jax.jit(fn).lower(*avals), in jax's own context
    outputs: tuple[ArraySpec, ...]
    single: bool  # the function returns one array (else a tuple/list of them)
    digest: str  # identity of the lowering: keys compile caches and names merged symbols


def describe_function(fn: Callable) -> str:
    """`name (file:line)` of a user function (a functools.partial: of its function)."""
    target = getattr(fn, "func", fn)
    code = getattr(target, "__code__", None)
    name = getattr(target, "__qualname__", type(target).__name__)
    return f"{name} ({code.co_filename}:{code.co_firstlineno})" if code is not None else name


def _jax_dtype(dtype: torch.dtype):
    import jax.numpy as jnp

    try:
        return jnp.dtype(str(dtype).removeprefix("torch."))
    except TypeError:
        raise TypeError(f"JAX has no dtype for {dtype}") from None


def _torch_dtype(dtype) -> torch.dtype:
    import numpy as np

    name = np.dtype(dtype).name
    result = getattr(torch, name, None)
    if not isinstance(result, torch.dtype):
        raise TypeError(f"torch has no dtype for JAX's {name}")
    return result


def _x64(specs: Sequence[ArraySpec]):
    """jax truncates 64-bit inputs to 32 bits unless x64 is on: turn it on, for this trace
    only, when an input is 64-bit (float32 functions keep jax's default types)."""
    if any(s.dtype in _SIXTY_FOUR_BIT for s in specs):
        import jax

        return jax.enable_x64(True)
    return contextlib.nullcontext()


def _user_line(fn: Callable, err: BaseException) -> str:
    """The deepest frame of the failure inside the user's function's file."""
    target = getattr(fn, "func", fn)
    code = getattr(target, "__code__", None)
    if code is None:
        return ""
    frames = [f for f in traceback.extract_tb(err.__traceback__) if os.path.samefile(f.filename, code.co_filename)] \
        if os.path.exists(code.co_filename) else []
    if not frames:
        return ""
    frame = frames[-1]
    return f" at {frame.filename}:{frame.lineno} ({(frame.line or '').strip()})"


def runtime_platform() -> str:
    """The PjRT platform programs run on (`cpu`, `tpu`, `cuda`): jax's name for it too."""
    from torch_tpu.runtime import get_client

    return get_client().platform


# torch's float32 matmul precision modes as jax's default matmul precision. The mode
# must reach inside the function: a Pallas kernel's dots are lowered by Mosaic into the
# kernel's own code, where no pass of ours can set their precision afterwards.
_JAX_MATMUL_PRECISION = {"highest": "highest", "high": "high", "medium": "bfloat16"}


def trace(fn: Callable, jitted: Any, name: str, specs: Sequence[ArraySpec], precision: str = "highest") -> Traced:
    """Lowers `fn` (its `jax.jit`, `jitted`) for inputs of `specs`, its float32 matrix
    products at torch's `precision` mode. Raises `JaxOpError` naming the op, the function
    and the user's failing line."""
    import jax

    signature = ", ".join(map(str, specs))
    try:
        with _x64(specs), jax.default_matmul_precision(_JAX_MATMUL_PRECISION[precision]):
            avals = [jax.ShapeDtypeStruct(s.shape, _jax_dtype(s.dtype)) for s in specs]
            # For the platform torch_tpu runs on, not jax's default one: a Pallas kernel
            # lowers to a Mosaic custom call for a TPU, to loops (interpret mode) elsewhere,
            # and jax never opens a device of its own for this.
            lowered = jitted.trace(*avals).lower(lowering_platforms=(runtime_platform(),))
            leaves, _ = jax.tree_util.tree_flatten(lowered.out_info)
            text = lowered.as_text(dialect="stablehlo")
    except Exception as err:  # noqa: BLE001 - any failure of the user's function
        raise JaxOpError(
            f"torch_tpu.jax_op '{name}': tracing {describe_function(fn)} for inputs ({signature}) failed"
            f"{_user_line(fn, err)}: {type(err).__name__}: {err}"
        ) from err
    out = lowered.out_info
    single = not isinstance(out, (tuple, list))
    if not single and any(isinstance(o, (tuple, list, dict)) for o in out) or isinstance(out, dict):
        raise JaxOpError(
            f"torch_tpu.jax_op '{name}': {describe_function(fn)} returns a nested structure; "
            "return one array or a flat tuple of arrays"
        )
    outputs = tuple(ArraySpec(tuple(int(d) for d in leaf.shape), _torch_dtype(leaf.dtype)) for leaf in leaves)
    digest = xxhash.xxh3_64_hexdigest(text.encode())
    return Traced(text, outputs, single, digest)


def vjp_function(fn: Callable, num_primals: int) -> Callable:
    """The function `(*primals, *cotangents) -> gradients of the inexact primals`, from
    `jax.vjp` (the forward is recomputed inside the backward). Integer inputs get no
    gradient; integer outputs take float0 cotangents, as jax requires."""

    def backward(*arrays):
        import jax
        import jax.numpy as jnp
        import numpy as np

        primals, cotangents = arrays[:num_primals], arrays[num_primals:]
        inexact = [i for i, p in enumerate(primals) if jnp.issubdtype(p.dtype, jnp.inexact)]

        def of_inexact(*values):
            full = list(primals)
            for i, v in zip(inexact, values):
                full[i] = v
            return fn(*full)

        out, pullback = jax.vjp(of_inexact, *(primals[i] for i in inexact))
        leaves, tree = jax.tree_util.tree_flatten(out)
        cts = [
            ct if jnp.issubdtype(o.dtype, jnp.inexact) else np.zeros(o.shape, dtype=jax.dtypes.float0)
            for o, ct in zip(leaves, cotangents)
        ]
        return tuple(pullback(jax.tree_util.tree_unflatten(tree, cts)))

    backward.__qualname__ = f"vjp of {getattr(getattr(fn, 'func', fn), '__qualname__', 'fn')}"
    return backward


def differentiable_inputs(specs: Sequence[ArraySpec]) -> list[int]:
    """Positions of the inputs jax.vjp gives gradients for (floating and complex)."""
    return [i for i, s in enumerate(specs) if s.dtype.is_floating_point or s.dtype.is_complex]
