"""A repeating compiled training step is launched at its forward's call
(TORCH_TPU_EARLY_STEP_LAUNCH, `device/_early_launch.py`): the step's last program runs on
the buffers its storages hold then, and the step's end keeps those results only when the
recorded step is that program reading those very buffers. Every test compares with the
same training without the early launch: a hit is the same program on the same values, a
miss runs the step as recorded."""

from __future__ import annotations

import logging

import pytest
import torch
import torch.nn as nn

from torch_tpu.device import _early_launch, _fused

from compiled_step_model import compiled_whole_step, fresh_whole_step, tiny_classifier


def _data():
    torch.manual_seed(1)
    return torch.randn(6, 8).to("tpu"), torch.arange(6).remainder(4).to("tpu")


def _train(make_step, steps: int = 7, between=None, dropout: float = 0.0):
    """(losses, parameters after, early-launch counts) of `steps` steps reading the loss
    after each; `between(model, opt, i)` runs between the backward and the optimizer step
    when the step takes it."""
    torch._dynamo.reset()
    torch.tpu.manual_seed(7)
    # Each training sees its traces for the first time, so that the runs compared take the
    # same path (graph by graph, then fused) at the same steps: the paths differ in the last bits.
    _fused._PROGRAMS.clear()
    _fused._SEEN_ONCE.clear()
    _fused._OUTPUTS_BEFORE.clear()
    _early_launch._PROGRAMS.clear()
    model = tiny_classifier(dropout).to("tpu")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    step = make_step(model, opt) if between is None else make_step(model, opt, between)
    x, y = _data()
    before = dict(_early_launch.STATS)
    losses = [step(x, y).item() for _ in range(steps)]
    counts = {k: v - before[k] for k, v in _early_launch.STATS.items()}
    return losses, [p.detach().cpu() for p in model.parameters()], counts


def _split_step(model, opt, between):
    """The forward and the optimizer step compiled apart, user code between them."""
    compiled = torch.compile(model, backend="tpu")
    update = torch.compile(opt.step, backend="tpu")
    calls = [0]

    def step(x, y):
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(compiled(x), y)
        loss.backward()
        between(model, opt, calls[0])
        calls[0] += 1
        update()
        return loss.detach()

    return step


def _bitwise(a, b):
    assert a[0] == b[0]
    for p, q in zip(a[1], b[1]):
        assert torch.equal(p, q)


@pytest.fixture
def without(monkeypatch):
    """`run(fn, *args)`: `fn(*args)` with TORCH_TPU_EARLY_STEP_LAUNCH=0."""
    def run(fn, *args, **kwargs):
        with monkeypatch.context() as m:
            m.setenv("TORCH_TPU_EARLY_STEP_LAUNCH", "0")
            return fn(*args, **kwargs)
    return run


def test_a_repeating_step_runs_the_program_launched_at_its_forward(without):
    early = _train(compiled_whole_step)
    late = without(_train, compiled_whole_step)
    # Step 1 is its own program (AdamW creates its states); steps 2 and 3 run graph by
    # graph (the third compiles the step's program), step 4 runs it and compiles it again
    # without donation; steps 5 to 7 are launched early.
    assert early[2] == {"launches": 3, "hits": 3, "misses": 0}, early[2]
    assert late[2] == {"launches": 0, "hits": 0, "misses": 0}
    _bitwise(early, late)


def test_a_step_with_dropout_is_launched_with_the_key_its_forward_drew(without):
    """The forward graph's RNG key is drawn when the graph is recorded, before the launch:
    the launch passes it, and the step's masks are those of the step run at its end."""
    early = _train(compiled_whole_step, dropout=0.3)
    late = without(_train, compiled_whole_step, dropout=0.3)
    assert early[2] == {"launches": 3, "hits": 3, "misses": 0}, early[2]
    _bitwise(early, late)


def _fused_whole_step(model, opt):
    """The compiled whole step, each call in FUSED mode (leaving the mode flushes)."""
    from torch_tpu.device import EagerMode, set_eager_mode

    compiled = compiled_whole_step(model, opt)

    def step(x, y):
        with set_eager_mode(EagerMode.FUSED):
            return compiled(x, y)

    return step


