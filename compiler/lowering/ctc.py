"""Connectionist temporal classification: `_ctc_loss` and `_ctc_loss_backward`, the ops
`torch.nn.functional.ctc_loss` reaches on CPU (its reductions and `zero_infinity`'s loss
masking are separate ops after `_ctc_loss`).

Semantics follow ATen's CPU kernels (LossCTC.cpp). The extended label sequence l' puts a
blank before, between and after the target's labels (length 2 * max_target_length + 1);
alpha runs forward over time, beta backward, both in log space, each step summing the
same state, the state one below (above) and -- where l'[s] differs from l'[s -+ 2] --
the state two below (above). Time is a `stablehlo.while` loop; batch and extended
states are vectorized, with each element's input and target lengths applied as masks, so
one program serves any lengths (list lengths become constants of that program).

log_alpha holds -inf wherever ATen never writes it (t >= input_length, s > 2 *
target_length: uninitialized memory on CPU), and the backward reads the log_alpha it is
given only where ATen's does, so eager's uninitialized entries cannot leak in."""

from __future__ import annotations

import torch

from ..context import ir, stablehlo
from .. import ir as hlo
from .helpers import array_constant, compare, convert, dtype, full, iota, reshape, select, shape_of, transpose
from .indexing import clamp_index, gather, prefix_sum_last_axis
from .reduction import reduce_max, reduce_sum
from .registry import LoweringContext, Padding, lowers, metadata_rule

aten = torch.ops.aten

_INDEX = torch.int32
_NEG_INF = float("-inf")


# -- operands --------------------------------------------------------------------------------------
def _lengths(lengths, batch: int) -> ir.Value:
    """Per-element lengths as a (batch,) int32 value: a list's values become constants,
    a tensor's stay run-time values."""
    if isinstance(lengths, ir.Value):
        return reshape(convert(lengths, _INDEX), [batch])
    return array_constant(torch.tensor([int(n) for n in lengths], dtype=torch.int64), _INDEX)


def _target_labels(targets: ir.Value, target_lengths: ir.Value, batch: int, max_target: int, classes: int) -> ir.Value:
    """(batch, max_target) int32 labels of each element's target: rows of a padded 2-D
    targets tensor, or slices of a 1-D concatenation starting where the previous
    elements' targets end. Positions past an element's target length (whose states are
    masked) are clamped into range so the gathers that read them stay in bounds."""
    labels = convert(targets, _INDEX)
    if len(shape_of(targets)) == 2:
        return clamp_index(labels, 0, classes - 1)
    (total,) = shape_of(targets)
    if total == 0 or max_target == 0:
        return full(0, _INDEX, [batch, max_target])
    starts = hlo.sub(prefix_sum_last_axis(target_lengths), target_lengths)  # exclusive prefix sum
    positions = hlo.add(
        hlo.broadcast_in_dim(starts, [batch, max_target], [0]),
        iota([batch, max_target], 1, _INDEX),
    )
    positions = clamp_index(positions, 0, total - 1)
    picked = gather(labels, reshape(positions, [batch, max_target, 1]), collapsed_slice_dims=[0],
                    start_index_map=[0], index_vector_dim=2, slice_sizes=[1])
    return clamp_index(picked, 0, classes - 1)


def _extended_labels(labels: ir.Value, blank: int) -> ir.Value:
    """l' (batch, 2 * max_target + 1): blank, label 0, blank, label 1, ..., blank."""
    batch, max_target = shape_of(labels)
    blanks = full(blank, _INDEX, [batch, max_target, 1])
    pairs = hlo.concatenate([blanks, reshape(labels, [batch, max_target, 1])], 2)
    return hlo.concatenate([reshape(pairs, [batch, 2 * max_target]), full(blank, _INDEX, [batch, 1])], 1)


