"""Collectives: `torch.ops._c10d_functional.*` (functional collectives, DTensor under
torch.compile) -> `torchtpu.collective`.

The rules keep what PyTorch knew -- the group's ranks, the reduce op -- and resolve the
group's name to the complete partition of the world (the `ProcessGroups` facts the
frontend gave `import_graph`, `compiler/process_groups.py`), so the IR alone is enough
to lower the op later
(`torchtpu-lower-collectives`). `wait_tensor` is the identity: XLA orders collectives
by data flow, so there is nothing to wait for.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from ..context import ir
from ..dialect.collective_ops import REDUCE_OPS
from ..fx_locations import user_frame
from ..process_groups import GroupResolutionError, ProcessGroups, padded_groups
from .helpers import shape_of
from .registry import declare_padding, LoweringContext, lookup, lowers, Padding
from .symsize import static_layout

c10d = torch.ops._c10d_functional


# Bounded dynamism (a graph with symbolic sizes compiles at bounds: padded buffers). An
# all-reduce or broadcast exchanges every element at its own position, so padding stays in
# the padding (SAFE). All-gather, reduce-scatter and all-to-all cut or stack dimension 0 at
# rank boundaries: with dimension 0 padded, every rank's block would carry its padding into
# the middle of the result (or a scatter would cut the padded buffer at the wrong rows), so
# that case runs in eager; a dynamic dim other than 0 stays in the padding.
# Ranks exchanging a dynamic dim must agree on its run-time size, as in eager: the
# handshake compares it (`torch_tpu.backend._dist_graph`, exchanged sizes).


def _eager_along_dynamic_dim0(ctx: LoweringContext, *args, **kwargs):
    """With dimension 0 dynamic: runs in eager (each rank's block would carry its padding
    into the middle of the result); a dynamic dim other than 0: the ordinary rule on the
    padded buffers."""
    arg = ctx.node.args[0]
    nodes = arg if isinstance(arg, (list, tuple)) else [arg]
    dynamic = ctx.dynamic
    if any(0 in dynamic.dynamic_dims(dynamic.symbolic_val(n)) for n in nodes if isinstance(n, torch.fx.Node)):
        name = str(ctx.node.target).removeprefix("_c10d_functional.").removesuffix(".default")
        frame = user_frame(ctx.node.meta.get("stack_trace"))
        where = f" at {frame[0]}:{frame[1]}" if frame else ""
        raise ctx.dynamic_limit(
            f"{name}{where} along a dynamic (padded) dimension 0 (each rank's padding would land "
            "between the ranks' blocks)"
        )
    args, kwargs = torch.utils._pytree.tree_map(
        lambda a: static_layout(a) if isinstance(a, ir.Value) else a, (args, kwargs)
    )
    return lookup(ctx.node.target).fn(ctx, *args, **kwargs)


def collective_op(
    kind: str,
    value: ir.Value,
    result_shape: Sequence[int],
    group,
    *,
    reduce_op: str | None = None,
    dim: int | None = None,
    src: int | None = None,
) -> ir.Value:
    """Builds one `torchtpu.collective` of `kind` on `value` over `group` (a GroupInfo)."""
    element = ir.RankedTensorType(value.type).element_type
    attrs = {
        "kind": ir.StringAttr.get(kind),
        "replica_groups": ir.DenseElementsAttr.get(np.array(padded_groups(group.partition), dtype=np.int64)),
        "group_ranks": ir.DenseI64ArrayAttr.get(list(group.ranks)),
        "group_name": ir.StringAttr.get(group.name),
    }
    i64 = ir.IntegerType.get_signless(64)
    if reduce_op is not None:
        attrs["reduce_op"] = ir.StringAttr.get(reduce_op)
    if dim is not None:
        attrs["dim"] = ir.IntegerAttr.get(i64, dim)
    if src is not None:
        attrs["src"] = ir.IntegerAttr.get(i64, src)
    op = ir.Operation.create(
        "torchtpu.collective",
        results=[ir.RankedTensorType.get(list(result_shape), element)],
        operands=[value],
        attributes=attrs,
    )
    return op.result


def _group(ctx: LoweringContext, name, size: int | None = None):
    facts = ctx.process_groups or ProcessGroups()
    try:
        info = facts.lookup(str(name))
    except GroupResolutionError as err:
        raise ctx.fail(str(err)) from None
    if size is not None and size != len(info.ranks):
        raise ctx.fail(f"group_size {size} does not match process group '{info.name}' of {len(info.ranks)} ranks")
    return info


def _reduce_op(ctx: LoweringContext, name: str) -> str:
    op = str(name).lower()
    if op not in REDUCE_OPS:
        raise ctx.fail(f"unknown reduce op '{name}'; PyTorch's are {', '.join(REDUCE_OPS)}")
    return op


@lowers(c10d.all_reduce.default)
def all_reduce(ctx, x, reduce_op, group_name):
    return collective_op("all_reduce", x, shape_of(x), _group(ctx, group_name), reduce_op=_reduce_op(ctx, reduce_op))


@lowers(c10d.all_reduce_coalesced.default)
def all_reduce_coalesced(ctx, xs, reduce_op, group_name):
    group, op = _group(ctx, group_name), _reduce_op(ctx, reduce_op)
    return [collective_op("all_reduce", x, shape_of(x), group, reduce_op=op) for x in xs]


def _gathered(x: ir.Value, size: int) -> list[int]:
    shape = shape_of(x)
    shape[0] *= size
    return shape


def _scattered(ctx, x: ir.Value, size: int) -> list[int]:
    shape = shape_of(x)
    if not shape or shape[0] % size:
        raise ctx.fail(f"reduce_scatter_tensor: dimension 0 of {shape} does not divide by the group size {size}")
    shape[0] //= size
    return shape


@lowers(c10d.all_gather_into_tensor.default, dynamic=Padding.MOVEMENT,
        dynamic_rule=_eager_along_dynamic_dim0)
def all_gather_into_tensor(ctx, x, group_size, group_name):
    group = _group(ctx, group_name, group_size)
    return collective_op("all_gather", x, _gathered(x, group_size), group, dim=0)


@lowers(c10d.all_gather_into_tensor_coalesced.default, dynamic=Padding.MOVEMENT,
        dynamic_rule=_eager_along_dynamic_dim0)
def all_gather_into_tensor_coalesced(ctx, xs, group_size, group_name):
    group = _group(ctx, group_name, group_size)
    return [collective_op("all_gather", x, _gathered(x, group_size), group, dim=0) for x in xs]


@lowers(c10d.reduce_scatter_tensor.default, dynamic=Padding.MOVEMENT,
        dynamic_rule=_eager_along_dynamic_dim0)
def reduce_scatter_tensor(ctx, x, reduce_op, group_size, group_name):
    group = _group(ctx, group_name, group_size)
    return collective_op("reduce_scatter", x, _scattered(ctx, x, group_size), group, reduce_op=_reduce_op(ctx, reduce_op), dim=0)


@lowers(c10d.reduce_scatter_tensor_coalesced.default, dynamic=Padding.MOVEMENT,
        dynamic_rule=_eager_along_dynamic_dim0)
def reduce_scatter_tensor_coalesced(ctx, xs, reduce_op, group_size, group_name):
    group, op = _group(ctx, group_name, group_size), _reduce_op(ctx, reduce_op)
    return [collective_op("reduce_scatter", x, _scattered(ctx, x, group_size), group, reduce_op=op, dim=0) for x in xs]


@lowers(c10d.all_to_all_single.default, dynamic=Padding.MOVEMENT,
        dynamic_rule=_eager_along_dynamic_dim0)
def all_to_all_single(ctx, x, output_split_sizes, input_split_sizes, group_name):
    group = _group(ctx, group_name)
    size = len(group.ranks)
    rows = shape_of(x)[0] if shape_of(x) else 0
    even = [rows // size] * size
    for what, splits in (("output_split_sizes", output_split_sizes), ("input_split_sizes", input_split_sizes)):
        if splits is not None and len(splits) and [int(s) for s in splits] != even:
            raise ctx.fail(
                f"all_to_all_single with uneven {what} {list(splits)} is not supported (StableHLO's "
                f"all_to_all splits evenly: {even}); pad the tensor to equal splits"
            )
    if rows % size:
        raise ctx.fail(f"all_to_all_single: dimension 0 of size {rows} does not divide by the group size {size}")
    return collective_op("all_to_all", x, shape_of(x), group, dim=0)


@lowers(c10d.broadcast.default)
def broadcast(ctx, x, src, group_name):
    group = _group(ctx, group_name)
    if int(src) not in group.ranks:
        raise ctx.fail(f"broadcast source rank {src} is not in process group '{group.name}' (ranks {list(group.ranks)})")
    # PyTorch names the source by global rank; each subgroup of the partition broadcasts
    # from its member at the same position, so the op keeps the position.
    return collective_op("broadcast", x, shape_of(x), group, src=group.ranks.index(int(src)))


@lowers(c10d.wait_tensor.default)
def wait_tensor(ctx, x):
    return x


def is_collective_node(node) -> bool:
    """Whether an FX node is a `_c10d_functional` collective (the Dynamo backend leaves
    those to torch.distributed: one-device graphs have no replicas to exchange with)."""
    target = getattr(node, "target", None)
    return getattr(target, "namespace", None) == "_c10d_functional"


declare_padding(Padding.SAFE, c10d.all_reduce, c10d.all_reduce_coalesced, c10d.broadcast, c10d.wait_tensor)
declare_padding(Padding.EAGER, family="collectives")
