"""`options={"functionalize": "torchtpu"}`: inference graphs compiled with their views
and in-place ops, resolved by torch_tpu's own view passes instead of aot_autograd's
functionalization (docs/explanation/views.md).

The Dynamo graph is traced to ATen with `make_fx` on fake inputs (no functionalization,
the compiler's decomposition table), imported in non-functional mode (written storage
becomes `!torchtpu.ref`), and run through `torchtpu-decompose-views` and
`torchtpu-inverse-views`. Every input written in place comes back as an extra result
aliased to its argument (`tf.aliasing_output`): the runtime donates the argument's
device buffer, and the new value is copied into the caller's tensor.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch
import torch.fx

from torch_tpu.compiler.lowering import LoweringError


from ._compile import CompiledGraph
from ..program.errors import TorchTpuCompileError
from ._invoker import compile_fx
from ._output_alias import OutputAliasPlan, plan_output_aliases
from ..program.precision import current_mode
from ..core import attributes
from ..program.pipelines import views_pipeline

log = logging.getLogger("torch_tpu")

ALIASING_OUTPUT = attributes.ALIASING_OUTPUT
_logged: set[str] = set()


def log_once(key: str, message: str, *args) -> None:
    if key not in _logged:
        _logged.add(key)
        log.warning(message, *args)


def aliased_results(module) -> dict[int, int]:
    """{argument index: result index} from `tf.aliasing_output` on @main's arguments."""
    from torch_tpu.compiler.context import ir

    for op in module.body.operations:
        op = op.operation
        if op.name != "func.func" or "arg_attrs" not in op.attributes:
            continue
        pairs = {}
        for index, attrs in enumerate(ir.ArrayAttr(op.attributes["arg_attrs"])):
            attrs = ir.DictAttr(attrs)
            if ALIASING_OUTPUT in attrs:
                pairs[index] = ir.IntegerAttr(attrs[ALIASING_OUTPUT]).value
        return pairs
    return {}


class InPlaceCompiledGraph(CompiledGraph):
    """A compiled non-functional graph: after each run, the inputs the graph writes get
    their new values (the results aliased to them). Written inputs go in as plain tensors
    (the invoker never makes them resident: donation would consume the buffer)."""

    def __init__(self, executable, imported, written: dict[int, int],
                 output_aliases: OutputAliasPlan | None = None) -> None:
        super().__init__(executable, imported, written=written)
        self.written = written
        self.output_aliases = output_aliases

    def __call__(self, *args):
        results = self.invoker(*args)
        with torch.no_grad():
            for arg_index, result_index in self.written.items():
                args[arg_index].copy_(results[result_index])
        # After the write-back: outputs aliasing inputs are views of their new values.
        return self._unflatten(results, args)

    def _unflatten(self, results, args):
        import torch.utils._pytree as pytree

        leaves = [results[o.index] if o.kind == "tensor" else o.value for o in self._outputs]
        if self.output_aliases is not None:
            return self.output_aliases.rebuild(leaves, self._tree, args)
        return pytree.tree_unflatten(leaves, self._tree)


def compile_inplace_graph(gm: torch.fx.GraphModule, name: str = "graph") -> InPlaceCompiledGraph:
    """Compiles an ATen graph with views and in-place ops (every node must lower).
    Raises LoweringError or TorchTpuCompileError."""
    donate = donate_written_inputs()
    # Before the fingerprint: the plan rewrites the graph's outputs.
    output_aliases = plan_output_aliases(gm)
    written: dict[int, int] = {}

    def before_xla(module) -> None:
        written.update(aliased_results(module))
        if not donate:
            # After final.mlir was dumped: the aliasing attributes come off before XLA sees it.
            drop_aliasing(module)

    program = compile_fx(
        gm, name=name, settings=f"views=torchtpu;donate={donate}",
        pipeline=lambda mode, _platform: views_pipeline(mode),
        import_options={"functional": False}, dump_name=lambda _: f"{name}-views",
        what_failed="the view passes", before_xla=before_xla,
    )
    log.debug("torch_tpu: %s compiled with torchtpu views in %.2fs", name, program.seconds)
    return InPlaceCompiledGraph(program.executable, program.lowered, written, output_aliases)


def donate_written_inputs() -> bool:
    """TORCH_TPU_DONATE_WRITTEN_INPUTS (default 1). On XLA:CPU donation trades XLA's copy
    of the written tensor for PjRT's host copy of it (it cannot reuse a torch tensor's
    memory); bench/kv_cache.py measured no clear difference there. On devices it saves
    the copy."""
    from ..core import config

    return config.get("TORCH_TPU_DONATE_WRITTEN_INPUTS")