def _shift_states(x: ir.Value, by: int, fill) -> ir.Value:
    """x[:, s - by] along the last (state) dim, `fill` where that leaves the sequence
    (by > 0 reads lower states, by < 0 higher ones)."""
    *lead, states = shape_of(x)
    rank = len(lead) + 1
    pad_value = full(fill, dtype(x), [])
    if by > 0:
        kept = hlo.slice_in_dim(x, rank - 1, 0, max(states - by, 0))
        return stablehlo.PadOp(kept, pad_value, [0] * (rank - 1) + [min(by, states)], [0] * rank, [0] * rank).result
    kept = hlo.slice_in_dim(x, rank - 1, min(-by, states), states)
    return stablehlo.PadOp(kept, pad_value, [0] * rank, [0] * (rank - 1) + [min(-by, states)], [0] * rank).result


def _skip_allowed(extended: ir.Value) -> ir.Value:
    """(batch, states) i1: the transition s - 2 -> s exists (l'[s] != l'[s - 2]; never
    between blanks, and never for s < 2)."""
    below = _shift_states(extended, 2, -1)  # -1 is no label, but s < 2 must not skip
    has_below = compare(iota(shape_of(extended), 1, _INDEX), full(2, _INDEX, shape_of(extended)), "GE")
    return hlo.logical_and(has_below, compare(extended, below, "NE"))


def _state_log_probs(log_probs: ir.Value, extended: ir.Value) -> ir.Value:
    """(T, batch, states): log_probs[t, b, l'[b, s]]."""
    steps, batch, _ = shape_of(log_probs)
    (_, states) = shape_of(extended)
    index = hlo.broadcast_in_dim(extended, [steps, batch, states, 1], [1, 2])
    return gather(log_probs, index, collapsed_slice_dims=[2], start_index_map=[2], index_vector_dim=3,
                  slice_sizes=[1, 1, 1], operand_batching_dims=[0, 1], start_indices_batching_dims=[0, 1])


def _final_blank_state(target_lengths: ir.Value, states: int) -> ir.Value:
    """(batch, states): 2 * target_length, each element's last state (its final blank),
    along every row."""
    shape = [shape_of(target_lengths)[0], states]
    return hlo.mul(hlo.broadcast_in_dim(target_lengths, shape, [0]), full(2, _INDEX, shape))


def _states_in_target(target_lengths: ir.Value, states: int) -> ir.Value:
    """(batch, states) i1: s <= 2 * target_length, the states ATen visits."""
    last = _final_blank_state(target_lengths, states)
    return compare(iota(shape_of(last), 1, _INDEX), last, "LE")


class _Problem:
    """What the alpha and beta recursions share: the per-state log probabilities, the
    skip transitions, and the masks of the states and times each element visits."""

    def __init__(self, log_probs, targets, input_lengths, target_lengths, blank: int, max_target: int):
        steps, batch, classes = shape_of(log_probs)
        self.steps, self.batch, self.states = steps, batch, 2 * max_target + 1
        self.input_lengths = _lengths(input_lengths, batch)
        self.target_lengths = _lengths(target_lengths, batch)
        labels = _target_labels(targets, self.target_lengths, batch, max_target, classes)
        self.extended = _extended_labels(labels, blank)
        self.skip = _skip_allowed(self.extended)
        self.state_log_probs = _state_log_probs(log_probs, self.extended)
        self.in_target = _states_in_target(self.target_lengths, self.states)
        self.dtype = dtype(log_probs)

    def row_shape(self) -> list[int]:
        return [self.batch, self.states]

    def neg_inf_row(self) -> ir.Value:
        return full(_NEG_INF, self.dtype, self.row_shape())

    def log_probs_at(self, t: ir.Value) -> ir.Value:
        """state_log_probs[t] for a 0-d int32 t: (batch, states)."""
        zero = full(0, _INDEX, [])
        row = stablehlo.DynamicSliceOp(self.state_log_probs, [t, zero, zero], [1, self.batch, self.states]).result
        return reshape(row, self.row_shape())

    def time_compare(self, t: ir.Value, direction: str, offset: int = 0) -> ir.Value:
        """(batch, states) i1: `t <direction> input_length + offset` per element."""
        bound = hlo.add(self.input_lengths, full(offset, _INDEX, [self.batch]))
        return compare(
            hlo.broadcast_in_dim(t, self.row_shape(), []),
            hlo.broadcast_in_dim(bound, self.row_shape(), [0]),
            direction,
        )

    def visited(self) -> ir.Value:
        """(T, batch, states) i1: t < input_length and s <= 2 * target_length."""
        shape = [self.steps, self.batch, self.states]
        times = compare(iota(shape, 0, _INDEX), hlo.broadcast_in_dim(self.input_lengths, shape, [1]), "LT")
        in_target = hlo.broadcast_in_dim(self.in_target, shape, [1, 2])
        return hlo.logical_and(times, in_target)


