"""`torch_tpu.jax_op(name, fn)`: a JAX function (or Pallas kernel) as the PyTorch custom
op `torch_tpu::<name>`.

    softmax = torch_tpu.jax_op("softmax", lambda x: jax.nn.softmax(x, axis=-1))
    y = softmax(x)                        # x on tpu, on CPU, or inside torch.compile

One op, four ways in, one lowering:

* the op's rule in the compiler's lowering table merges `jax.jit(fn).lower(...)`'s
  StableHLO into the module being built as private functions and calls them
  (`compiler/importer/foreign_module.py`), so compiled graphs keep the op (no graph
  break) and the eager tpu device runs it like any lowered op (`device/_ops.py`);
* on CPU tensors the same rule builds a one-op module that the runtime runs;
* the fake implementation comes from the same trace (output shapes and dtypes);
* autograd: a second jax_op made from `jax.vjp` (the forward recomputed in the
  backward), unless a backward is given (`JaxOp.register_autograd`).

Traces are cached per input signature on the op: define a jax_op once, at module level.
Compile caches key the op by its StableHLO (`Lowering.identity`), not only its name.
The op's schema is `(Tensor[] inputs) -> Tensor[]`; the callable unpacks one result.
"""

from __future__ import annotations

import keyword
import threading
from typing import Callable

import torch

from ._jax_trace import ArraySpec, JaxOpError, Traced, describe_function, differentiable_inputs, trace, vjp_function

__all__ = ["JaxOp", "JaxOpError", "jax_op"]

_NAMESPACE = "torch_tpu"
_lock = threading.RLock()
_library: torch.library.Library | None = None
_OPS: dict[str, "JaxOp"] = {}


def _lib() -> torch.library.Library:
    global _library
    if _library is None:
        _library = torch.library.Library(_NAMESPACE, "FRAGMENT")  # noqa: TOR901 - kept for the process
    return _library


def _specs(tensors) -> tuple[ArraySpec, ...]:
    return tuple(ArraySpec.of(t) for t in tensors)


