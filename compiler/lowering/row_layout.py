"""Row-interleaved values: `[b, s, k] -> [b*s, k]` without moving data (bounded dynamism).

Flattening a dynamic dim into a static one before it (`x.view(b * s, k)`, which every
`nn.Linear` on a 3-D input does) interleaves padding with data: the padded buffer
`[b, B, k]` reshaped to `[b*B, k]` has `s` valid rows, then `B - s` padding rows, per
batch element. Compacting it takes a gather, and the inverse view another one.

Most consumers of such a value work row by row (`mm`/`addmm` with a static weight,
elementwise ops, the inverse view), and for them the interleaved layout is as good as a
compact one: padding rows compute garbage that no valid row reads. So the importer keeps
the value interleaved (no size mark: for XLA it is a static buffer) and records its
layout; a row-wise consumer gets the interleaved value and passes the layout on, the
inverse view is a plain reshape, and any other consumer gets the compacted value
(built once per value).
"""

from __future__ import annotations

import operator
from dataclasses import dataclass

import sympy
import torch
import torch.fx

aten = torch.ops.aten

# Ops that compute each row of their result from the same row of their interleaved
# operands only (with static-shaped other operands broadcast along the rows).
_ROW_WISE = {
    aten.mm.default: (0,),
    aten.addmm.default: (1,),
}
_ELEMENTWISE = {
    aten.add.Tensor,
    aten.sub.Tensor,
    aten.mul.Tensor,
    aten.div.Tensor,
    aten.gelu.default,
    aten.relu.default,
    aten.silu.default,
    aten.tanh.default,
    aten.sigmoid.default,
    aten.neg.default,
    aten.clone.default,
    aten._to_copy.default,
    aten.exp.default,
    aten.pow.Tensor_Scalar,
    aten.rsqrt.default,
    aten.where.self,
}
_VIEWS = {
    aten.view.default,
    aten._unsafe_view.default,
    aten.reshape.default,
    aten.view_copy.default,
}


@dataclass(frozen=True)
class RowLayout:
    """A value of symbolic shape `[lead*s, rest...]` held as the plain reshape of its
    padded `[lead..., bound, rest...]` buffer."""

    lead: tuple[int, ...]
    symbol: sympy.Expr  # s
    bound: int


def flatten_layout(in_shape, out_shape, bound: int) -> RowLayout | None:
    """The layout of `view(x, out_shape)` when it flattens static leading dims into the
    single dynamic dim of `x` (and keeps what follows): `[A..., s, C...] -> [prod(A)*s, C'...]`
    with prod(C) == prod(C')."""
    dyn = [d for d, s in enumerate(in_shape) if _symbolic(s)]
    if len(dyn) != 1 or dyn[0] == 0 or not out_shape or not _symbolic(out_shape[0]):
        return None
    d = dyn[0]
    lead = tuple(int(s) for s in in_shape[:d])
    rest_in = in_shape[d + 1 :]
    rest_out = out_shape[1:]
    if any(_symbolic(s) for s in list(rest_in) + list(rest_out)):
        return None
    if _prod(rest_in) != _prod(rest_out):
        return None
    s = in_shape[d].node.expr
    if sympy.simplify(out_shape[0].node.expr - _prod(lead) * s) != 0:
        return None
    return RowLayout(lead, s, bound)


def unflatten_matches(layout: RowLayout, out_shape) -> bool:
    """Whether `view(x, out_shape)` of an interleaved `x` restores `[lead..., s, ...]`."""
    n = len(layout.lead)
    if len(out_shape) <= n or any(_symbolic(s) for s in out_shape[:n]):
        return False
    if tuple(int(s) for s in out_shape[:n]) != layout.lead:
        return False
    s = out_shape[n]
    return (
        _symbolic(s)
        and sympy.simplify(s.node.expr - layout.symbol) == 0
        and not any(_symbolic(x) for x in out_shape[n + 1 :])
    )


def row_wise_operands(node: torch.fx.Node, interleaved: dict, symbolic_val) -> bool:
    """Whether `node` may consume its interleaved operands as they are: a row-wise op whose
    interleaved operands share one layout, with every other tensor operand static."""
    target = node.target
    tensor_args = [a for a in node.args if isinstance(a, torch.fx.Node)]
    layouts = {interleaved[a] for a in tensor_args if a in interleaved}
    if len(layouts) != 1:
        return False
    if target in _ROW_WISE:
        positions = _ROW_WISE[target]
        for i, a in enumerate(node.args):
            if not isinstance(a, torch.fx.Node):
                continue
            if a in interleaved and i not in positions:
                return False
            if a not in interleaved and _has_symbolic(symbolic_val(a)):
                return False
        return True
    if target in _ELEMENTWISE or target is operator.getitem:
        out = symbolic_val(node)
        if not isinstance(out, torch.Tensor):
            return False
        for a in tensor_args:
            if a in interleaved:
                if tuple(symbolic_val(a).shape) != tuple(out.shape):
                    return False  # broadcasting would mix rows
            elif _has_symbolic(symbolic_val(a)):
                return False
        return True
    return target in _VIEWS


def result_keeps_layout(node: torch.fx.Node, layout: RowLayout, symbolic_val) -> bool:
    out = symbolic_val(node)
    if not isinstance(out, torch.Tensor) or not out.dim() or not _symbolic(out.shape[0]):
        return False
    return sympy.simplify(
        out.shape[0].node.expr - _prod(layout.lead) * layout.symbol
    ) == 0 and not any(_symbolic(s) for s in out.shape[1:])


def _symbolic(s) -> bool:
    return isinstance(s, torch.SymInt) and not s.node.is_constant()


def _has_symbolic(val) -> bool:
    return isinstance(val, torch.Tensor) and any(_symbolic(s) for s in val.shape)


def _prod(values) -> int:
    out = 1
    for v in values:
        out *= int(v)
    return out
