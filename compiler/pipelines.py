"""Named pipelines: the pass sequences torch_tpu runs, registered by name like passes.

The way torch-mlir registers `torch-backend-to-stablehlo-backend-pipeline`: each
pipeline has a flag name, a summary, a description and typed options, and expands to
a list of passes. The frontend names them (`builtin.module(torchtpu-compile-pipeline{
precision=high})`), so the text a dump records is what `torchtpu-opt` replays, and
the sequences are defined here only. `torchtpu-opt --help`/`--list-passes` and
`docs/reference/passes.md` list them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .passes.base import Option, PassOptionError, parse_option_string

_PRECISION = Option(
    "precision", str, "medium", "float32 matmul precision (torch.set_float32_matmul_precision)",
    choices=("medium", "high", "highest"),
)
_BOUNDS = Option(
    "bounds", str, "none",
    "bounded dynamism: none (static graph), annotate (bounded types), materialize (padded "
    "static buffers + size arguments, every platform today)",
    choices=("none", "annotate", "materialize"),
)
_ELIDE_ROUNDINGS = Option(
    "elide-roundings", bool, False,
    "torch.compile's rule for 16-bit intermediates, as inductor's unless "
    "torch._inductor.config.emulate_precision_casts: 16-bit arithmetic on 16-bit values as 16-bit ops "
    "(torchtpu-narrow-opmath), then intermediates widened again read unrounded (torchtpu-elide-roundings)",
)


@dataclass(frozen=True)
class NamedPipeline:
    argument: str
    summary: str
    description: str
    options: tuple[Option, ...]
    steps: Callable[..., list[str]]

    def parse_options(self, text: str) -> dict[str, Any]:
        values = {o.name: o.default for o in self.options}
        values.update(parse_option_string(self.argument, self.options, text))
        return values

    def expand(self, option_text: str = "") -> list[str]:
        """The pipeline's passes (each in textual pipeline syntax) for `option_text`."""
        values = self.parse_options(option_text)
        return self.steps(**{k.replace("-", "_"): v for k, v in values.items()})

    def invocation(self, **options: Any) -> str:
        """`builtin.module(<argument>{k=v ...})`: the pipeline as the frontend runs it and a
        dump records it. Options equal to their defaults are left out."""
        declared = {o.name.replace("-", "_"): o for o in self.options}
        unknown = set(options) - declared.keys()
        if unknown:
            raise PassOptionError(f"{self.argument}: unknown option(s) {', '.join(sorted(unknown))}")
        parts = []
        for key, value in options.items():
            option = declared[key]
            if value == option.default:
                continue
            text = str(value).lower() if isinstance(value, bool) else str(value)
            option.convert(self.argument, text)  # validates choices and types
            parts.append(f"{option.name}={text}")
        inner = self.argument + ("{" + " ".join(parts) + "}" if parts else "")
        return f"builtin.module({inner})"


PIPELINE_REGISTRY: dict[str, NamedPipeline] = {}


def register_pipeline(argument: str, summary: str, description: str, options: tuple[Option, ...] = ()):
    def register(steps: Callable[..., list[str]]) -> Callable[..., list[str]]:
        if argument in PIPELINE_REGISTRY:
            raise ValueError(f"pipeline '{argument}' registered twice")
        PIPELINE_REGISTRY[argument] = NamedPipeline(argument, summary, description, options, steps)
        return steps

    return register


def named_pipeline(argument: str, **options: Any) -> str:
    """The textual pipeline that runs the named pipeline `argument` with `options`."""
    return PIPELINE_REGISTRY[argument].invocation(**options)


def _bounds_steps(bounds: str) -> list[str]:
    return {
        "none": [],
        "annotate": ["torchtpu-annotate-bounds"],
        "materialize": ["torchtpu-annotate-bounds", "torchtpu-materialize-bounds"],
    }[bounds]


def _unflatten_step(bounds: str) -> list[str]:
    # Static graphs only: the bounds passes propagate sizes through the flattening reshapes
    # PyTorch wrote, which the rewrite would replace.
    return ["torchtpu-unflatten-dots"] if bounds == "none" else []


def _precision_step(precision: str) -> str:
    # PyTorch's precision setting is authoritative for every float32 matrix op of a graph, so it
    # overrides what a lowering chose (ops marked torchtpu.fixed_precision keep theirs).
    return f"torchtpu-set-precision{{mode={precision} override=true}}"


