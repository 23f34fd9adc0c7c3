"""Python custom ops in compiled graphs: a custom op (`torch.library.custom_op`, or a
`torch.library.Library` def + impl) that has no lowering is replaced, before the graph is
imported, by the ATen ops of its implementation, so it compiles with the rest of the graph
instead of running in PyTorch eager.

The expansion runs on the ATen graphs aot_autograd hands the compilers, after autograd:
the backward graph already holds what the op's `register_autograd` backward calls (its
own ops, other custom ops), so a custom backward is honoured, never re-derived.

How an op is expanded, first match wins:

1. its *ATen equivalent* (`ATEN_EQUIVALENTS`): third-party ops whose Python implementation
   cannot be traced (it loops over `offs.tolist()`, say) but that compute an ATen op;
2. its implementation, traced: the kernel registered for `CompositeExplicitAutograd` or
   `CPU` (where custom_op puts a Python implementation) run under `make_fx` on the node's
   fake tensors, functionalized and decomposed with the compiler's table, so the result is
   the same kind of graph aot_autograd produces.

An implementation that cannot be traced (it reads values: `.item()`, `.tolist()`, numpy,
non-torch code, a C++ kernel reading data pointers) leaves the node as it is: it runs in
PyTorch eager, logged with the reason (`_fallback_reasons.CUSTOM_OP`). An op that has a
lowering (the built-in table, `torch_tpu.register_lowering`, `torch_tpu::` ops) is never
expanded.
"""

from __future__ import annotations

import operator
import re
from typing import Any, Callable

import torch
import torch.fx
import torch.utils._pytree as pytree

from torch_tpu.compiler.importer import is_supported

from . import _fallback_reasons as fallback_reasons
from ._fallback_reasons import FallbackReason


aten = torch.ops.aten

# Namespaces whose ops are PyTorch's own or torch_tpu's: lowered or left alone, never traced.
_NOT_CUSTOM = frozenset({"aten", "prims", "higher_order", "_c10d_functional", "c10d", "c10d_functional",
                         "_dtensor", "torch_tpu", "profiler", "inductor"})
# Where a Python implementation is registered (custom_op: CompositeExplicitAutograd
# without device_types, the device's key with them).
_IMPLEMENTATION_KEYS = (torch._C.DispatchKey.CompositeExplicitAutograd, torch._C.DispatchKey.CPU)
# A node's expansion may hold custom ops again (an implementation calling another custom op).
_MAX_NESTING = 8
# node.meta key: why this node's implementation could not be traced (so a recompile of the
# same graph, at another precision mode say, does not trace it again).
_UNTRACEABLE = "torch_tpu_untraceable_custom_op"


# -- ATen equivalents -----------------------------------------------------------------------
def _transformers_grouped_mm(graph: "_Builder", input, weight, offs):
    # transformers/integrations/moe.py: (S, K) x (E, K, N) with offs (E,) of group ends.
    return graph.call(aten._grouped_mm.default, (input, weight, offs), graph.val)


def _transformers_grouped_mm_backward(graph: "_Builder", input, weight, offs, grad_output):
    # grad_input (S, K) = grad_output (S, N) x weight^T (E, N, K), rows grouped by offs;
    # grad_weight (E, K, N) = input^T (K, S) x grad_output (S, N), the contraction S grouped.
    grad_input_val, grad_weight_val = graph.val
    weight_t = graph.call(aten.transpose.int, (weight, 1, 2))
    grad_input = graph.call(aten._grouped_mm.default, (grad_output, weight_t, offs), grad_input_val)
    input_t = graph.call(aten.t.default, (input,))
    grad_weight = graph.call(aten._grouped_mm.default, (input_t, grad_output, offs), grad_weight_val)
    return grad_input, grad_weight


# Qualified op name -> builder(graph, *args) of its ATen form (results given the custom op's
# own metadata: PyTorch's meta kernel of aten._grouped_mm accepts only bfloat16, while our
# lowering and the op take float32 too). Keyed by name: the library need not be imported.
ATEN_EQUIVALENTS: dict[str, Callable[..., Any]] = {
    "transformers::grouped_mm_fallback": _transformers_grouped_mm,
    "transformers::grouped_mm_fallback_backward": _transformers_grouped_mm_backward,
}