class JaxOp:
    """A JAX function registered as `torch_tpu::<name>`; call it with torch tensors."""

    def __init__(self, name: str, fn: Callable) -> None:
        self.name = name
        self.fn = fn
        self._jitted = None  # jax.jit(fn), made on the first trace (imports jax)
        # (input signature, float32 matmul precision mode) -> lowering
        self._traces: dict[tuple[tuple[ArraySpec, ...], str], Traced] = {}
        self._backward: tuple[Callable, Callable | None] | None = None
        self._vjp_ops: dict[int, JaxOp] = {}
        self._single: bool | None = None  # whether the function returns one array
        self._define()

    def __repr__(self) -> str:
        return f"JaxOp({_NAMESPACE}::{self.name}, {describe_function(self.fn)})"

    # -- the torch op -----------------------------------------------------------------------
    @property
    def op(self) -> torch._ops.OpOverload:
        return self._op

    def _define(self) -> None:
        lib = _lib()
        lib.define(f"{self.name}(Tensor[] inputs) -> Tensor[]")
        self._op = getattr(getattr(torch.ops, _NAMESPACE), self.name).default
        lib.impl(self.name, self._run_cpu, "CPU")
        lib.impl(self.name, self._run_tpu, "PrivateUse1")
        torch.library.register_fake(f"{_NAMESPACE}::{self.name}", self._fake, lib=lib)
        torch.library.register_autograd(
            f"{_NAMESPACE}::{self.name}", self._autograd_backward, setup_context=self._setup_context, lib=lib
        )

    def _register_lowering(self) -> None:
        """Adds the op's rule to the lowering table, on the first trace: importing the
        table costs seconds, which defining a jax_op at import time must not pay; every
        user of the rule (graph import, eager plans, the CPU path) traces first."""
        from torch_tpu.compiler.lowering.registry import Lowering, Padding, add_lowering, definition_site

        # A jax function's shapes are traced static: with a padded (dynamic) operand the op
        # runs in eager (Padding.EAGER). Its site is the user's jax function, not this method.
        add_lowering(Lowering(self.op, self._lower, "jax_op", Padding.EAGER, identity=self._identity,
                              site=definition_site(self.fn)))

    @property
    def _lowering_registered(self) -> bool:
        from torch_tpu.compiler.lowering.registry import LOWERINGS

        return self.op in LOWERINGS

    def __call__(self, *tensors: torch.Tensor):
        if not tensors:
            raise JaxOpError(f"torch_tpu.jax_op '{self.name}': called without tensors; a jax_op takes at least one "
                             "(its device decides where it runs)")
        for i, t in enumerate(tensors):
            if not isinstance(t, torch.Tensor):
                raise JaxOpError(
                    f"torch_tpu.jax_op '{self.name}': argument {i} is a {type(t).__name__}, not a tensor; "
                    "pass tensors only (close over static values with functools.partial)"
                )
        outs = self.op(list(tensors))
        return outs[0] if self._single else tuple(outs)

    # -- tracing ----------------------------------------------------------------------------
    def traced(self, specs: tuple[ArraySpec, ...]) -> Traced:
        """The lowering for one input signature under the float32 matmul precision in
        effect (traced once per pair, then cached)."""
        from ..program.precision import current_mode

        key = (specs, current_mode())
        result = self._traces.get(key)
        if result is not None and self._lowering_registered:
            return result
        with _lock:
            if not self._lowering_registered:
                self._register_lowering()
            if result is not None:
                return result
            if self._jitted is None:
                jax = _import_jax(self.name)

                # keep_unused: the merged call passes every input (jax would drop those
                # the function ignores, as a gather's backward ignores the gathered array).
                self._jitted = jax.jit(self.fn, keep_unused=True)
            result = trace(self.fn, self._jitted, self.name, specs, key[1])
            if self._single is not None and self._single != result.single:
                raise JaxOpError(
                    f"torch_tpu.jax_op '{self.name}': {describe_function(self.fn)} returns one array for some "
                    "input shapes and a tuple for others; return the same structure for every shape"
                )
            self._single = result.single
            self._traces[key] = result
        return result

    def _fake(self, inputs):
        traced = self.traced(_specs(inputs))
        device = inputs[0].device if inputs else torch.device("cpu")
        return [torch.empty(o.shape, dtype=o.dtype, device=device) for o in traced.outputs]

    # -- lowering (compiled graphs, the eager device and the CPU path) ---------------------
    def _identity(self, record) -> str:
        return self.traced(_specs(record.args[0])).digest

    def _lower(self, ctx, inputs):
        from torch_tpu.compiler.importer.foreign_module import ForeignModuleError, call_foreign_module

        traced = self.traced(_specs(ctx.record.args[0]))
        try:
            results = call_foreign_module(traced.stablehlo, list(inputs), f"jax_op.{self.name}.{traced.digest}",
                                          where=f"jax_op '{self.name}'")
        except ForeignModuleError as err:
            raise ctx.fail(f"jax_op '{self.name}' ({describe_function(self.fn)}): {err.reason}") from None
        return tuple(results)

    def _run_tpu(self, inputs):
        from torch_tpu.device._registration import execute

        if not self._lowering_registered:
            # Before the device looks the op up: it plans the op through the table (a
            # lowering added later is found too, `_ops.lowering_changed`, but this call
            # would already have run on the CPU).
            with _lock:
                if not self._lowering_registered:
                    self._register_lowering()
        return list(execute(self.op, inputs))

    def _run_cpu(self, inputs):
        specs = _specs(inputs)
        executable = self._cpu_executable(specs)
        outs = executable(*(t.contiguous() for t in inputs))
        return list(outs)

    def _cpu_executable(self, specs: tuple[ArraySpec, ...]):
        """The op alone as a module for the runtime's CPU device, compiled through
        `compile_module` (once per signature, traced function and precision mode)."""
        from torch_tpu.compiler.importer.single_op import lower_op
        from torch_tpu.compiler.lowering.registry import LoweringError, OpRecord

        from ..program.precision import current_mode
        from ..program import ProgramKey, compile_module, shared_context
        from ..program.pipelines import compile_pipeline

        mode = current_mode()
        traced = self.traced(specs)

        def build():
            metas = [torch.empty(s.shape, dtype=s.dtype, device="meta") for s in specs]
            val = [torch.empty(o.shape, dtype=o.dtype, device="meta") for o in traced.outputs]
            record = OpRecord(self.op, (metas,), {}, val, f"jax_op '{self.name}'")
            try:
                return lower_op(
                    record, [(s.shape, s.dtype) for s in specs],
                    lambda args: ((list(args),), {}), lambda result, args: list(result), context=shared_context(),
                )
            except LoweringError as err:
                raise JaxOpError(str(err)) from None

        def rejected(engine) -> Exception:
            return JaxOpError(f"torch_tpu.jax_op '{self.name}': the pass pipeline rejected the module: {engine.format()}")

        return compile_module(
            build, key=ProgramKey("jax_op", (self.name, specs, traced.digest), mode),
            name=f"jax_op '{self.name}'", pipeline=compile_pipeline(mode), rejected=rejected,
        ).executable

    # -- autograd ---------------------------------------------------------------------------
    def register_autograd(self, backward: Callable, setup_context: Callable | None = None) -> None:
        """Replaces the `jax.vjp` backward: `setup_context(ctx, inputs, output)` (inputs:
        the tensors the op was called with; output: what it returned) and
        `backward(ctx, *grad_outputs)` returning one gradient (or None) per input, as
        `torch.library.register_autograd` has them. Without `setup_context` the inputs
        are saved (`ctx.saved_tensors`)."""
        self._backward = (backward, setup_context)

    def _setup_context(self, ctx, inputs, output) -> None:
        (tensors,) = inputs
        if self._backward is not None and self._backward[1] is not None:
            self._backward[1](ctx, tuple(tensors), output[0] if self._single else tuple(output))
            return
        ctx.save_for_backward(*tensors)
        ctx.jax_op_specs = _specs(tensors)

    def _autograd_backward(self, ctx, grads):
        if self._backward is not None:
            result = self._backward[0](ctx, *grads)
            result = (result,) if not isinstance(result, (tuple, list)) else tuple(result)
            return list(result)
        inputs = ctx.saved_tensors
        specs: tuple[ArraySpec, ...] = ctx.jax_op_specs
        outputs = self.traced(specs).outputs
        cotangents = [
            g if g is not None else torch.zeros(o.shape, dtype=o.dtype, device=inputs[0].device)
            for g, o in zip(grads, outputs)
        ]
        positions = differentiable_inputs(specs)
        if not positions:
            return [None] * len(inputs)
        computed = self._vjp_op(len(inputs)).op(list(inputs) + cotangents)
        result: list[torch.Tensor | None] = [None] * len(inputs)
        for position, grad in zip(positions, computed):
            result[position] = grad
        return result

    def _vjp_op(self, num_primals: int) -> "JaxOp":
        with _lock:
            op = self._vjp_ops.get(num_primals)
            if op is None:
                op = JaxOp(f"{self.name}__vjp{num_primals}", vjp_function(self.fn, num_primals))
                self._vjp_ops[num_primals] = op
        return op