def _log_sum_exp3(a: ir.Value, b: ir.Value, c: ir.Value) -> ir.Value:
    """log(exp(a) + exp(b) + exp(c)) as ATen writes it: shifted by the maximum, with a
    maximum of -inf replaced by 0 (so three -inf give -inf, not NaN)."""
    top = hlo.maximum(hlo.maximum(a, b), c)
    top = select(compare(top, full(_NEG_INF, dtype(top), shape_of(top)), "EQ"), full(0, dtype(top), shape_of(top)), top)
    total = hlo.add(hlo.add(hlo.exp(hlo.sub(a, top)), hlo.exp(hlo.sub(b, top))), hlo.exp(hlo.sub(c, top)))
    return hlo.add(hlo.log(total), top)


def _write_row(buffer: ir.Value, row: ir.Value, t: ir.Value) -> ir.Value:
    _, batch, states = shape_of(buffer)
    zero = full(0, _INDEX, [])
    return stablehlo.DynamicUpdateSliceOp(buffer, reshape(row, [1, batch, states]), [t, zero, zero]).result


# -- forward -----------------------------------------------------------------------------------------
def _alpha(problem: _Problem) -> tuple[ir.Value, ir.Value]:
    """(log_alpha (T, batch, states) masked to the visited states, alpha's row at each
    element's last input step (batch, states))."""
    neg_inf = problem.neg_inf_row()
    states = iota(problem.row_shape(), 1, _INDEX)
    first_states = compare(states, full(1, _INDEX, problem.row_shape()), "LE")
    zero_t = full(0, _INDEX, [])
    active0 = hlo.logical_and(problem.in_target, problem.time_compare(zero_t, "LT"))
    row0 = select(hlo.logical_and(first_states, active0), problem.log_probs_at(zero_t), neg_inf)
    buffer = _write_row(full(_NEG_INF, problem.dtype, [problem.steps] + problem.row_shape()), row0, zero_t)
    last0 = select(problem.time_compare(zero_t, "EQ", -1), row0, neg_inf)

    def step(t, carried):
        buffer, previous, last = carried
        stay = previous
        advance = _shift_states(previous, 1, _NEG_INF)
        skip = select(problem.skip, _shift_states(previous, 2, _NEG_INF), neg_inf)
        row = hlo.add(_log_sum_exp3(stay, advance, skip), problem.log_probs_at(t))
        row = select(hlo.logical_and(problem.in_target, problem.time_compare(t, "LT")), row, neg_inf)
        last = select(problem.time_compare(t, "EQ", -1), row, last)
        return [_write_row(buffer, row, t), row, last]

    buffer, _, last = hlo.fori_loop(1, problem.steps, [buffer, row0, last0], step)
    return buffer, last


def _state_max(row: ir.Value, wanted: ir.Value) -> ir.Value:
    """max over s of row[b, s] where wanted[b, s]: (batch,); -inf where none is."""
    return reduce_max(select(wanted, row, full(_NEG_INF, dtype(row), shape_of(row))), [1])


