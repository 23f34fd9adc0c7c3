"""The named pipelines programs are compiled with (`compiler/pipelines.py`), spelled once.

Every program kind runs a registered pipeline by name, so the `pipeline.txt` its dump
records is what `torchtpu-opt` replays. The precision mode in force is an option of the
pipelines that touch matrix ops; collective programs have none.
"""

from __future__ import annotations

import functools


def named_pipeline(argument: str, **options: object) -> str:
    # The compiler is imported when a program is first built, not with the device.
    from torch_tpu.compiler.pipelines import named_pipeline as invocation

    return invocation(argument, **options)


@functools.lru_cache(maxsize=None)  # a pure function of its arguments, asked per program use
def compile_pipeline(mode: str, bounds: str = "none", elide_roundings: bool = False) -> str:
    """`torchtpu-compile-pipeline`: compiled FX graphs (`elide_roundings`: torch.compile's
    rule for 16-bit intermediates, `backend._compile.elides_roundings`), eager single ops,
    jax_ops."""
    return named_pipeline("torchtpu-compile-pipeline", precision=mode, bounds=bounds,
                          elide_roundings=elide_roundings)


@functools.lru_cache(maxsize=None)  # a pure function of its arguments, asked per program use
def export_pipeline(mode: str, bounds: str = "none") -> str:
    """`torchtpu-export-pipeline`: the compile pipeline, CHLO legalized (portable artifacts)."""
    return named_pipeline("torchtpu-export-pipeline", precision=mode, bounds=bounds)


@functools.lru_cache(maxsize=None)  # a pure function of its arguments, asked per program use
def views_pipeline(mode: str) -> str:
    """`torchtpu-views-pipeline`: graphs imported with references and views."""
    return named_pipeline("torchtpu-views-pipeline", precision=mode)


@functools.lru_cache(maxsize=None)  # a pure function of its arguments, asked per program use
def collective_pipeline() -> str:
    """`torchtpu-collective-pipeline`: a stand-alone collective program (`tpu_dist`)."""
    return named_pipeline("torchtpu-collective-pipeline")


# A module compiled as it is (a fused trace stitched from modules that each ran their
# pipeline already): the empty pipeline, which torchtpu-opt replays as the identity.
NO_PASSES = "builtin.module()"


def in_sequence(*pipelines: str) -> str:
    """One pipeline running `pipelines` (each `builtin.module(...)`) one after the other:
    a tpu_dist graph's compile pipeline, then its SPMD pipeline, replayed as one."""
    prefix = "builtin.module("
    inner = [p[len(prefix):-1] if p.startswith(prefix) and p.endswith(")") else p for p in pipelines]
    return prefix + ",".join(i for i in inner if i) + ")"
