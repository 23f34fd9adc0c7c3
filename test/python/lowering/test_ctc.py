"""CTC loss lowerings (`_ctc_loss`, `_ctc_loss_backward`) against eager on CPU.

PyTorch's fake kernel refuses `_ctc_loss` (its log_alpha's size can depend on the lengths'
values), so `harness.check`'s fake tracing cannot reach it: these tests trace with real
tensors (the graph then has the shapes eager gives) or build the op's one-node graph."""

import pytest
import torch
import torch.nn.functional as F
import torch.utils._pytree as pytree
from direct_graph import run_direct
from harness import execute
from torch.fx.experimental.proxy_tensor import make_fx
from torch_tpu.compiler.importer import import_graph

aten = torch.ops.aten
torch.manual_seed(0)

STEPS, BATCH, CLASSES, MAX_TARGET = 7, 4, 6, 3
INPUT_LENGTHS = [7, 5, 2, 6]  # element 2: three labels in two steps, an impossible alignment
TARGET_LENGTHS = [3, 1, 3, 0]


def _log_probs(dtype=torch.float32, steps=STEPS, batch=BATCH, classes=CLASSES):
    return torch.randn(steps, batch, classes, dtype=dtype).log_softmax(2)


def _padded_targets(blank=0):
    targets = torch.tensor([[2, 2, 3], [4, 1, 1], [1, 5, 1], [3, 3, 3]])  # 2, 2: the skip rule forbids a skip
    return torch.where(targets == blank, (targets + 1) % CLASSES, targets)


def _concatenated_targets(padded):
    return torch.cat([row[:n] for row, n in zip(padded, TARGET_LENGTHS)])


def _lengths(as_tensor: bool):
    if as_tensor:
        return torch.tensor(INPUT_LENGTHS), torch.tensor(TARGET_LENGTHS)
    return list(INPUT_LENGTHS), list(TARGET_LENGTHS)


def _check_traced(fn, *args, ops):
    """Traces `fn` with real tensors, lowers and runs it, and compares with eager."""
    expected = fn(*args)
    gm = make_fx(fn, tracing_mode="real")(*args)
    targets = {n.target for n in gm.graph.nodes if n.op == "call_function"}
    assert all(op in targets for op in ops), gm.graph
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    actual = execute(import_graph(gm), tensors)
    for a, e in zip(pytree.tree_leaves(actual), pytree.tree_leaves(expected)):
        torch.testing.assert_close(a, e, equal_nan=True)


# (reduction, lengths as tensors) pairs traced through F.ctc_loss. Not ("mean", False):
# ctc_loss then copies the list lengths into a tensor through a raw pointer, which tracing
# records as an uninitialized `empty` (OpInfo's samples avoid the pair for this reason);
# mean's division by the target lengths is covered with tensor lengths.
TRACEABLE_REDUCTIONS = [(reduction, as_tensor) for reduction in ("none", "mean", "sum") for as_tensor in (False, True)
                        if (reduction, as_tensor) != ("mean", False)]


def _visited(input_lengths, target_lengths, steps, states):
    """(batch, T, states) bool: the log_alpha entries ATen's CPU kernel writes (the rest
    is uninitialized memory there)."""
    t = torch.arange(steps)[None, :, None]
    s = torch.arange(states)[None, None, :]
    il = torch.as_tensor(input_lengths)[:, None, None]
    tl = torch.as_tensor(target_lengths)[:, None, None]
    return ((t < il) | (t == 0)) & (s <= 2 * tl)


def _check_forward(op, log_probs, targets, input_lengths, target_lengths, blank=0):
    (nll, log_alpha), (expected_nll, expected_alpha) = run_direct(
        op, log_probs, targets, input_lengths, target_lengths, blank, False)
    torch.testing.assert_close(nll, expected_nll)
    visited = _visited(input_lengths, target_lengths, *log_alpha.shape[1:])
    torch.testing.assert_close(log_alpha[visited], expected_alpha[visited])
    assert torch.all(log_alpha[~visited] == float("-inf"))
    return expected_nll, expected_alpha


# -- forward ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("as_tensor", [False, True])
@pytest.mark.parametrize("concatenated", [False, True])
def test_ctc_loss_forward_and_log_alpha(as_tensor, concatenated):
    targets = _padded_targets()
    if concatenated:
        targets = _concatenated_targets(targets)
    op = aten._ctc_loss.Tensor if as_tensor else aten._ctc_loss.default
    _check_forward(op, _log_probs(), targets, *_lengths(as_tensor))


def test_ctc_loss_blank_not_zero_float64():
    _check_forward(aten._ctc_loss.default, _log_probs(torch.float64), _padded_targets(blank=3), *_lengths(False),
                   blank=3)


