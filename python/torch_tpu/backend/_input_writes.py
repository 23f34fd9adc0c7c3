"""A graph's writes into its inputs, as results written back by the caller.

aot_autograd keeps an inference graph's data mutations of its inputs in the graph
(`keep_inference_input_mutations=True`, as inductor does), and a training forward's of
inputs that need no gradient (BatchNorm's running statistics), as `copy_(input, new
value)` nodes at its end. The program cannot write a caller's tensor, so those nodes become extra
results, and the compiled graph's caller `copy_`s each into its input: on tpu tensors a
`copy_` of a whole dense value shares the result's buffer (no program,
`device/_copy.py`); on host tensors it is the host copy aot_autograd's epilogue made.

What this saves over aot_autograd's epilogue (a decode step writing 32 KV caches, an
optimizer step writing every parameter and state): the graph no longer needs aot_autograd's
runtime wrappers (`_wrappers_are_noops`), so Dynamo calls it directly.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch


def take_input_writes(gm: torch.fx.GraphModule) -> list[int]:
    """Turns the `copy_(placeholder, value)` nodes of `gm` into extra outputs (after the
    graph's own) and returns the written placeholders' input positions, one per extra
    output. A node after a copy that reads the written input reads the new value."""
    copy_ = torch.ops.aten.copy_.default
    positions = {n: i for i, n in enumerate(n for n in gm.graph.nodes if n.op == "placeholder")}
    writes = [n for n in gm.graph.nodes if n.op == "call_function" and n.target is copy_ and n.args[0] in positions]
    if not writes:
        return []
    output = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    written, values = [], []
    for node in writes:
        target, value = node.args[0], node.args[1]
        if positions[target] in written:
            raise AssertionError(f"aot_autograd wrote input {target.name} twice")  # it writes each once
        for user in list(target.users):
            if order[user] > order[node]:
                user.replace_input_with(target, value)  # reads after the write see the new value
        node.replace_all_uses_with(value)
        gm.graph.erase_node(node)
        written.append(positions[target])
        values.append(value)
    output.args = (tuple(output.args[0]) + tuple(values),)
    gm.recompile()
    return written


def written_values(gm: torch.fx.GraphModule, written: Sequence[int]) -> list[tuple[torch.fx.Node, Any]]:
    """(the written placeholder, the output node or value of its new value) per input of
    `written`, as `take_input_writes` left them: the graph's last outputs, in that order.
    The one reader of that convention for the graph's other users (`_compile.donated_writes`)."""
    if not written:
        return []
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    output = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    values = list(output.args[0])[-len(written):]
    return [(placeholders[position], value) for position, value in zip(written, values)]


def with_input_writes(compiled: Callable[..., Sequence[Any]], written: list[int]) -> Callable[..., list]:
    """`compiled`, whose last results are the new values of the inputs at `written`,
    writing them into those inputs and returning the graph's own results. A result that
    is the input itself was written by `compiled` already (a compiled graph on tpu
    tensors gives the input's storage the result's buffer, as this `copy_` would:
    `CompiledGraph.input_writes`)."""
    count = len(written)

    def call(*args: Any) -> list:
        results = list(compiled(*args))
        own = len(results) - count
        with torch.no_grad():
            for position, value in zip(written, results[own:]):
                target = args[position]
                if value is not target:
                    target.copy_(value)
        return results[:own]

    return call
