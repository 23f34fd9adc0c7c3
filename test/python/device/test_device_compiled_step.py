"""A compiled training step in Strict mode is one program (issue 28,
TORCH_TPU_FUSE_COMPILED_STEP): the training forward's call on tpu tensors is recorded
instead of run, the graphs called while it waits (the backward, the optimizer step's) and
the eager ops that read its results (the gradient seed, a gradient clipped or
accumulated) join it, and the whole runs after the optimizer step's end (at the next op or
read, so gradients dropped right after the step are not written) -- or at the first
read of a result. Values are those of running each graph when it is called."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from torch_tpu.device import _fused
from torch_tpu.runtime import transfer_stats

from compiled_step_model import compiled_whole_step, fresh_whole_step, tiny_classifier


def _data(batch: int = 6):
    torch.manual_seed(1)
    return torch.randn(batch, 8).to("tpu"), torch.arange(batch).remainder(4).to("tpu")


def _train(make_step, steps: int = 5, dropout: float = 0.0):
    """(losses, parameters after, programs run per step, its loss's read included) of
    `steps` steps of `make_step(model, optimizer)`, reading the loss after each step."""
    torch._dynamo.reset()
    torch.tpu.manual_seed(7)  # the dropout masks: the same keys in the same order
    model = tiny_classifier(dropout).to("tpu")
    step = make_step(model, torch.optim.AdamW(model.parameters(), lr=1e-2))
    x, y = _data()
    losses, programs = [], []
    for _ in range(steps):
        before = transfer_stats().programs_executed
        loss = step(x, y)
        losses.append(loss.item())
        programs.append(transfer_stats().programs_executed - before)
    return losses, [p.detach().cpu() for p in model.parameters()], programs


def _same_training(a, b):
    torch.testing.assert_close(torch.tensor(a[0]), torch.tensor(b[0]), rtol=1e-5, atol=1e-6)
    for p, q in zip(a[1], b[1]):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


def _under(monkeypatch, variable: str, value: str):
    """`run(fn, *args)`: `fn(*args)` with the environment variable set for its duration."""
    def run(fn, *args):
        with monkeypatch.context() as m:
            m.setenv(variable, value)
            return fn(*args)
    return run


@pytest.fixture
def undeferred(monkeypatch):
    """Runs `fn` with each graph run when it is called (TORCH_TPU_FUSE_COMPILED_STEP=0)."""
    return _under(monkeypatch, "TORCH_TPU_FUSE_COMPILED_STEP", "0")


def test_a_compiled_training_step_is_one_program_once_its_trace_repeats(undeferred):
    each = undeferred(_train, compiled_whole_step)
    one = _train(compiled_whole_step)
    assert each[2][-1] >= 4, each[2]  # forward, the gradient seed, backward, AdamW
    # The first run goes graph by graph (a step seen once may never repeat), the second
    # compiles the step's program while it runs graph by graph, later ones run it: one
    # program for the forward, the seed, the backward and AdamW. The graph of the
    # `loss.detach()` after `opt.step()` runs none (a view: `backend/_view_graphs.py`).
    assert one[2][-2:] == [1, 1], one[2]
    assert one[0][-1] < one[0][0]
    _same_training(one, each)


def test_a_compiled_training_step_with_dropout_is_one_program(undeferred):
    """The graphs draw RNG keys (dropout): recorded, each draws the device generator's next
    key as its call would, so the deferred step's masks are those of the graphs run when
    called."""
    each = undeferred(_train, compiled_whole_step, 5, 0.3)
    one = _train(compiled_whole_step, 5, 0.3)
    assert each[2][-1] >= 4, each[2]
    assert one[2][-2:] == [1, 1], one[2]
    _same_training(one, each)
    # The masks differ from step to step: a dropout-free training's losses are others.
    assert one[0] != _train(compiled_whole_step, 5)[0]


def _eager_step_with_clipping(model, opt):
    """The model compiled, the rest eager: clipping and the foreach AdamW read the
    deferred gradients, so they join the step's trace."""
    compiled = torch.compile(model, backend="tpu")

    def step(x, y):
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(compiled(x), y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        opt.step()
        return loss.detach()

    return step


def test_eager_ops_that_read_a_deferred_steps_results_join_its_program(undeferred):
    each = undeferred(_train, _eager_step_with_clipping)
    one = _train(_eager_step_with_clipping)
    # Eager ops that read no deferred value (AdamW's step counters) still run one by one.
    assert one[2][-1] < each[2][-1] // 2, (one[2], each[2])
    _same_training(one, each)


def test_reading_a_result_mid_step_runs_what_was_deferred():
    torch._dynamo.reset()
    model = tiny_classifier().to("tpu")
    compiled = torch.compile(model, backend="tpu")
    x, y = _data()
    compiled(x)  # compiles; from here on a training forward's call is recorded
    out = compiled(x)
    assert _fused.deferring()
    value = out.sum().item()  # a read: the forward runs now
    assert not _fused.deferring()
    assert value == pytest.approx(model(x).sum().item(), rel=1e-5)
    nn.functional.cross_entropy(out, y).backward()  # the backward still finds the saved values
    grads = [p.grad.cpu() for p in model.parameters()]
    model.zero_grad()
    nn.functional.cross_entropy(model(x), y).backward()
    for g, p in zip(grads, model.parameters()):
        torch.testing.assert_close(g, p.grad.cpu(), rtol=1e-5, atol=1e-6)


def test_an_inference_graph_is_not_deferred():
    torch._dynamo.reset()
    model = tiny_classifier().to("tpu")
    compiled = torch.compile(model, backend="tpu")
    x, _ = _data()
    with torch.no_grad():
        compiled(x)
        before = transfer_stats().programs_executed
        compiled(x)
    assert not _fused.deferring()
    assert transfer_stats().programs_executed - before == 1


def test_steps_whose_trace_never_repeats_compile_no_step_program():
    """Each batch size is a new graph and a new trace, seen once: it runs graph by graph
    and compiles no fused program that nothing would reuse."""
    model, step = fresh_whole_step()
    programs = len(_fused._PROGRAMS)
    for batch in (3, 5, 7):
        x, y = _data(batch)
        assert torch.isfinite(step(x, y)).item()
    assert len(_fused._PROGRAMS) == programs


def test_deferral_is_off_with_TORCH_TPU_FUSE_COMPILED_STEP_0(undeferred):
    each = undeferred(_train, compiled_whole_step, 3)
    assert min(each[2]) >= 4, each[2]


def _fresh_compiled_model():
    """(model on tpu, its AdamW, the model under torch.compile), Dynamo's caches reset."""
    torch._dynamo.reset()
    model = tiny_classifier().to("tpu")
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2), torch.compile(model, backend="tpu")


def _accumulating_train(micro_batches: int = 2, steps: int = 4):
    """(losses, parameters after) of steps that accumulate the gradients of `micro_batches`
    forward/backward pairs of one compiled model before each optimizer step."""
    model, opt, compiled = _fresh_compiled_model()
    torch.manual_seed(1)
    xs = [torch.randn(6, 8).to("tpu") for _ in range(micro_batches)]
    y = torch.arange(6).remainder(4).to("tpu")
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        total = 0
        for x in xs:
            loss = nn.functional.cross_entropy(compiled(x), y) / micro_batches
            loss.backward()
            total = total + loss.detach()
        opt.step()
        losses.append(total.item())
    return losses, [p.detach().cpu() for p in model.parameters()]


def test_gradient_accumulation_keeps_its_values(undeferred):
    """The second micro-batch calls the forward graph the trace holds already: the trace
    runs first, and the gradients accumulate across the runs as without deferral."""
    _same_training(_accumulating_train(), undeferred(_accumulating_train))


def test_a_step_abandoned_before_the_optimizer_leaves_training_consistent(undeferred):
    """An exception between backward and `opt.step()` leaves a deferred trace open; the
    next step's `zero_grad` and forward must find the values they would without deferral."""
    def train():
        model, opt, compiled = _fresh_compiled_model()
        x, y = _data()
        losses, open_after_abort = [], []
        for i in range(5):
            try:
                opt.zero_grad()
                loss = nn.functional.cross_entropy(compiled(x), y)
                loss.backward()
                if i == 2:
                    raise ValueError("the user's check")
                opt.step()
                losses.append(loss.item())
            except ValueError:
                open_after_abort.append(_fused.deferring())
        return losses, [p.detach().cpu() for p in model.parameters()], open_after_abort

    deferred, each = train(), undeferred(train)
    assert deferred[2] == [True] and each[2] == [False]  # the case this test is about
    _same_training(deferred, each)


@pytest.fixture
def started_at_backward(monkeypatch):
    """Runs `fn` with the deferred step starting at the backward
    (TORCH_TPU_COMPILED_STEP_START=backward)."""
    return _under(monkeypatch, "TORCH_TPU_COMPILED_STEP_START", "backward")


def test_a_step_started_at_the_backward_runs_the_forward_first(undeferred, started_at_backward):
    each = undeferred(_train, compiled_whole_step, 7)
    split = started_at_backward(_train, compiled_whole_step, 7)
    # The forward's program, the gradient seed (an eager `ones_like`, reading no deferred
    # value), then the backward and AdamW as one program, which runs at the loss's read
    # (the optimizer step ends the trace there), once it is compiled launched at its
    # backward (`_early_launch`): the steps after the fifth. The `loss.detach()` graph
    # runs none (a view: `backend/_view_graphs.py`).
    assert split[2][-2:] == [3, 3], split[2]
    _same_training(split, each)

    def observe():
        model, opt, compiled = _fresh_compiled_model()
        x, y = _data()
        seen = []
        for _ in range(3):
            opt.zero_grad(set_to_none=True)
            loss = nn.functional.cross_entropy(compiled(x), y)
            seen.append(_fused.deferring())  # the forward ran: nothing waits
            loss.backward()
            seen.append(_fused.deferring())  # the backward waits for the optimizer step
            opt.step()
            seen.append(_fused.deferring())
        return seen

    assert started_at_backward(observe)[-3:] == [False, True, False]


def _step_program_outputs(zero_grad_last: bool, steps: int = 4) -> tuple[list[float], list, int]:
    """(losses, parameters after, outputs of the step's program in the loop) of a compiled
    whole step."""
    _fused._OUTPUTS_BEFORE.clear()
    model, step = fresh_whole_step(zero_grad_last)
    x, y = _data()
    losses = [step(x, y) for _ in range(steps)]
    # Each step but the last ran at the next step's first graph; the last runs at the sync.
    (outputs,) = {len(o) for o in _fused._OUTPUTS_BEFORE.values()}  # one program: every step the same
    torch.tpu.synchronize()
    return [loss.item() for loss in losses], [p.detach().cpu() for p in model.parameters()], outputs


def test_gradients_nobody_holds_at_the_next_step_are_not_written():
    """The optimizer step ends the step's trace, which runs at the next op or read: in a loop
    calling `opt.zero_grad(set_to_none=True)` after `opt.step()`, or at the next step's start
    (Dynamo runs `zero_grad` eagerly, before the forward's graph), the gradients are gone by
    then, and the program writes the parameters and AdamW's states but no gradient (what a
    JAX step computes). The `loss.detach()` the step returns is a view and reads nothing
    (`backend/_view_graphs.py`); before, its graph's call ran the step with the gradients
    still held. (A read or a sync while they are held makes them outputs of that run, and of
    the loop's later runs: `_fused._outputs_as_before`.) The values agree."""
    kept = _step_program_outputs(zero_grad_last=False)
    dropped = _step_program_outputs(zero_grad_last=True)
    n_params = len(list(tiny_classifier().parameters()))
    assert kept[2] == dropped[2] > n_params, (kept[2], dropped[2])
    _same_training(kept, dropped)  # (two programs: XLA may fuse them otherwise, in the last bits)


def test_gradients_read_between_steps_are_the_steps_own(undeferred):
    """A loop that reads the gradients after each step (logging their norm, say) gets each
    step's own: the read runs the step's trace with them as outputs."""

    def run():
        _fused._OUTPUTS_BEFORE.clear()
        model, step = fresh_whole_step()
        x, y = _data()
        grads = []
        for _ in range(4):
            step(x, y)
            grads.append([p.grad.cpu() for p in model.parameters()])
        return grads

    for each, one in zip(undeferred(run), run()):
        for p, q in zip(each, one):
            torch.testing.assert_close(q, p, rtol=1e-5, atol=1e-6)
