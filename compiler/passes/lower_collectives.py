"""torchtpu-lower-collectives: `torchtpu.collective` -> StableHLO collectives."""

from __future__ import annotations

from ..context import ir
from ..diagnostics import DiagnosticEngine
from ..dialect import TORCHTPU
from ..dialect.collective_ops import dense_i64_matrix
from ..dialect.verifier import verify_op
from . import _collective_builders as build
from .base import Option, Pass, ops_named, register_pass


@register_pass
class LowerCollectivesPass(Pass):
    argument = "torchtpu-lower-collectives"
    summary = "Lower torchtpu.collective to StableHLO collectives with the full replica-group partition"
    description = (
        "Each `torchtpu.collective` becomes `stablehlo.all_reduce`, `all_gather`, "
        "`reduce_scatter`, `all_to_all`, `collective_permute` or `collective_broadcast` "
        "with the op's complete `replica_groups` partition (every subgroup, also those "
        "this rank is not in). Reduce ops: sum, avg (sum, then "
        "a division by the group's size, looked up by rank for uneven groups), product, "
        "min, max, band, bor, bxor, each where PyTorch defines it for the element type "
        "(bool: sum/max = or, product/min = and). `premul_sum`, bitwise ops on floats, "
        "min/max on complex numbers and all-gather / reduce-scatter / all-to-all over "
        "groups of different sizes are located errors. By default the groups are "
        "replica ids (the program runs as N replicas; no channel handles); with "
        "`global-device-ids=true` they are global device ids: every collective gets a "
        "fresh channel handle and `use_global_device_ids` (programs run as SPMD "
        "partitions). `broadcast=all_gather` "
        "expresses a broadcast as an all-gather plus a slice, for backends without "
        "collective-broadcast (XLA:CPU). `bitwise=bytes` reduces integers' bits as one "
        "byte per bit with min/max/sum (XLA:CPU has no and/or/xor all-reduce or "
        "reduce-scatter); bool "
        "and/or/xor always go through bytes this way."
    )
    options = (
        Option("global-device-ids", bool, False, "replica groups hold global device ids (SPMD partitions)"),
        Option(
            "broadcast", str, "collective_broadcast", "how to express a broadcast",
            choices=("collective_broadcast", "all_gather"),
        ),
        Option(
            "bitwise", str, "native", "how to express band/bor/bxor all-reduces of integers",
            choices=("native", "bytes"),
        ),
    )

    def run(self, module: ir.Operation) -> None:
        collectives = ops_named(module, "torchtpu.collective")
        channels = build.ChannelAllocator.for_module(module)
        spec = TORCHTPU.lookup("torchtpu.collective")
        for op in collectives:
            check = DiagnosticEngine()
            if not verify_op(op, spec, check):
                self.error(op, f"malformed op: {check.errors[0].message}")
                continue
            try:
                with ir.InsertionPoint(op), op.location:
                    result = self._lower(op, channels)
            except build.CollectiveError as err:
                self.error(op, f"{_describe(op)}: {err}")
                continue
            op.result.replace_all_uses_with(result)
            op.erase()

    def _lower(self, op: ir.Operation, channels: build.ChannelAllocator) -> ir.Value:
        attrs = op.attributes
        kind = ir.StringAttr(attrs["kind"]).value
        value = op.operands[0]
        global_ids = self.global_device_ids
        if kind == "permute":
            return build.collective_permute(value, dense_i64_matrix(attrs["source_target_pairs"]), channels, global_ids)
        groups = dense_i64_matrix(attrs["replica_groups"])
        dim = ir.IntegerAttr(attrs["dim"]).value if "dim" in attrs else 0
        reduce_op = ir.StringAttr(attrs["reduce_op"]).value if "reduce_op" in attrs else None
        if kind == "all_reduce":
            return build.all_reduce(value, reduce_op, groups, channels, global_ids, self.bitwise)
        if kind == "all_gather":
            return build.all_gather(value, dim, groups, channels, global_ids)
        if kind == "reduce_scatter":
            return build.reduce_scatter(value, reduce_op, dim, groups, channels, global_ids, self.bitwise)
        if kind == "all_to_all":
            return build.all_to_all(value, dim, groups, channels, global_ids)
        if kind == "broadcast":
            src = ir.IntegerAttr(attrs["src"]).value
            return build.broadcast(value, src, groups, channels, self.broadcast, global_ids)
        raise build.CollectiveError(f"unknown collective kind '{kind}'")


def _describe(op: ir.Operation) -> str:
    attrs = op.attributes
    kind = ir.StringAttr(attrs["kind"]).value if "kind" in attrs else "?"
    text = f"torchtpu.collective '{kind}'"
    if "reduce_op" in attrs:
        text += f" ({ir.StringAttr(attrs['reduce_op']).value})"
    if "group_name" in attrs:
        text += f" on group '{ir.StringAttr(attrs['group_name']).value}'"
    return text