class _Builder:
    """Inserts an equivalent's nodes before the custom op's node; `val` is that node's
    result metadata."""

    def __init__(self, graph: torch.fx.Graph, node: torch.fx.Node) -> None:
        self.graph, self.node, self.val = graph, node, node.meta.get("val")

    def call(self, op, args: tuple, val: Any = None) -> torch.fx.Node:
        if val is None:
            metas = torch.fx.node.map_arg(args, lambda a: a.meta["val"])
            val = op(*metas)
        new = self.graph.call_function(op, args)
        new.meta.update({k: v for k, v in self.node.meta.items() if k in ("stack_trace", "nn_module_stack")})
        new.meta["val"] = val
        return new


# -- expansion ------------------------------------------------------------------------------
def is_custom_op(target: Any) -> bool:
    return isinstance(target, torch._ops.OpOverload) and target.namespace not in _NOT_CUSTOM


def expand_custom_ops(gm: torch.fx.GraphModule) -> dict[str, FallbackReason]:
    """Replaces, in place, each custom op of `gm` without a lowering by its ATen expansion;
    returns the nodes left to run in eager, by name, with the reason."""
    untraceable: dict[str, FallbackReason] = {}
    changed = False
    for _ in range(_MAX_NESTING):
        pending = [n for n in gm.graph.nodes
                   if n.op == "call_function" and is_custom_op(n.target) and not is_supported(n)
                   and n.name not in untraceable]
        if not pending:
            break
        for node in pending:
            reason = node.meta.get(_UNTRACEABLE) or _expand(gm, node)
            if reason is None:
                changed = True
            else:
                node.meta[_UNTRACEABLE] = reason
                untraceable[node.name] = reason
    if changed:
        gm.graph.lint()
        gm.recompile()
    return untraceable


def _expand(gm: torch.fx.GraphModule, node: torch.fx.Node) -> FallbackReason | None:
    """Expands `node` in place; the reason it cannot be, else None."""
    equivalent = ATEN_EQUIVALENTS.get(node.target._schema.name)
    if equivalent is not None:
        with gm.graph.inserting_before(node):
            result = equivalent(_Builder(gm.graph, node), *node.args, **node.kwargs)
        _replace_uses(node, result)
        return None
    implementation = _implementation(node.target)
    if implementation is None:
        return FallbackReason(fallback_reasons.CUSTOM_OP, "it has no Python implementation (CompositeExplicitAutograd "
                                                          "or CPU kernel) to trace")
    try:
        traced, inputs = _trace(implementation, node)
    except Exception as err:  # noqa: BLE001 - any failure to trace means: run it in eager
        return FallbackReason(fallback_reasons.CUSTOM_OP, f"its implementation cannot be traced: "
                                                          f"{type(err).__name__}: {_first_line(err)}")
    _inline(gm, node, traced, inputs)
    return None


def _implementation(op: torch._ops.OpOverload) -> Callable | None:
    """The op's CPU kernel (its own, or the CompositeExplicitAutograd one the CPU key
    computes to), called directly: dispatching the op again would only record it again.
    None unless it is a Python kernel: a C++ kernel may read the data pointers of the fake
    tensors it would be traced on (null: a crash, not an error)."""
    if not any(torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), key) for key in _IMPLEMENTATION_KEYS):
        return None
    cpu = torch._C.DispatchKey.CPU
    kernel = torch._C._dispatch_get_computed_kernel_for_dispatch_key(op.name(), cpu)
    if not re.search(r"\.py:\d+'?\)?$", repr(kernel)):  # "registered at /path/file.py:123"
        return None
    keyset = torch._C.DispatchKeySet(cpu)
    return lambda *args, **kwargs: kernel.call_boxed(keyset, *args, **kwargs)


