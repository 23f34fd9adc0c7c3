"""Per-op partitioning rules of `torchtpu-insert-collectives`: one table from op name to
rule, so supporting another op is one entry.

A rule sees an op whose operands already carry their layouts (at least one sharded),
brings the operands to shardings the op can compute on locally (through the
`Partitioner`), and gives each result its local type and layout (`Partitioner.retype`).
A pattern it cannot partition raises `Unsupported`; the pass reports it at the op.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ..context import ir, stablehlo
from . import _collective_builders as build
from ._resharding import Partitioner, Unsupported, shape_of
from .sharding import Layout, Shard

Rule = Callable[[Partitioner, ir.Operation], None]
RULES: dict[str, Rule] = {}


def rule(*names: str) -> Callable[[Rule], Rule]:
    """Registers the decorated function as the rule of ops `names`."""

    def register(fn: Rule) -> Rule:
        for name in names:
            assert name not in RULES, f"two partitioning rules for {name}"
            RULES[name] = fn
        return fn

    return register


ELEMENTWISE = frozenset(
    "stablehlo." + n
    for n in (
        "add", "subtract", "multiply", "divide", "maximum", "minimum", "power", "remainder",
        "atan2", "and", "or", "xor", "compare", "select", "negate", "abs", "exponential",
        "exponential_minus_one", "log", "log_plus_one", "logistic", "tanh", "sqrt", "rsqrt",
        "cbrt", "sine", "cosine", "tan", "floor", "ceil", "round_nearest_even",
        "round_nearest_afz", "sign", "not", "convert", "is_finite", "clamp", "real", "imag",
        "complex", "shift_left", "shift_right_logical", "shift_right_arithmetic", "popcnt",
        "count_leading_zeros",
    )
)
# Ops through which a partial sum stays a partial sum: f(a+b) = f(a)+f(b).
_LINEAR_UNARY = frozenset({"stablehlo.negate", "stablehlo.convert", "stablehlo.real", "stablehlo.imag"})
_REDUCE_BODIES = {"stablehlo.add": "sum", "stablehlo.maximum": "max", "stablehlo.minimum": "min"}


def _keeps_sums(op: ir.Operation) -> bool:
    """A convert keeps partial sums partial only between float types (to an integer
    type, rounding each part is not rounding the sum)."""
    if op.name != "stablehlo.convert":
        return True
    kinds = {build.element_kind(ir.RankedTensorType(v.type).element_type) for v in (op.operands[0], op.results[0])}
    return kinds <= {"float", "complex"}


@rule(*sorted(ELEMENTWISE))
def _elementwise(p: Partitioner, op: ir.Operation) -> None:
    operands = list(op.operands)
    rank = len(shape_of(op.results[0]))
    # clamp/select may take 0-d operands next to ranked ones: those stay whole.
    ranked = [i for i, v in enumerate(operands) if len(shape_of(v)) == rank]
    layouts = [p.layout(v) for v in operands]
    partials = [l.partial for l in layouts]
    keep_partial: tuple = ()
    nonzero = [i for i, q in enumerate(partials) if q]
    sum_only = all(kind == "sum" for q in partials for _, kind in q)
    if nonzero and sum_only:
        linear_unary = op.name in _LINEAR_UNARY and len(operands) == 1 and _keeps_sums(op)
        same_sums = op.name in ("stablehlo.add", "stablehlo.subtract") and all(q == partials[0] for q in partials)
        if linear_unary or same_sums:
            keep_partial = partials[0]
        elif op.name == "stablehlo.multiply" and len(nonzero) == 1:
            keep_partial = partials[nonzero[0]]
        elif op.name == "stablehlo.divide" and nonzero == [0]:
            keep_partial = partials[0]
    target = p.cheapest_target([operands[i] for i in ranked], rank)
    partial_axes = {a for a, _ in keep_partial}
    if partial_axes & {a.axis for a in target if a is not None}:
        keep_partial = ()
    for i in ranked:
        value = operands[i]
        if keep_partial and layouts[i].partial == keep_partial:
            if list(layouts[i].dims) != target:
                # Bring the sharding along without combining the partial sums.
                value = p.reshard_keep_partial(value, target)
        else:
            value = p.bring(value, target)
        op.operands[i] = value
    for i in range(len(op.results)):
        p.retype(op, i, Layout(tuple(target), keep_partial))


@rule("stablehlo.broadcast_in_dim")
def _broadcast_in_dim(p: Partitioner, op: ir.Operation) -> None:
    operand = op.operands[0]
    layout = p.layout(operand)
    mapping = list(ir.DenseI64ArrayAttr(op.attributes["broadcast_dimensions"]))
    out_shape = shape_of(op.results[0])
    dims: list[Shard | None] = [None] * len(out_shape)
    in_shape = p.global_shape(operand)
    for j, d in enumerate(mapping):
        if layout.dims[j] is not None:
            if in_shape[j] != out_shape[d]:
                raise Unsupported("a sharded dimension cannot be expanded by broadcasting")
            dims[d] = layout.dims[j]
    p.retype(op, 0, Layout(tuple(dims), layout.partial))


@rule("stablehlo.transpose")
def _transpose(p: Partitioner, op: ir.Operation) -> None:
    layout = p.layout(op.operands[0])
    perm = list(ir.DenseI64ArrayAttr(op.attributes["permutation"]))
    p.retype(op, 0, Layout(tuple(layout.dims[d] for d in perm), layout.partial))


@rule("stablehlo.reshape")
def _reshape(p: Partitioner, op: ir.Operation) -> None:
    layout = p.layout(op.operands[0])
    in_shape, out_shape = p.global_shape(op.operands[0]), shape_of(op.results[0])
    dims: list[Shard | None] = [None] * len(out_shape)
    for in_group, out_group in _reshape_groups(in_shape, out_shape):
        sharded = [d for d in in_group if layout.dims[d] is not None]
        if not sharded:
            continue
        if len(sharded) > 1:
            raise Unsupported(f"reshape {in_shape} -> {out_shape} merges two sharded dimensions")
        i = sharded[0]
        shard = layout.dims[i]
        placed = _place_shard(in_shape, out_shape, in_group, out_group, i, shard, p.mesh.axis_size(shard.axis))
        if placed is None:
            raise Unsupported(
                f"reshape {in_shape} -> {out_shape} splits sharded dimension {i} (axis \"{shard.axis}\") "
                "across dimensions so that no single dimension holds the split; shard a dimension that "
                "stays whole or leads its group"
            )
        j, major = placed
        dims[j] = Shard(shard.axis, major)
    p.retype(op, 0, Layout(tuple(dims), layout.partial))


def _place_shard(in_shape: Sequence[int], out_shape: Sequence[int], in_group: list[int], out_group: list[int],
                 i: int, shard: Shard, k: int) -> tuple[int, int] | None:
    """Where a reshape puts input dimension `i`'s sharding: (output dimension, major).

    Flattened, the group is [M, R/k-blocks..., minor] with M the elements before the
    split factor (the dimensions before `i` in the group, times its own major), R the
    split factor (dimension i without its major part) and `minor` the dimensions after
    it. The output dimension j (with P elements before it, Q after it in the group)
    holds the split when P divides M, and j's size over M/P, times Q, is R * minor and
    divides by k."""
    before = 1
    for d in in_group:
        if d == i:
            break
        before *= in_shape[d]
    major_elems = before * shard.major
    split = in_shape[i] // shard.major
    minor = 1
    for d in in_group[in_group.index(i) + 1:]:
        minor *= in_shape[d]
    prefix = 1
    for pos, j in enumerate(out_group):
        suffix = 1
        for d in out_group[pos + 1:]:
            suffix *= out_shape[d]
        if major_elems % prefix == 0:
            m_out = major_elems // prefix
            if out_shape[j] % m_out == 0:
                inner = out_shape[j] // m_out
                if inner * suffix == split * minor and inner % k == 0:
                    return j, m_out
        prefix *= out_shape[j]
    return None


def _reshape_groups(a: list[int], b: list[int]) -> list[tuple[list[int], list[int]]]:
    """Pairs of minimal dimension groups of `a` and `b` with equal element counts
    (size-1 dimensions join the group before them)."""
    groups = []
    i = j = 0
    while i < len(a) or j < len(b):
        gi, gj = [], []
        pa = pb = 1
        if i < len(a):
            gi.append(i); pa *= a[i]; i += 1
        if j < len(b):
            gj.append(j); pb *= b[j]; j += 1
        while pa != pb:
            if pa < pb and i < len(a):
                gi.append(i); pa *= a[i]; i += 1
            elif j < len(b):
                gj.append(j); pb *= b[j]; j += 1
            else:
                break
        while i < len(a) and a[i] == 1 and (j >= len(b) or b[j] != 1):
            gi.append(i); i += 1
        while j < len(b) and b[j] == 1 and (i >= len(a) or a[i] != 1):
            gj.append(j); j += 1
        groups.append((gi, gj))
    return groups


@rule("stablehlo.slice", "stablehlo.pad", "stablehlo.reverse")
def _along_whole_dims(p: Partitioner, op: ir.Operation) -> None:
    """slice / pad / reverse: local when every dimension they change is unsharded
    (a sharded dimension must be kept whole: full slice, no padding, not reversed)."""
    operand = op.operands[0]
    layout = p.layout(operand)
    shape = p.global_shape(operand)
    sharded = [d for d, a in enumerate(layout.dims) if a is not None]
    attrs = op.attributes
    if op.name == "stablehlo.slice":
        start = list(ir.DenseI64ArrayAttr(attrs["start_indices"]))
        limit = list(ir.DenseI64ArrayAttr(attrs["limit_indices"]))
        strides = list(ir.DenseI64ArrayAttr(attrs["strides"]))
        touched = [d for d in sharded if (start[d], limit[d], strides[d]) != (0, shape[d], 1)]
    elif op.name == "stablehlo.pad":
        if not p.layout(op.operands[1]).is_replicated:
            raise Unsupported("the padding value must be replicated")
        pads = [list(ir.DenseI64ArrayAttr(attrs[k])) for k in ("edge_padding_low", "edge_padding_high", "interior_padding")]
        touched = [d for d in sharded if any(q[d] for q in pads)]
    else:
        touched = [d for d in sharded if d in set(ir.DenseI64ArrayAttr(attrs["dimensions"]))]
    if touched:
        raise Unsupported(f"it changes sharded dimension(s) {touched}; only unsharded dimensions may be "
                          "sliced, padded or reversed")
    if op.name == "stablehlo.slice":
        local = p.local_shape(shape, Layout(layout.dims))
        attrs["limit_indices"] = ir.DenseI64ArrayAttr.get(
            [local[d] if layout.dims[d] is not None else limit[d] for d in range(len(shape))])
    p.retype(op, 0, layout)


@rule("stablehlo.concatenate")
def _concatenate(p: Partitioner, op: ir.Operation) -> None:
    dim = ir.IntegerAttr(op.attributes["dimension"]).value
    operands = list(op.operands)
    target = p.cheapest_target(operands, len(shape_of(op.results[0])))
    target = [None if d == dim else a for d, a in enumerate(target)]
    partials = {p.layout(v).partial for v in operands}
    keep = partials.pop() if len(partials) == 1 else ()
    if keep and not all(kind == "sum" for _, kind in keep):
        keep = ()
    for i, value in enumerate(operands):
        if keep and list(p.layout(value).dims) != target:
            value = p.reshard_keep_partial(value, target)
        elif not keep:
            value = p.bring(value, target)
        op.operands[i] = value
    p.retype(op, 0, Layout(tuple(target), keep))


@rule("stablehlo.reduce")
def _reduce(p: Partitioner, op: ir.Operation) -> None:
    if len(op.results) != 1:
        raise Unsupported("a reduce of several operands (argmax-like) over sharded values is not supported")
    body_ops = [o.operation.name for o in op.regions[0].blocks[0].operations]
    kind = _REDUCE_BODIES.get(body_ops[0]) if len(body_ops) == 2 else None
    operand = op.operands[0]
    layout = p.layout(operand)
    if p.layout(op.operands[1]).partial or not p.layout(op.operands[1]).is_replicated:
        raise Unsupported("the init value of a reduce must be replicated")
    if layout.partial and not (kind == "sum" and all(k == "sum" for _, k in layout.partial)):
        operand = p.reshard(operand, layout.dims)
        op.operands[0] = operand
        layout = p.layout(operand)
    reduced = set(ir.DenseI64ArrayAttr(op.attributes["dimensions"]))
    partial = list(layout.partial)
    dims = []
    for d, axis in enumerate(layout.dims):
        if d in reduced:
            if axis is not None:
                if kind is None:
                    raise Unsupported("a reduction over a sharded dimension must be a sum, max or min")
                partial.append((axis.axis, kind))
        else:
            dims.append(axis)
    p.retype(op, 0, Layout(tuple(dims), tuple(partial)))


@rule("stablehlo.dot_general")
def _dot_general(p: Partitioner, op: ir.Operation) -> None:
    lhs, rhs = op.operands[0], op.operands[1]
    if p.layout(lhs).partial:
        lhs = p.reshard(lhs, p.layout(lhs).dims)
    if p.layout(rhs).partial:
        rhs = p.reshard(rhs, p.layout(rhs).dims)
    numbers = stablehlo.DotDimensionNumbers(op.attributes["dot_dimension_numbers"])
    lb, rb = list(numbers.lhs_batching_dimensions), list(numbers.rhs_batching_dimensions)
    lc, rc = list(numbers.lhs_contracting_dimensions), list(numbers.rhs_contracting_dimensions)
    L = list(p.layout(lhs).dims)
    R = list(p.layout(rhs).dims)
    for i, j in zip(lb, rb):
        if L[i] != R[j]:
            chosen = L[i] if L[i] is not None else R[j]
            L[i] = R[j] = chosen
    lfree = [d for d in range(len(L)) if d not in lb and d not in lc]
    rfree = [d for d in range(len(R)) if d not in rb and d not in rc]

    def used_elsewhere(shard: Shard, skip_l=None, skip_r=None) -> bool:
        for d, a in enumerate(L):
            if a is not None and a.axis == shard.axis and d != skip_l:
                return True
        for d, a in enumerate(R):
            if a is not None and a.axis == shard.axis and d != skip_r:
                return True
        return False

    for i, j in zip(lc, rc):
        if L[i] == R[j]:
            continue
        if L[i] is not None and R[j] is not None:
            L[i] = R[j] = None
        elif L[i] is not None:
            if used_elsewhere(L[i], skip_l=i):
                L[i] = None
            else:
                R[j] = L[i]
        else:
            if used_elsewhere(R[j], skip_r=j):
                R[j] = None
            else:
                L[i] = R[j]
    # An axis may shard the result once: free dims of both operands on one axis
    # gather one of them.
    while True:
        seen: dict[str, tuple[str, int]] = {}
        conflict = None
        for side, dims, idx in (("l", L, lb), ("r", R, ())):
            for d in idx:
                if dims[d] is not None:
                    seen.setdefault(dims[d].axis, (side, d))
        for i, j in zip(lc, rc):
            if L[i] is not None:
                seen.setdefault(L[i].axis, ("c", i))
        for side, dims, free in (("l", L, lfree), ("r", R, rfree)):
            for d in free:
                a = dims[d]
                if a is None:
                    continue
                if a.axis in seen:
                    conflict = (a.axis, seen[a.axis], (side, d))
                    break
                seen[a.axis] = (side, d)
            if conflict:
                break
        if conflict is None:
            break
        axis, first, second = conflict
        candidates = [c for c in (first, second) if c[0] in ("l", "r") and
                      ((c[0] == "l" and c[1] in lfree) or (c[0] == "r" and c[1] in rfree))]
        if len(candidates) == 2:
            # The right-hand side is gathered: PyTorch's linear/matmul lowerings put the
            # activations left and the weights right, and FSDP gathers the weights so
            # that the activations keep their batch sharding downstream. (Gathering the
            # smaller operand looks cheaper here but shards the hidden activations on
            # the axis, which costs more later: measured in bench/spmd.py.)
            pick = next(c for c in candidates if c[0] == "r")
        elif candidates:
            pick = candidates[0]
        else:
            raise Unsupported(f"axis \"{axis}\" would shard two dimensions of the result")
        (L if pick[0] == "l" else R)[pick[1]] = None
    lhs = p.bring(lhs, L)
    rhs = p.bring(rhs, R)
    op.operands[0] = lhs
    op.operands[1] = rhs
    partial = tuple((L[i].axis, "sum") for i, j in zip(lc, rc) if L[i] is not None)
    out = [L[i] for i in lb] + [L[d] for d in lfree] + [R[d] for d in rfree]
    p.retype(op, 0, Layout(tuple(out), partial))
