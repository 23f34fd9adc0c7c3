"""Stand-alone collective programs: one `torchtpu.collective` in a module of its own,
lowered by `torchtpu-lower-collectives` -- the "thin collective" modules an eager
process group (`tpu_dist`) runs between the device's own programs.

The program runs as `group_size` replicas (one per process of the group), so its replica
group is 0..group_size-1 whatever the processes' global ranks: every member compiles
byte-identical text, and the text depends only on (kind, shape, element type, reduce op,
group size, src/pairs). Broadcasts lower through all-gather and bitwise reductions
through bytes, which every backend has (XLA:CPU lacks collective-broadcast and
and/or/xor all-reduce).
"""

from __future__ import annotations

from collections.abc import Sequence

from .context import ir, make_context
from .diagnostics import DiagnosticEngine
from .pipeline import run_pipeline
from .pipelines import named_pipeline

# The named pipeline the collective is lowered with (`torchtpu-collective-pipeline`).
PIPELINE = "torchtpu-collective-pipeline"


class CollectiveProgramError(ValueError):
    """A collective no program can express (the message says why)."""


def _type(shape: Sequence[int], element: str) -> str:
    return f"tensor<{'x'.join(str(int(d)) for d in shape)}{'x' if shape else ''}{element}>"


def result_shape(kind: str, shape: Sequence[int], group_size: int, dim: int = 0) -> list[int]:
    out = [int(d) for d in shape]
    if kind == "all_gather":
        out[dim] *= group_size
    elif kind == "reduce_scatter":
        out[dim] //= group_size
    return out


def collective_source(
    kind: str,
    shape: Sequence[int],
    element: str,
    group_size: int,
    *,
    reduce_op: str | None = None,
    src: int | None = None,
    pairs: Sequence[tuple[int, int]] | None = None,
    dim: int = 0,
) -> str:
    """The text of `@main(x) -> y` holding one `torchtpu.collective` over replicas
    0..group_size-1, before `torchtpu-collective-pipeline` lowers it. kind: all_reduce,
    all_gather, reduce_scatter, all_to_all, broadcast (src = the source's index) or
    permute (pairs of replica indices)."""
    members = ", ".join(str(i) for i in range(group_size))
    attrs = [f'kind = "{kind}"']
    if kind == "permute":
        rows = ", ".join(f"[{a}, {b}]" for a, b in pairs or ())
        attrs.append(f"source_target_pairs = dense<[{rows}]> : tensor<{len(pairs or ())}x2xi64>")
    else:
        attrs.append(f"replica_groups = dense<[[{members}]]> : tensor<1x{group_size}xi64>")
        attrs.append(f"group_ranks = array<i64: {members}>")
    if reduce_op is not None:
        attrs.append(f'reduce_op = "{reduce_op}"')
    if src is not None:
        attrs.append(f"src = {int(src)} : i64")
    if dim:
        attrs.append(f"dim = {int(dim)} : i64")
    in_t = _type(shape, element)
    out_t = _type(result_shape(kind, shape, group_size, dim), element)
    return (
        f"func.func @main(%x: {in_t}) -> {out_t} {{\n"
        f'  %y = "torchtpu.collective"(%x) {{{", ".join(attrs)}}} : ({in_t}) -> {out_t}\n'
        f"  return %y : {out_t}\n}}\n"
    )


def rejection(engine: DiagnosticEngine) -> CollectiveProgramError:
    """The error of a collective the pipeline rejected: its first diagnostic."""
    return CollectiveProgramError(engine.errors[0].message if engine.errors else "the lowering failed")


def program_text(module) -> str:
    """The lowered module as every process of the group compiles it (no locations)."""
    return module.operation.get_asm(enable_debug_info=False)


def collective_module(kind: str, shape: Sequence[int], element: str, group_size: int, **params) -> str:
    """StableHLO text of `@main(x) -> y` doing one collective over replicas 0..group_size-1:
    `collective_source` lowered by `torchtpu-collective-pipeline`."""
    text = collective_source(kind, shape, element, group_size, **params)
    ctx = make_context()
    with ctx, ir.Location.unknown():
        module = ir.Module.parse(text)
        engine = DiagnosticEngine()
        if not run_pipeline(module.operation, named_pipeline(PIPELINE), engine):
            raise rejection(engine)
        return program_text(module)