def test_a_compiled_step_in_fused_mode_is_launched_at_its_forward(without):
    """FUSED mode records the training forward as the trace's first op too: from the step
    after its first fused run, the step is launched there."""
    early = _train(_fused_whole_step)
    late = without(_train, _fused_whole_step)
    # FUSED compiles a trace at its first sighting: step 2 runs op by op while its program
    # compiles, step 3 runs it, steps 4 to 7 are launched early.
    assert early[2] == {"launches": 4, "hits": 4, "misses": 0}, early[2]
    _bitwise(early, late)


def test_a_state_written_between_forward_and_step_drops_the_launch(without):
    """The same program, but one optimizer state is another buffer than at the launch."""
    def halve_a_moment(model, opt, i):
        if i == 4:
            with torch.no_grad():
                opt.state[model[0].weight]["exp_avg"].mul_(0.5)

    early = _train(_split_step, between=halve_a_moment)
    late = without(_train, _split_step, between=halve_a_moment)
    assert early[2]["misses"] == 1 and early[2]["hits"] == early[2]["launches"] - 1 >= 2, early[2]
    _bitwise(early, late)


def test_a_parameter_written_between_forward_and_step_drops_the_launch(without):
    def shrink(model, opt, i):
        if i == 5:
            with torch.no_grad():
                model[3].weight.mul_(0.9)

    early = _train(_split_step, between=shrink)
    late = without(_train, _split_step, between=shrink)
    assert early[2]["misses"] == 1, early[2]
    _bitwise(early, late)


def test_a_step_that_differs_every_time_stops_being_launched_early(without, caplog):
    """Eager AdamW increments its step counters before the deferred ops read them, so the
    counters the launch found are never the ones the step reads: two misses, then none."""
    def eager_step(model, opt):
        compiled = torch.compile(model, backend="tpu")

        def step(x, y):
            opt.zero_grad(set_to_none=True)
            nn.functional.cross_entropy(compiled(x), y).backward()
            opt.step()
            return torch.zeros(())

        return step

    with caplog.at_level(logging.INFO, logger="torch_tpu"):
        early = _train(eager_step, steps=9)
    late = without(_train, eager_step, steps=9)
    assert early[2] == {"launches": 2, "hits": 0, "misses": 2}, early[2]
    assert "turned out different 2 times in a row" in caplog.text
    _bitwise(early, late)


def test_reading_a_result_mid_step_drops_the_launch(without):
    def read_loss(model, opt, i):
        if i == 4:
            model[0].weight.grad.sum().item()  # the deferred step runs here, as it is so far

    early = _train(_split_step, between=read_loss)
    late = without(_train, _split_step, between=read_loss)
    assert early[2]["misses"] == 1, early[2]
    _bitwise(early, late)


def test_no_early_launch_where_the_undonated_step_would_not_fit(monkeypatch, without, caplog):
    from torch_tpu.runtime.client import Device

    monkeypatch.setattr(Device, "memory_stats", lambda self: {"bytes_limit": 1000, "bytes_in_use": 900})
    _early_launch._NO_ROOM.clear()
    with caplog.at_level(logging.INFO, logger="torch_tpu"):
        early = _train(compiled_whole_step)
    _early_launch._NO_ROOM.clear()
    assert early[2]["launches"] == 0, early[2]
    assert "is not launched early: without donation it would need" in caplog.text
    assert "beside the 0.00 GB the device holds" in caplog.text
    assert caplog.text.count("is not launched early") == 1  # checked at each flush, said once
    _bitwise(early, without(_train, compiled_whole_step))


def test_a_step_refused_at_its_flush_is_planned_once_memory_is_freed(monkeypatch, without):
    from torch_tpu.runtime.client import Device

    in_use = [10**9]  # the device full: refused at the flush
    monkeypatch.setattr(Device, "memory_stats", lambda self: {"bytes_limit": 10**9, "bytes_in_use": in_use[0]})
    _early_launch._NO_ROOM.clear()

    def freed_at_step_5(model, opt, i):
        if i == 5:
            in_use[0] = 0

    early = _train(_split_step, steps=8, between=freed_at_step_5)
    _early_launch._NO_ROOM.clear()
    # Refused at the flushes before, planned at step 5's (the memory freed just before it),
    # launched at steps 6 and 7; with the memory free from the start the same training
    # launches 4 times.
    assert early[2] == {"launches": 2, "hits": 2, "misses": 0}, early[2]
    in_use[0] = 10**9
    _bitwise(early, without(_train, _split_step, steps=8, between=freed_at_step_5))