def _trace(implementation: Callable, node: torch.fx.Node) -> tuple[torch.fx.GraphModule, list[torch.fx.Node]]:
    """The implementation traced on the node's fake arguments: a functional ATen graph
    whose placeholders are `inputs` (the node's FX-node arguments, in order)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from torch_tpu.compiler.lowering.decompositions import decomposition_table

    leaves, spec = pytree.tree_flatten((node.args, node.kwargs))
    positions = [i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.fx.Node)]
    inputs = [leaves[i] for i in positions]

    def call(*values):
        filled = list(leaves)
        for i, value in zip(positions, values):
            filled[i] = value
        args, kwargs = pytree.tree_unflatten(filled, spec)
        return implementation(*args, **kwargs)

    metas = [n.meta["val"] for n in inputs]
    symbolic = any(isinstance(v, torch.SymInt) or (isinstance(v, torch.Tensor) and _has_symbolic_size(v))
                   for v in metas)
    mode = "symbolic" if symbolic else "fake"
    # The user's code runs on fake tensors themselves, which refuse data access (.numpy(),
    # .item()); under torch.func.functionalize's wrappers .numpy() would read garbage.
    traced = make_fx(call, decomposition_table=decomposition_table(), tracing_mode=mode)(*metas)
    if _mutates(traced):
        # Then functionalize the recorded ATen ops (no user code runs again).
        traced = make_fx(torch.func.functionalize(traced), decomposition_table=decomposition_table(),
                         tracing_mode=mode)(*metas)
    return traced, inputs


def _mutates(gm: torch.fx.GraphModule) -> bool:
    return any(isinstance(n.target, torch._ops.OpOverload) and n.target._schema.is_mutable
               for n in gm.graph.nodes if n.op == "call_function")


def _has_symbolic_size(value: torch.Tensor) -> bool:
    return any(isinstance(d, torch.SymInt) for d in value.shape)


def _inline(gm: torch.fx.GraphModule, node: torch.fx.Node, traced: torch.fx.GraphModule,
            inputs: list[torch.fx.Node]) -> None:
    placeholders = [n for n in traced.graph.nodes if n.op == "placeholder"]
    env: dict[torch.fx.Node, Any] = dict(zip(placeholders, inputs))
    # Constants the implementation made (torch.tensor(...)) move to the parent module.
    for const in [n for n in traced.graph.nodes if n.op == "get_attr"]:
        name = _free_attribute(gm, f"_{node.name}_{const.target}")
        setattr(gm, name, getattr(traced, const.target))
        const.target = name
    with gm.graph.inserting_before(node):
        result = gm.graph.graph_copy(traced.graph, env)
    inserted = [new for old, new in env.items() if old not in placeholders]
    for new in inserted:
        # Errors in the expansion name the user's line that called the custom op.
        for key in ("stack_trace", "nn_module_stack"):
            if key in node.meta:
                new.meta[key] = node.meta[key]
    _replace_uses(node, result)
    # What the implementation computed and did not use (the empty tensor an in-place
    # write filled, before functionalization): only the inserted nodes, the rest of the
    # graph is not ours to prune.
    for new in reversed(inserted):
        if not new.users and not new.is_impure():
            gm.graph.erase_node(new)


def _free_attribute(gm: torch.fx.GraphModule, base: str) -> str:
    name, k = base, 0
    while hasattr(gm, name):
        k += 1
        name = f"{base}_{k}"
    return name


def _replace_uses(node: torch.fx.Node, result: Any) -> None:
    """Points the users of `node` at `result` (a node, or a tuple/list of them that
    `getitem` users index) and erases `node`."""
    if isinstance(result, torch.fx.Node):
        node.replace_all_uses_with(result)
    else:
        for user in list(node.users):
            if user.op != "call_function" or user.target is not operator.getitem:
                raise AssertionError(f"torch_tpu: a user of custom op {node.target} reads its results "
                                     f"other than by getitem ({user.format_node()})")
            user.replace_all_uses_with(result[user.args[1]])
            node.graph.erase_node(user)
    node.graph.erase_node(node)


def _first_line(err: Exception) -> str:
    text = str(err).strip()
    return text.splitlines()[0].rstrip(".") if text else "(no message)"
