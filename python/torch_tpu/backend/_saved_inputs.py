"""Saved tensors that are graph inputs leave the forward program.

The min-cut partitioner saves a training graph's weights themselves for the backward
(instead of a transposed copy). A program result that is one of its parameters is a copy
in XLA (an entry output never shares its buffer with an entry parameter that is not
donated), so the forward would write every weight again on each step: ~0.9 GB, 2.2 ms of
a 495 M-parameter Llama step on a TPU v5e. Inductor returns such inputs as they are; so
do we: the forward graph's saved outputs that are its own (tensor) inputs are taken out
of the program and the caller's input object is put back in their place.

Only saved positions (after the outputs the user sees) are touched: the backward reads
them and nobody writes them, so handing over the input object is what PyTorch's own
compiled graphs do; user-visible outputs keep their fresh results.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from ..program.output_layout import VISIBLE_OUTPUTS


def take_saved_inputs(gm: torch.fx.GraphModule) -> list[tuple[int, int]]:
    """Removes the saved outputs of an aot_autograd forward graph that are tensor inputs
    of the graph; returns (output position, input position) of each removed output, in
    output order (empty, and the graph untouched, where there is none)."""
    visible = gm.meta.get(VISIBLE_OUTPUTS)
    if not isinstance(visible, int):
        return []
    placeholders = {n: i for i, n in enumerate(n for n in gm.graph.nodes if n.op == "placeholder")}
    output = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    results = list(output.args[0])
    taken = [(k, placeholders[r]) for k, r in enumerate(results)
             if k >= visible and r in placeholders and isinstance(r.meta.get("val"), torch.Tensor)]
    if taken:
        dropped = {k for k, _ in taken}
        output.args = (type(output.args[0])(r for k, r in enumerate(results) if k not in dropped),)
        gm.recompile()
    return taken


def with_saved_inputs(compiled: Callable[..., Sequence[Any]], taken: list[tuple[int, int]]) -> Callable[..., list]:
    """`compiled` with the outputs `take_saved_inputs` removed put back: each is the
    argument at its input position."""

    def call(*args: Any) -> list:
        results = list(compiled(*args))
        for position, argument in taken:  # in output order: earlier positions are final
            results.insert(position, args[argument])
        return results

    return call