def drop_aliasing(module) -> None:
    """Removes `tf.aliasing_output` from @main's arguments: the written inputs' new values
    stay extra results (written back by the caller), without donation."""
    from torch_tpu.compiler.context import ir

    for op in module.body.operations:
        op = op.operation
        if op.name != "func.func" or "arg_attrs" not in op.attributes:
            continue
        with op.context:
            cleaned = []
            for attrs in ir.ArrayAttr(op.attributes["arg_attrs"]):
                attrs = ir.DictAttr(attrs)
                cleaned.append(ir.DictAttr.get({a.name: a.attr for a in (attrs[i] for i in range(len(attrs)))
                                                if a.name != ALIASING_OUTPUT}))
            op.attributes["arg_attrs"] = ir.ArrayAttr.get(cleaned)


def capture_aten(gm: torch.fx.GraphModule, example_inputs) -> torch.fx.GraphModule:
    """ATen graph of a Dynamo graph, with views and in-place ops kept (no
    functionalization), traced on fake copies of the inputs so nothing runs for real."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from torch_tpu.compiler.lowering.decompositions import decomposition_table

    from ._compile import _fill_placeholder_meta

    with torch._guards.tracing(None), torch.no_grad():
        traced = make_fx(gm, decomposition_table=decomposition_table(), tracing_mode="fake",
                         _allow_non_fake_inputs=True)(*example_inputs)
    _fill_placeholder_meta(traced, example_inputs)  # Python scalars are traced as constants
    # Custom ops without a lowering: their traced implementation (an untraceable one fails
    # the import, and the graph goes through aot_autograd, where it runs in eager).
    from ._custom_ops import expand_custom_ops

    expand_custom_ops(traced)
    return traced


def _storages_overlap(args, written: dict[int, int]) -> bool:
    """Whether a written input shares storage with another input: the compiled program
    treats inputs as distinct, so such a call runs eagerly instead."""
    if not written:
        return False
    pointers: dict[int, int] = {}
    for i, a in enumerate(args):
        if isinstance(a, torch.Tensor) and a.numel():
            ptr = a.untyped_storage().data_ptr()
            if ptr in pointers and (i in written or pointers[ptr] in written):
                return True
            pointers.setdefault(ptr, i)
    return False


def _data_dependent_errors() -> tuple[type[Exception], ...]:
    """Errors of tracing a graph whose sizes or indices depend on tensor values."""
    from torch._subclasses.fake_tensor import DataDependentOutputException, DynamicOutputShapeException
    from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

    return (GuardOnDataDependentSymNode, DataDependentOutputException, DynamicOutputShapeException)


_DATA_DEPENDENT = _data_dependent_errors()


class TorchTpuViewsGraph:
    """What the backend returns for one Dynamo graph in torchtpu-functionalize mode: the
    compiled graph, recompiled per concrete input signature when Dynamo traced with
    symbolic sizes, and run eagerly when written inputs alias each other."""

    def __init__(self, gm: torch.fx.GraphModule, name: str, fallback: Callable[[Any], Callable]) -> None:
        self.gm = gm
        self.name = name
        self._fallback_factory = fallback
        self._compiled: dict[tuple, Any] = {}

    def compile_for(self, args) -> Any:
        # The precision mode keys the program too: Dynamo does not guard torch_tpu.precision.
        key = (current_mode(), *((tuple(a.shape), a.dtype, a.stride()) if isinstance(a, torch.Tensor) else (type(a), a)
                                 for a in args))
        fn = self._compiled.get(key)
        if fn is None:
            try:
                fn = compile_inplace_graph(capture_aten(self.gm, list(args)), self.name)
            except (LoweringError, TorchTpuCompileError, *_DATA_DEPENDENT) as err:
                reason = str(err).splitlines()[0] if isinstance(err, _DATA_DEPENDENT) else err
                log_once(f"fallback-{type(err).__name__}-{self.name}",
                         "torch_tpu: functionalize='torchtpu' cannot compile graph %s (%s); using "
                         "aot_autograd's functionalization for it", self.name, reason)
                try:
                    fn = self._fallback_factory(args)
                except _DATA_DEPENDENT as again:
                    # Never an error at call time: the graph runs in eager instead.
                    log_once(f"eager-{self.name}", "torch_tpu: graph %s cannot be traced (%s); it runs "
                             "in PyTorch eager", self.name, type(again).__name__)
                    fn = self.gm
            self._compiled[key] = fn
        return fn

    def __call__(self, *args):
        fn = self.compile_for(args)
        if isinstance(fn, InPlaceCompiledGraph) and _storages_overlap(args, fn.written):
            log_once(f"overlap-{self.name}",
                     "torch_tpu: graph %s writes an input that shares memory with another input; "
                     "this call runs in PyTorch eager", self.name)
            return self.gm(*args)
        return fn(*args)