def _import_jax(name: str):
    """jax, or an error saying how to install it: torch_tpu depends on jaxlib only (the
    MLIR bindings and PjRT), and jax must match jaxlib's version."""
    try:
        import jax
    except ImportError as err:
        from importlib.metadata import PackageNotFoundError, version

        try:
            wanted = f"jax=={version('jaxlib')}"
        except PackageNotFoundError:
            wanted = "jax"
        raise JaxOpError(
            f"torch_tpu.jax_op '{name}': jax is not installed ({err}); torch_tpu installs jaxlib only -- "
            f"install the jax that matches it: pip install '{wanted}'"
        ) from None
    return jax


def jax_op(name: str, fn: Callable) -> JaxOp:
    """Registers `fn` (a JAX function of arrays returning an array or a flat tuple of
    arrays; a Pallas kernel call) as the PyTorch custom op `torch_tpu::<name>` and
    returns a callable on torch tensors. Works on tpu tensors, on CPU tensors (through the
    runtime), inside `torch.compile(backend="tpu")` without a graph break, and under
    autograd (`jax.vjp`, or `JaxOp.register_autograd`). Non-tensor parameters: close over
    them (`functools.partial`). Define it once, at module level: traces are cached on the
    returned op, and a name can be registered once (the same `fn` again returns the
    existing op)."""
    if not isinstance(name, str) or not name.isidentifier() or keyword.iskeyword(name) or "__" in name:
        raise ValueError(f"torch_tpu.jax_op: {name!r} is not a valid op name (a Python identifier without '__')")
    if not callable(fn):
        raise TypeError(f"torch_tpu.jax_op '{name}': fn must be callable, got {type(fn).__name__}")
    with _lock:
        existing = _OPS.get(name)
        if existing is not None:
            if existing.fn is fn:
                return existing
            raise JaxOpError(
                f"torch_tpu.jax_op '{name}' is already defined with {describe_function(existing.fn)}; "
                "define each jax_op once at module level (a jax_op made inside a training step would "
                "re-trace on every step), or give this function another name"
            )
        op = JaxOp(name, fn)
        _OPS[name] = op
        return op