@register_pipeline(
    "torchtpu-compile-pipeline",
    "What torch.compile(backend=\"tpu\") runs on an imported graph",
    "Verifies the `torchtpu` ops, computes 64-bit integer iotas as 32-bit ones converted "
    "(`torchtpu-narrow-iotas`: XLA:TPU emulates 64-bit integers), gives the matrix products of static graphs the dims PyTorch "
    "flattened for `mm` back (`torchtpu-unflatten-dots`), applies PyTorch's float32 matmul precision to "
    "every float32 matrix op (`torchtpu-set-precision{override=true}`) and, for graphs with dynamic dimensions, "
    "makes the bounds explicit (`torchtpu-annotate-bounds`, and `torchtpu-materialize-bounds` "
    "for runtimes without bounded-dynamic parameters). With `elide-roundings=true` (what "
    "torch.compile runs) it writes 16-bit arithmetic on 16-bit values as 16-bit ops, so that "
    "XLA decides which 16-bit results it stores (`torchtpu-narrow-opmath`), and reads the other 16-bit "
    "intermediates that the next op widens again unrounded (`torchtpu-elide-roundings`). "
    "The output keeps CHLO: XLA expands "
    "ops such as `chlo.top_k` better than the generic legalization.",
    (_PRECISION, _BOUNDS, _ELIDE_ROUNDINGS),
)
def _compile(precision: str, bounds: str, elide_roundings: bool = False) -> list[str]:
    return ["torchtpu-verify", "torchtpu-narrow-iotas", *_unflatten_step(bounds), _precision_step(precision),
            *(["torchtpu-narrow-opmath", "torchtpu-elide-roundings"] if elide_roundings else []),
            *_bounds_steps(bounds)]


@register_pipeline(
    "torchtpu-export-pipeline",
    "What torch_tpu.export runs: the compile pipeline, then CHLO legalized to StableHLO",
    "`torchtpu-compile-pipeline` followed by `func.func(chlo-legalize-to-stablehlo)`, so the "
    "exported module is pure StableHLO and serializes as a portable (VHLO) artifact.",
    (_PRECISION, _BOUNDS),
)
def _export(precision: str, bounds: str) -> list[str]:
    return [*_compile(precision, bounds), "func.func(chlo-legalize-to-stablehlo)"]


@register_pipeline(
    "torchtpu-views-pipeline",
    "What options={\"functionalize\": \"torchtpu\"} runs: view semantics resolved, then compiled",
    "For graphs imported with references and views (non-functional import): "
    "`torchtpu-inline` (a jax_op's merged functions: the view passes do not look through "
    "calls), `torchtpu-decompose-views`, `torchtpu-inverse-views` (pure StableHLO out, written "
    "arguments aliased to results), a second `torchtpu-verify`, then `torchtpu-narrow-iotas`, "
    "`torchtpu-unflatten-dots` and precision as in `torchtpu-compile-pipeline`.",
    (_PRECISION,),
)
def _views(precision: str) -> list[str]:
    return [
        "torchtpu-verify", "torchtpu-inline", "torchtpu-decompose-views", "torchtpu-inverse-views", "torchtpu-verify",
        "torchtpu-narrow-iotas", *_unflatten_step("none"), _precision_step(precision),
    ]


@register_pipeline(
    "torchtpu-spmd-pipeline",
    "What torch_tpu.spmd runs on a per-device program: collectives lowered, optionally outlined",
    "`torchtpu-inline` (modules from JAX hold calls), `torchtpu-lower-collectives` with the "
    "given options and, with `thin=true`, `torchtpu-outline-collectives` (each collective its "
    "own module).",
    (
        Option("thin", bool, True, "outline each collective into its own function"),
        Option("broadcast", str, "collective_broadcast", "how broadcasts are lowered",
               choices=("collective_broadcast", "all_gather")),
        Option("bitwise", str, "native", "how bitwise reductions are lowered", choices=("native", "bytes")),
        Option("global-device-ids", bool, False, "replica groups hold global device ids"),
    ),
)
def _spmd(thin: bool, broadcast: str, bitwise: str, global_device_ids: bool) -> list[str]:
    lower = (
        f"torchtpu-lower-collectives{{broadcast={broadcast} bitwise={bitwise} "
        f"global-device-ids={str(global_device_ids).lower()}}}"
    )
    return ["torchtpu-verify", "torchtpu-inline", lower, *(["torchtpu-outline-collectives"] if thin else [])]


@register_pipeline(
    "torchtpu-partition-pipeline",
    "What torch_tpu.spmd.ShardedProgram runs: a sharded single-device program to the per-device program",
    "`torchtpu-inline` (the partitioner does not look through calls), then "
    "`torchtpu-insert-collectives` on the `sdy` shardings.",
)
def _partition() -> list[str]:
    return ["torchtpu-verify", "torchtpu-inline", "torchtpu-insert-collectives"]


@register_pipeline(
    "torchtpu-collective-pipeline",
    "What a tpu_dist collective program runs: its one `torchtpu.collective` lowered for every backend",
    "`torchtpu-lower-collectives` with broadcasts lowered through all-gather and bitwise "
    "reductions through bytes, which every backend has (XLA:CPU lacks collective-broadcast and "
    "and/or/xor all-reduce), so every process of a group compiles byte-identical text "
    "(`compiler/collective_programs.py`).",
)
def _collective() -> list[str]:
    return ["torchtpu-verify", "torchtpu-lower-collectives{broadcast=all_gather bitwise=bytes}"]