def _neg_log_likelihood(problem: _Problem, last: ir.Value) -> ir.Value:
    """-log(alpha[T_b - 1, 2 L_b] + alpha[T_b - 1, 2 L_b - 1]), the final blank alone for
    an empty target; an element without input steps has likelihood 1 for an empty
    target and 0 otherwise."""
    shape = problem.row_shape()
    states = iota(shape, 1, _INDEX)
    last_state = _final_blank_state(problem.target_lengths, problem.states)
    final_blank = _state_max(last, compare(states, last_state, "EQ"))
    final_label = _state_max(last, compare(states, hlo.sub(last_state, full(1, _INDEX, shape)), "EQ"))
    neg_inf = full(_NEG_INF, problem.dtype, [problem.batch])
    log_likelihood = _log_sum_exp3(final_blank, final_label, neg_inf)
    zero_lengths = full(0, _INDEX, [problem.batch])
    no_input = compare(problem.input_lengths, zero_lengths, "EQ")
    empty_target = compare(problem.target_lengths, zero_lengths, "EQ")
    without_input = select(empty_target, full(0, problem.dtype, [problem.batch]), neg_inf)
    log_likelihood = select(no_input, without_input, log_likelihood)
    return hlo.neg(log_likelihood)


def _max_target_length(ctx: LoweringContext) -> int:
    """From log_alpha's static last dim, 2 * max_target_length + 1 (for 1-D targets ATen
    takes the maximum of the lengths' values, which the traced shape already holds)."""
    return (ctx.result_shape(1)[-1] - 1) // 2


@lowers(aten._ctc_loss.default, aten._ctc_loss.Tensor, dynamic=Padding.EAGER)
def _ctc_loss(ctx, log_probs, targets, input_lengths, target_lengths, blank=0, zero_infinity=False):
    # zero_infinity only changes the backward here: ctc_loss zeroes infinite losses after
    # this op, as on CPU.
    if len(shape_of(log_probs)) != 3:
        raise ctx.fail("_ctc_loss takes log_probs of shape (T, batch, classes)")
    problem = _Problem(log_probs, targets, input_lengths, target_lengths, blank, _max_target_length(ctx))
    log_alpha, last = _alpha(problem)
    return _neg_log_likelihood(problem, last), transpose(log_alpha, [1, 0, 2])


# -- backward ----------------------------------------------------------------------------------------
def _beta(problem: _Problem) -> ir.Value:
    """log_beta (T, batch, states), -inf outside the visited states: at t = T_b - 1 the
    final blank and final label, then the recursion down to t = 0."""
    neg_inf = problem.neg_inf_row()
    shape = problem.row_shape()
    states = iota(shape, 1, _INDEX)
    last_state = _final_blank_state(problem.target_lengths, problem.states)
    final_states = hlo.logical_or(compare(states, last_state, "EQ"),
                                  compare(states, hlo.sub(last_state, full(1, _INDEX, shape)), "EQ"))
    skip_from_above = _shift_states(problem.skip, -2, False)

    def step(i, carried):
        buffer, following = carried
        t = hlo.sub(full(problem.steps - 1, _INDEX, []), i)
        stay = following
        advance = _shift_states(following, -1, _NEG_INF)
        skip = select(skip_from_above, _shift_states(following, -2, _NEG_INF), neg_inf)
        log_probs_t = problem.log_probs_at(t)
        recursed = hlo.add(_log_sum_exp3(stay, advance, skip), log_probs_t)
        row = select(problem.time_compare(t, "LT", -1), recursed, neg_inf)
        row = select(hlo.logical_and(problem.time_compare(t, "EQ", -1), final_states), log_probs_t, row)
        row = select(problem.in_target, row, neg_inf)
        return [_write_row(buffer, row, t), row]

    buffer, _ = hlo.fori_loop(0, problem.steps, [full(_NEG_INF, problem.dtype, [problem.steps] + shape), neg_inf], step)
    return buffer