def test_ctc_loss_zero_input_length_and_empty_targets():
    input_lengths, target_lengths = [0, 0, 3, 1], [0, 2, 0, 0]
    targets = torch.tensor([[1, 2], [3, 4], [5, 1], [2, 2]])
    (nll, _), (expected, _) = run_direct(aten._ctc_loss.default, _log_probs(), targets, input_lengths,
                                            target_lengths, 0, False)
    torch.testing.assert_close(nll, expected)


@pytest.mark.parametrize("reduction, as_tensor", TRACEABLE_REDUCTIONS)
@pytest.mark.parametrize("zero_infinity", [False, True])
def test_functional_ctc_loss(reduction, zero_infinity, as_tensor):
    op = aten._ctc_loss.Tensor if as_tensor else aten._ctc_loss.default
    input_lengths, target_lengths = _lengths(as_tensor)
    fn = lambda lp, tg: F.ctc_loss(lp, tg, input_lengths, target_lengths, reduction=reduction,  # noqa: E731
                                   zero_infinity=zero_infinity)
    _check_traced(fn, _log_probs(), _padded_targets(), ops=[op])


def test_functional_ctc_loss_concatenated_targets_float64():
    targets = _concatenated_targets(_padded_targets())
    fn = lambda lp, tg, il, tl: F.ctc_loss(lp, tg, il, tl, reduction="mean", blank=0)  # noqa: E731
    _check_traced(fn, _log_probs(torch.float64), targets, *_lengths(True), ops=[aten._ctc_loss.Tensor])


# -- backward --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("zero_infinity", [False, True])
@pytest.mark.parametrize("as_tensor", [False, True])
@pytest.mark.parametrize("concatenated", [False, True])
def test_ctc_loss_backward_from_eager_forward(zero_infinity, as_tensor, concatenated):
    """The backward fed eager's forward results, whose log_alpha holds uninitialized
    memory outside the visited entries (the lowering must not read it)."""
    log_probs, targets = _log_probs(torch.float64), _padded_targets()
    if concatenated:
        targets = _concatenated_targets(targets)
    input_lengths, target_lengths = _lengths(as_tensor)
    forward = aten._ctc_loss.Tensor if as_tensor else aten._ctc_loss.default
    backward = aten._ctc_loss_backward.Tensor if as_tensor else aten._ctc_loss_backward.default
    nll, log_alpha = forward(log_probs, targets, input_lengths, target_lengths, 0, zero_infinity)
    grad = torch.randn(BATCH, dtype=torch.float64)
    actual, expected = run_direct(backward, grad, log_probs, targets, input_lengths, target_lengths, nll, log_alpha,
                                     0, zero_infinity)
    torch.testing.assert_close(actual, expected, equal_nan=True)


@pytest.mark.parametrize("reduction, as_tensor", TRACEABLE_REDUCTIONS)
@pytest.mark.parametrize("zero_infinity", [False, True])
def test_functional_ctc_loss_grad(reduction, zero_infinity, as_tensor):
    input_lengths, target_lengths = _lengths(as_tensor)
    backward = aten._ctc_loss_backward.Tensor if as_tensor else aten._ctc_loss_backward.default

    def grad_of_loss(log_probs, targets):
        log_probs = log_probs.detach().requires_grad_()
        loss = F.ctc_loss(log_probs, targets, input_lengths, target_lengths, blank=2, reduction=reduction,
                          zero_infinity=zero_infinity)
        return torch.autograd.grad(loss.sum(), log_probs)

    _check_traced(grad_of_loss, _log_probs(), _padded_targets(blank=2), ops=[backward])


def test_ctc_loss_grad_long_sequence():
    """A longer time loop and more classes than labels (classes no state carries)."""
    log_probs = _log_probs(torch.float64, steps=40, batch=3, classes=12)
    targets = torch.randint(1, 12, (3, 9))
    targets[0, 3] = targets[0, 2]  # a repeated label
    input_lengths, target_lengths = torch.tensor([40, 31, 18]), torch.tensor([9, 5, 9])

    def grad_of_loss(log_probs, targets, input_lengths, target_lengths):
        log_probs = log_probs.detach().requires_grad_()
        loss = F.ctc_loss(log_probs, targets, input_lengths, target_lengths, reduction="sum")
        return loss, torch.autograd.grad(loss, log_probs)[0]

    _check_traced(grad_of_loss, log_probs, targets, input_lengths, target_lengths,
                  ops=[aten._ctc_loss.Tensor, aten._ctc_loss_backward.Tensor])