def test_a_high_peak_from_earlier_work_does_not_stop_the_launch(monkeypatch, without):
    """The check is against the memory in use now: the process's peak only ever grows (an
    earlier step, an evaluation at a larger batch, another model), and a room rule on it
    stopped every later step's launches for good (on the chip: a compiled step in FUSED
    mode run after the Strict one, 0 launches)."""
    from torch_tpu.runtime.client import Device

    monkeypatch.setattr(Device, "memory_stats", lambda self: {
        "bytes_limit": 10**9, "bytes_in_use": 10**6, "peak_bytes_in_use": 10**9})
    _early_launch._NO_ROOM.clear()
    early = _train(compiled_whole_step)
    assert early[2] == {"launches": 3, "hits": 3, "misses": 0}, early[2]  # as with no limit at all
    _bitwise(early, without(_train, compiled_whole_step))


def test_the_launch_checks_the_programs_own_memory_each_step(monkeypatch, without, caplog):
    """At the launch, what the undonated program allocates (XLA's analysis: outputs and
    temporaries) must fit beside what the device holds; a refused step is checked again at
    the next one, so memory freed since lets it launch."""
    from torch_tpu.runtime.client import Device
    from torch_tpu.runtime.executable import Executable

    monkeypatch.setattr(Device, "memory_stats", lambda self: {"bytes_limit": 10**8, "bytes_in_use": 0})
    temp = [10**9]  # more than the device: refused
    real = Executable.memory_analysis
    monkeypatch.setattr(Executable, "memory_analysis",
                        lambda self: {**(real(self) or {"output": 0, "alias": 0, "argument": 0}), "temp": temp[0]})
    _early_launch._NO_ROOM.clear()

    def freed_at_step_4(model, opt, i):
        if i == 4:
            temp[0] = 0

    with caplog.at_level(logging.INFO, logger="torch_tpu"):
        early = _train(_split_step, steps=8, between=freed_at_step_4)
    assert caplog.text.count("(its outputs and temporaries)") == 1  # logged once, checked each step
    assert "1.00 GB (its outputs and temporaries) beside the 0.00 GB the device holds" in caplog.text
    # Refused at steps 2-4 (step 4's launch comes before its `between`), launched from step 5 on.
    assert early[2] == {"launches": 3, "hits": 3, "misses": 0}, early[2]
    temp[0] = 0
    _bitwise(early, without(_train, _split_step, steps=8, between=freed_at_step_4))


def test_a_launch_that_fails_leaves_the_step_to_its_end(monkeypatch, without, caplog):
    class Refusing:
        def buffers(self, *args):
            raise RuntimeError("RESOURCE_EXHAUSTED: out of memory (injected)")

    real = _fused._loaded
    monkeypatch.setattr(_fused, "_loaded", lambda future, n: Refusing() if n and future in
                        _early_launch._PROGRAMS.values() else real(future, n))
    with caplog.at_level(logging.WARNING, logger="torch_tpu"):
        early = _train(compiled_whole_step)
    assert early[2] == {"launches": 0, "hits": 0, "misses": 0}, early[2]
    assert "launching a compiled training step early failed (RuntimeError: RESOURCE_EXHAUSTED" in caplog.text
    _bitwise(early, without(_train, compiled_whole_step))


def test_the_early_launch_holds_no_buffer_after_the_step():
    """Each step's launch arguments and dropped results are released: live device arrays
    stay level from step to step."""
    from torch_tpu.runtime import _jaxlib, get_client

    model, step = fresh_whole_step()
    x, y = _data()
    counts = []
    for _ in range(8):
        step(x, y).item()
        counts.append(len(_jaxlib.live_arrays(get_client()._raw)))
    assert counts[-1] == counts[-3], counts


