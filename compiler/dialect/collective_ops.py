"""`torchtpu.collective`: a PyTorch collective, as `torch.distributed` issued it.

The op keeps what PyTorch knew (the group's ranks, its name, the reduce op) and, computed
at import, the complete partition of the world into the groups that run the same
collective (`replica_groups`). StableHLO needs that partition -- every subgroup, also
those the rank is not in -- so carrying it on the op keeps `torchtpu-lower-collectives`
self-contained on `.mlir` input.
"""

from __future__ import annotations

import numpy as np

from ..context import ir
from .spec import (
    I64,
    TORCHTPU,
    AnyRankedTensor,
    Attr,
    AttrKind,
    Operand,
    OpSpec,
    Result,
    String,
    StringEnum,
    VerifyError,
)

COLLECTIVE_KINDS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "permute")
# PyTorch's reduce-op names (`torch.distributed._functional_collectives` spelling).
REDUCE_OPS = ("sum", "avg", "product", "min", "max", "band", "bor", "bxor", "premul_sum")
_NEEDS_REDUCE = ("all_reduce", "reduce_scatter")


def dense_i64_matrix(attr: ir.Attribute) -> list[list[int]]:
    """The rows of a 2-D `dense<...> : tensor<RxCxi64>` attribute."""
    array = np.array(ir.DenseIntElementsAttr(attr))
    return [[int(v) for v in row] for row in array.reshape(array.shape[0], -1)] if array.ndim == 2 else []


def _is_i64_matrix(a: ir.Attribute) -> bool:
    if not isinstance(a, ir.DenseIntElementsAttr):
        return False
    t = ir.RankedTensorType(a.type)
    return t.rank == 2 and isinstance(t.element_type, ir.IntegerType) and t.element_type.width == 64


I64Matrix = AttrKind("2-D dense<...> : tensor<RxCxi64>", _is_i64_matrix, dense_i64_matrix)
I64List = AttrKind(
    "array<i64: ...>", lambda a: isinstance(a, ir.DenseI64ArrayAttr), lambda a: list(ir.DenseI64ArrayAttr(a))
)


def replica_group_rows(groups: list[list[int]]) -> list[list[int]]:
    """The groups without their -1 padding (StableHLO pads uneven groups with -1)."""
    return [[r for r in row if r != -1] for row in groups]


def _verify_collective(op: ir.Operation, attrs: dict) -> None:
    """the partition is disjoint; the group's ranks are one of its groups; the reduce op,
    dim, src and result shape fit the kind"""
    kind = attrs["kind"]
    if kind in _NEEDS_REDUCE and "reduce_op" not in attrs:
        raise VerifyError(f"kind '{kind}' requires a 'reduce_op' attribute")
    in_type = ir.RankedTensorType(op.operands[0].type)
    out_type = ir.RankedTensorType(op.results[0].type)
    if in_type.element_type != out_type.element_type:
        raise VerifyError(f"result element type {out_type.element_type} differs from the operand's {in_type.element_type}")
    if kind == "permute":
        pairs = attrs.get("source_target_pairs")
        if pairs is None or any(len(p) != 2 for p in pairs):
            raise VerifyError("kind 'permute' requires 'source_target_pairs' as a dense<...> : tensor<Px2xi64>")
        sources, targets = [p[0] for p in pairs], [p[1] for p in pairs]
        if len(set(sources)) != len(sources) or len(set(targets)) != len(targets):
            raise VerifyError("'source_target_pairs' must name each source and each target at most once")
        if in_type != out_type:
            raise VerifyError(f"result type {out_type} must equal the operand type {in_type}")
        return
    groups = replica_group_rows(attrs.get("replica_groups") or [])
    if not groups or any(not g for g in groups):
        raise VerifyError("requires a non-empty 'replica_groups' partition without empty groups")
    flat = [r for g in groups for r in g]
    if any(r < 0 for r in flat):
        raise VerifyError("'replica_groups' may hold -1 only as padding of uneven groups")
    if len(set(flat)) != len(flat):
        raise VerifyError(f"'replica_groups' {groups} is not a partition: a rank appears twice")
    ranks = attrs.get("group_ranks")
    if ranks is None:
        raise VerifyError(f"kind '{kind}' requires 'group_ranks', the PyTorch group's ranks")
    group = next((g for g in groups if sorted(g) == sorted(ranks)), None)
    if group is None:
        raise VerifyError(f"'group_ranks' {ranks} is not one of the groups of 'replica_groups' {groups}")
    size = len(ranks)
    dim = attrs.get("dim", 0)
    if kind in ("all_gather", "reduce_scatter", "all_to_all") and not 0 <= dim < in_type.rank:
        raise VerifyError(f"'dim' {dim} is out of range for a rank-{in_type.rank} operand")
    expected = list(in_type.shape)
    if kind == "all_gather":
        expected[dim] *= size
    elif kind == "reduce_scatter":
        if expected[dim] % size:
            raise VerifyError(f"dimension {dim} of size {expected[dim]} does not divide by the group size {size}")
        expected[dim] //= size
    elif kind == "all_to_all" and expected[dim] % size:
        raise VerifyError(f"dimension {dim} of size {expected[dim]} does not divide by the group size {size}")
    if list(out_type.shape) != expected:
        raise VerifyError(f"result shape {list(out_type.shape)} must be {expected} for kind '{kind}' over {size} ranks")
    if kind == "broadcast":
        src = attrs.get("src")
        if src is None or not 0 <= src < size:
            raise VerifyError(f"kind 'broadcast' requires 'src', the source's index in the group (0..{size - 1})")


TORCHTPU.op(
    OpSpec(
        "collective",
        summary="A torch.distributed collective over a process group, with its full replica-group partition.",
        description=(
            "Imported from `torch.ops._c10d_functional.*` (functional collectives, DTensor "
            "under torch.compile). `kind` says which collective; `group_ranks` are the "
            "PyTorch group's global ranks in group order, `replica_groups` the complete "
            "partition of the world the group belongs to (every subgroup that runs the same "
            "collective, uneven groups padded with -1), derived from the DeviceMesh "
            "dimension or the groups PyTorch created. `dim` is the gather/scatter/split "
            "dimension, `src` the broadcast source's index in the group, "
            "`source_target_pairs` the (source, target) rank pairs of a permute. "
            "`torchtpu-lower-collectives` turns it into StableHLO collectives."
        ),
        operands=(Operand("input", AnyRankedTensor),),
        results=(Result("result", AnyRankedTensor),),
        attributes=(
            Attr("kind", StringEnum(*COLLECTIVE_KINDS), doc="which collective"),
            Attr("reduce_op", StringEnum(*REDUCE_OPS), optional=True, doc="PyTorch reduce op (all_reduce, reduce_scatter)"),
            Attr("replica_groups", I64Matrix, optional=True, doc="complete partition of the ranks; -1 pads uneven groups"),
            Attr("group_ranks", I64List, optional=True, doc="the PyTorch group's global ranks, in group order"),
            Attr("group_name", String, optional=True, doc="the PyTorch group's name (for messages)"),
            Attr("dim", I64, optional=True, doc="gather / scatter / split dimension (default 0)"),
            Attr("src", I64, optional=True, doc="broadcast source: index in the group"),
            Attr("source_target_pairs", I64Matrix, optional=True, doc="permute: (source, target) rank pairs"),
        ),
        verify=_verify_collective,
    )
)