def _log_alpha_beta_per_class(log_alpha_beta: ir.Value, extended: ir.Value, classes: int) -> ir.Value:
    """(T, batch, classes): log of the sum of exp(log_alpha + log_beta) over the states
    whose label is each class (-inf for a class no state carries)."""
    steps, batch, states = shape_of(log_alpha_beta)
    shape = [steps, batch, states, classes]
    dt = dtype(log_alpha_beta)
    values = hlo.broadcast_in_dim(log_alpha_beta, shape, [0, 1, 2])
    labels = hlo.broadcast_in_dim(extended, shape, [1, 2])
    of_class = compare(labels, iota(shape, 3, _INDEX), "EQ")
    values = select(of_class, values, full(_NEG_INF, dt, shape))
    top = reduce_max(values, [2])
    # A class without finite terms keeps -inf (and avoids -inf - -inf).
    finite_top = select(compare(top, full(_NEG_INF, dt, shape_of(top)), "EQ"), full(0, dt, shape_of(top)), top)
    shifted = hlo.exp(hlo.sub(values, hlo.broadcast_in_dim(finite_top, shape, [0, 1, 3])))
    total = reduce_sum(shifted, [2])
    return hlo.add(hlo.log(total), finite_top)


@lowers(aten._ctc_loss_backward.default, aten._ctc_loss_backward.Tensor, dynamic=Padding.EAGER)
def _ctc_loss_backward(ctx, grad, log_probs, targets, input_lengths, target_lengths, neg_log_likelihood, log_alpha,
                       blank, zero_infinity=False):
    shape = shape_of(log_probs)
    if len(shape) != 3:
        raise ctx.fail("_ctc_loss_backward takes log_probs of shape (T, batch, classes)")
    steps, batch, classes = shape
    problem = _Problem(log_probs, targets, input_lengths, target_lengths, blank, (shape_of(log_alpha)[-1] - 1) // 2)
    dt = problem.dtype
    visited = problem.visited()
    alpha = select(visited, transpose(log_alpha, [1, 0, 2]), full(_NEG_INF, dt, shape_of(visited)))
    log_collected = _log_alpha_beta_per_class(hlo.add(alpha, _beta(problem)), problem.extended, classes)
    nll = hlo.broadcast_in_dim(reshape(neg_log_likelihood, [batch]), shape, [1])
    gradient = hlo.mul(
        hlo.sub(hlo.exp(log_probs), hlo.exp(hlo.sub(hlo.add(log_collected, nll), log_probs))),
        hlo.broadcast_in_dim(reshape(grad, [batch]), shape, [1]),
    )
    in_input = compare(iota(shape, 0, _INDEX), hlo.broadcast_in_dim(problem.input_lengths, shape, [1]), "LT")
    keep = in_input
    if zero_infinity:
        finite = compare(nll, full(float("inf"), dt, shape), "NE")
        keep = hlo.logical_and(keep, finite)
    return select(keep, gradient, full(0, dt, shape))


# -- result metadata for the eager device --------------------------------------------------------------
@metadata_rule(aten._ctc_loss.default, aten._ctc_loss.Tensor)
def _ctc_loss_metadata(log_probs, targets, input_lengths, target_lengths, blank=0, zero_infinity=False):
    """(neg_log_likelihood (batch,), log_alpha (batch, T, 2 * max_target_length + 1)):
    the CPU kernel's shapes, which PyTorch's fake kernel refuses to give (for 1-D targets
    the last dim depends on the lengths' values; from tensor lengths it cannot be known,
    and the op runs on the CPU)."""
    if targets.dim() == 2:
        max_target = targets.shape[1]
    elif isinstance(target_lengths, torch.Tensor):
        raise RuntimeError("_ctc_loss with 1-D targets and tensor lengths: log_alpha's size depends on their values")
    else:
        max_target = max((int(n) for n in target_lengths), default=0)
    steps, batch = log_probs.shape[0], log_probs.shape[1]
    return log_probs.new_empty((batch,)), log_probs.new_empty((batch, steps, 2 * max_target + 1))


@metadata_rule(aten._ctc_loss_backward.default, aten._ctc_loss_backward.Tensor)
def _ctc_loss_backward_metadata(grad, log_probs, *args, **kwargs):
    """The gradient has log_probs' shape (PyTorch has no fake kernel for the op)."""
    return torch.empty_like(log_probs)