# -- steps as users write them: each compared bit for bit with the step run at its end ------------
def _train_on_batches(build, steps: int = 8):
    """`_train` for a step `build()` -> (model, step) makes, on a new batch every step;
    the model's whole state_dict compared (BatchNorm's running statistics included)."""
    torch._dynamo.reset()
    torch.tpu.manual_seed(7)
    _fused._PROGRAMS.clear()
    _fused._SEEN_ONCE.clear()
    _fused._OUTPUTS_BEFORE.clear()
    _early_launch._PROGRAMS.clear()
    model, step = build()
    torch.manual_seed(1)
    batches = [(torch.randn(6, 8).to("tpu"), torch.arange(6).remainder(4).to("tpu")) for _ in range(steps)]
    before = dict(_early_launch.STATS)
    losses = [step(x, y).item() for x, y in batches]
    counts = {k: v - before[k] for k, v in _early_launch.STATS.items()}
    return losses, [t.detach().cpu() for t in model.state_dict().values()], counts


def _whole_step_of(model, opt):
    return model, compiled_whole_step(model, opt)


def _new_batch_every_step():
    model = tiny_classifier().to("tpu")
    return _whole_step_of(model, torch.optim.AdamW(model.parameters(), lr=1e-2))


def _batch_norm_step():
    """A forward that writes buffers (BatchNorm's running statistics), SGD with momentum."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 4)).to("tpu")
    return _whole_step_of(model, torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9))


def _scheduled_step():
    """A learning rate that changes every step (a scheduler between the steps): the
    optimizer graph reads a new number each time."""
    model = tiny_classifier().to("tpu")
    opt = torch.optim.SGD(model.parameters(), lr=1e-1)
    forward, update = torch.compile(model, backend="tpu"), torch.compile(opt.step, backend="tpu")
    schedule = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: 1.0 / (1 + i))

    def step(x, y):
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(forward(x), y)
        loss.backward()
        update()
        schedule.step()
        return loss.detach()

    return model, step


def _accumulating_step():
    """Two forwards and backwards (half batches) per optimizer step."""
    model = tiny_classifier().to("tpu")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    forward, update = torch.compile(model, backend="tpu"), torch.compile(opt.step, backend="tpu")

    def step(x, y):
        opt.zero_grad(set_to_none=True)
        for half in (slice(0, 3), slice(3, 6)):
            loss = nn.functional.cross_entropy(forward(x[half]), y[half]) / 2
            loss.backward()
        update()
        return loss.detach()

    return model, step


def _evaluating_step():
    """Each training step followed by an evaluation forward (model.eval(), no_grad,
    dropout off) whose result is read."""
    model = tiny_classifier(0.3).to("tpu")
    _, train = _whole_step_of(model, torch.optim.AdamW(model.parameters(), lr=1e-2))
    evaluate = torch.compile(model, backend="tpu")

    def step(x, y):
        model.train()
        loss = train(x, y)
        model.eval()
        with torch.no_grad():
            evaluate(x).sum().item()
        return loss

    return model, step


@pytest.mark.parametrize("build, counts", [
    # Steps 5 to 8 launched early and kept: each launch reads that step's batch.
    (_new_batch_every_step, {"launches": 4, "hits": 4, "misses": 0}),
    (_batch_norm_step, {"launches": 3, "hits": 3, "misses": 0}),
    # The launched step read the last learning rate: dropped twice, then not launched again.
    (_scheduled_step, {"launches": 2, "hits": 0, "misses": 2}),
    # Two forwards per step (a trace holds each compiled graph once): no launch is made.
    (_accumulating_step, {"launches": 0, "hits": 0, "misses": 0}),
    # The evaluation forward between the steps changes nothing the next step reads.
    (_evaluating_step, {"launches": 4, "hits": 4, "misses": 0}),
])
def test_a_users_step_trains_as_when_run_at_its_end(build, counts, without):
    early = _train_on_batches(build)
    late = without(_train_on_batches, build)
    assert early[2] == counts, early[2]
    _bitwise(early, late)
