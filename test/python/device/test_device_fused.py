"""FUSED eager mode (issue 14): ops on tpu tensors are recorded and each flush point runs
them as one program. Recording, liveness (only live values are outputs), aliasing
through views and in-place writes, flush points, the steady-loop cache (0 compiles
after warm-up), background compile, and errors naming the user's line."""

import copy
import inspect

import pytest
import torch

import torch_tpu.device  # noqa: F401 - registers the device where autoload is off
from torch_tpu.device import EagerMode, set_eager_mode
from torch_tpu.device import _fused
from torch_tpu.device._buffers import Pending, entry_of
from torch_tpu.device._gc_policy import PYTHON_DEFAULT_THRESHOLD0
from torch_tpu.runtime import _jaxlib, get_client
from torch_tpu.runtime.errors import ExecutionError

from cpu_only_ops import halve_on_cpu_only


def _pending(t: torch.Tensor) -> bool:
    return type(entry_of(t)._buffer) is Pending


def _next_line() -> int:
    return inspect.currentframe().f_back.f_lineno + 1


@pytest.fixture
def fused(monkeypatch):
    """FUSED mode running each new trace's fused program from its first run on (deterministic counts)."""
    monkeypatch.setenv("TORCH_TPU_FUSED_FIRST_RUN", "1")
    with set_eager_mode(EagerMode.FUSED):
        yield


def test_ops_are_recorded_until_a_flush(fused):
    x = torch.randn(4, 5)
    y = x.to("tpu")
    runs = dict(_fused.STATS)
    z = (y + 1) * 2
    w = z.sum(0)
    assert _pending(z) and _pending(w) and not _pending(y)
    assert z.shape == (4, 5) and w.shape == (5,) and z.stride() == (5, 1) and w.dtype == torch.float32
    assert _fused.STATS["flushes"] == runs["flushes"]
    torch.testing.assert_close(w.cpu(), ((x + 1) * 2).sum(0))
    assert _fused.STATS["flushes"] == runs["flushes"] + 1
    assert not _pending(z) and not _pending(w)  # both live: both were outputs
    torch.testing.assert_close(z.cpu(), (x + 1) * 2)
    assert _fused.STATS["flushes"] == runs["flushes"] + 1  # already there: no new flush


def test_dead_intermediates_are_not_outputs(fused):
    y = torch.randn(64).to("tpu")  # an external input of the trace
    a = y + 1
    b = a * 2
    c = b - 1
    del a, b
    c.cpu()
    key = next(reversed(_fused._PROGRAMS))
    assert key[2] == ((2, 0),)  # only c, the third op's result


def test_writes_through_views_and_into_external_storages(fused):
    base_cpu = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    base = base_cpu.to("tpu")
    row = base[1]
    col = base[:, 2]
    row.mul_(10)
    col.add_(1)
    base.t()[3:5].sub_(0.5)
    view_sum = row.sum()
    expected = base_cpu.clone()
    expected[1].mul_(10)
    expected[:, 2].add_(1)
    expected.t()[3:5].sub_(0.5)
    assert _pending(base)
    torch.testing.assert_close(base.cpu(), expected)
    torch.testing.assert_close(row.cpu(), expected[1])
    torch.testing.assert_close(view_sum.cpu(), expected[1].sum())


def test_a_recorded_op_reads_the_value_of_its_time(fused):
    x = torch.ones(3, device="tpu")
    y = x * 2
    x.copy_(torch.full((3,), 5.0))  # a host write rebinds x's storage: y read the old value
    z = x + 1
    x.add_(1)  # in place after z was recorded
    torch.testing.assert_close(y.cpu(), torch.full((3,), 2.0))
    torch.testing.assert_close(z.cpu(), torch.full((3,), 6.0))
    torch.testing.assert_close(x.cpu(), torch.full((3,), 6.0))
    s = torch.zeros((), dtype=torch.float32)
    a = x * s  # a 0-d CPU tensor: its value when recorded
    s.fill_(100.0)
    torch.testing.assert_close(a.cpu(), torch.zeros(3))


@pytest.mark.parametrize("point", ["item", "bool", "tolist", "print", "synchronize", "leave", "fallback",
                                   "data_dependent", "save"])
def test_flush_points(fused, point, tmp_path, capsys):
    y = torch.tensor([1.0, -2.0, 3.0], device="tpu")
    z = y * 2
    assert _pending(z)
    if point == "item":
        assert z[0].item() == 2.0
    elif point == "bool":
        assert bool(z[0] > 0)
    elif point == "tolist":
        assert z.tolist() == [2.0, -4.0, 6.0]
    elif point == "print":
        print(z)
        assert "tensor([ 2., -4.,  6.], device='tpu:0')" in capsys.readouterr().out
    elif point == "synchronize":
        torch.tpu.synchronize()
    elif point == "leave":
        set_eager_mode(EagerMode.STRICT)
    elif point == "fallback":  # a CPU-only custom op has no lowering: it runs on CPU, reading z's value
        assert halve_on_cpu_only(z).cpu().tolist() == [1.0, -2.0, 3.0]
    elif point == "data_dependent":
        assert torch.nonzero(z > 0).cpu().flatten().tolist() == [0, 2]
    elif point == "save":
        torch.save(z, tmp_path / "z.pt")
        torch.testing.assert_close(torch.load(tmp_path / "z.pt", map_location="cpu"), torch.tensor([2.0, -4.0, 6.0]))
    assert not _pending(z)
    torch.testing.assert_close(z.cpu(), torch.tensor([2.0, -4.0, 6.0]))


def test_max_fused_ops_bounds_a_trace(fused, monkeypatch):
    monkeypatch.setenv("TORCH_TPU_MAX_FUSED_OPS", "4")
    y = torch.zeros(8, device="tpu")
    flushes = _fused.STATS["flushes"]
    for _ in range(10):
        y = y + 1
    assert _fused.STATS["flushes"] == flushes + 2  # traces of 4, 4, then 2 pending
    torch.testing.assert_close(y.cpu(), torch.full((8,), 10.0))


def test_compiled_graph_flushes_first(fused):
    x = torch.randn(5, 3)
    y = x.to("tpu") * 3  # pending when the graph takes it

    @torch.compile(backend="tpu")
    def f(a):
        return torch.sin(a) + 1

    torch.testing.assert_close(f(y).cpu(), torch.sin(x * 3) + 1)


def _mlp_step(model, opt, x, target):
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), target)
    loss.backward()
    opt.step()
    return loss.item()  # the same flush point every step


def test_steady_training_loop_compiles_nothing(fused):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
    cpu_model = copy.deepcopy(model)
    model = model.to("tpu")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    cpu_opt = torch.optim.AdamW(cpu_model.parameters(), lr=1e-2)
    x, target = torch.randn(6, 8), torch.randn(6, 4)
    tx, ttarget = x.to("tpu"), target.to("tpu")
    for _ in range(3):  # warm-up: plans and fused programs compile
        got = _mlp_step(model, opt, tx, ttarget)
        assert got == pytest.approx(_mlp_step(cpu_model, cpu_opt, x, target), rel=1e-4, abs=1e-6)
    stats = get_client().cache.stats
    compiles, fused_runs, flushes = stats.compiles, _fused.STATS["fused_runs"], _fused.STATS["flushes"]
    for _ in range(4):
        got = _mlp_step(model, opt, tx, ttarget)
        assert got == pytest.approx(_mlp_step(cpu_model, cpu_opt, x, target), rel=1e-4, abs=1e-6)
    assert stats.compiles == compiles  # AdamW's step counts and bias corrections are operands
    # One program per step: forward, backward (autograd's thread) and the optimizer share
    # the trace that loss.item() flushes.
    assert _fused.STATS["flushes"] == flushes + 4
    assert _fused.STATS["fused_runs"] == fused_runs + 4


class _HeadAttention(torch.nn.Module):
    """The view operands of a Llama block: heads as a transposed view of a projection,
    `chunk` halves of it (rotary), GQA's `expand` of the key/value heads."""

    def __init__(self, d=16, heads=4, kv_heads=2):
        super().__init__()
        self.heads, self.kv_heads, self.hd = heads, kv_heads, d // heads
        self.wq = torch.nn.Linear(d, d, bias=False)
        self.wk = torch.nn.Linear(d, kv_heads * self.hd, bias=False)
        self.wo = torch.nn.Linear(d, d, bias=False)

    def forward(self, x):
        b, s, _ = x.shape
        q = self.wq(x).view(b, s, self.heads, self.hd).transpose(1, 2)
        k = self.wk(x).view(b, s, self.kv_heads, self.hd).transpose(1, 2)
        q1, q2 = q.chunk(2, dim=-1)
        q = q * 0.5 + torch.cat((-q2, q1), dim=-1)
        k = k[:, :, None].expand(b, self.kv_heads, self.heads // self.kv_heads, s, self.hd)
        k = k.reshape(b, self.heads, s, self.hd)
        out = torch.softmax(q @ k.transpose(-1, -2), dim=-1) @ k
        return self.wo(out.transpose(1, 2).reshape(b, s, -1))


def test_steady_attention_training_step_is_one_gather_free_program(fused, monkeypatch):
    """A training step whose ops read views (heads, their rotary halves, GQA's expand):
    in steady state one program per step, no compile, and no gather in the fused
    program -- on a TPU an element gather per view operand (with an index constant as
    large as the view) made bench/tpu.py's FUSED Llama step 11x slower than compiled."""
    torch.manual_seed(0)
    model = _HeadAttention()
    cpu_model = copy.deepcopy(model)
    model = model.to("tpu")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    cpu_opt = torch.optim.AdamW(cpu_model.parameters(), lr=1e-2)
    x, target = torch.randn(2, 8, 16), torch.randn(2, 8, 16)
    tx, ttarget = x.to("tpu"), target.to("tpu")
    modules = []
    stitch = _fused._stitch
    monkeypatch.setattr(_fused, "_stitch", lambda *a, **k: modules.append(stitch(*a, **k)) or modules[-1])
    for _ in range(3):  # warm-up: plans and fused programs compile
        got = _mlp_step(model, opt, tx, ttarget)
        assert got == pytest.approx(_mlp_step(cpu_model, cpu_opt, x, target), rel=1e-4, abs=1e-6)
    assert modules and not any("stablehlo.gather" in text for text in modules)
    stats = get_client().cache.stats
    compiles = stats.compiles
    before = torch.tpu.transfer_stats()
    for _ in range(4):
        got = _mlp_step(model, opt, tx, ttarget)
        assert got == pytest.approx(_mlp_step(cpu_model, cpu_opt, x, target), rel=1e-4, abs=1e-6)
    assert stats.compiles == compiles
    assert (torch.tpu.transfer_stats() - before).programs_executed == 4


def test_an_adamw_step_records_as_many_ops_for_any_number_of_parameters(fused):
    """AdamW's foreach step writes its lists with in-place foreach ops, each one recorded
    op (PyTorch's kernel ran them tensor by tensor: 7 ops per parameter, 148 of the 509
    that bench/tpu.py's 2-layer Llama step recorded)."""

    def recorded_by_a_step(n_params: int) -> int:
        params = [torch.nn.Parameter(torch.randn(3).to("tpu")) for _ in range(n_params)]
        opt = torch.optim.AdamW(params, lr=1e-2, foreach=True)
        for p in params:
            p.grad = torch.ones(3).to("tpu")
        torch.tpu.synchronize()
        opt.step()  # the first step creates the states
        ops = []
        record = _fused._record
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(_fused, "_record", lambda plan, *a: ops.append(plan) or record(plan, *a))
            opt.step()
        return len(ops)

    assert recorded_by_a_step(1) == recorded_by_a_step(5) <= 10


def test_one_trace_serves_every_thread(fused):
    import threading

    x = torch.randn(8).to("tpu")
    out = {}
    worker = threading.Thread(target=lambda: out.setdefault("y", x * 2))
    worker.start()
    worker.join()
    flushes = _fused.STATS["flushes"]
    z = out["y"] + 1  # reads the worker's pending value without a flush
    assert _pending(z) and _fused.STATS["flushes"] == flushes
    torch.testing.assert_close(z.cpu(), x.cpu() * 2 + 1)
    assert _fused.STATS["flushes"] == flushes + 1


def test_first_trace_runs_op_by_op_while_it_compiles(monkeypatch):
    monkeypatch.setenv("TORCH_TPU_FUSED_BACKGROUND_COMPILE", "1")
    y = torch.randn(32, device="tpu")
    with set_eager_mode(EagerMode.FUSED):
        interpreted = _fused.STATS["interpreted_runs"]
        # A trace no test records elsewhere (a fresh cache key).
        z = ((y * 3.5).cos() + 0.25).exp2().sqrt()
        expected = ((y.cpu() * 3.5).cos() + 0.25).exp2().sqrt()
        torch.testing.assert_close(z.cpu(), expected)
        assert _fused.STATS["interpreted_runs"] == interpreted + 1
        key = next(reversed(_fused._PROGRAMS))
        _fused._PROGRAMS[key].result()  # the background compile finishes
        runs = _fused.STATS["fused_runs"]
        z = ((y * 1.5).cos() + 0.75).exp2().sqrt()
        torch.testing.assert_close(z.cpu(), ((y.cpu() * 1.5).cos() + 0.75).exp2().sqrt())
        assert _fused.STATS["fused_runs"] == runs + 1


def test_fused_program_carries_the_user_lines(fused):
    y = torch.randn(4, device="tpu")
    trace = _fused.current_trace(0)
    line = _next_line()
    z = torch.tanh(y) * 2
    text = _fused._stitch(trace, [(len(trace.ops) - 1, 0)])
    assert f'"{__file__}":{line}' in text
    z.cpu()


def test_failure_in_a_fused_program_names_the_lines(fused, monkeypatch):
    y = torch.randn(4).to("tpu")
    torch.erf(y).cpu()  # compiles the fused program of this trace (erf of an external input)
    key = next(reversed(_fused._PROGRAMS))

    def runner(arrays):
        raise _jaxlib.JaxRuntimeError("INTERNAL: injected execution failure")

    monkeypatch.setattr(_fused._PROGRAMS[key].executable, "_runner", runner)
    line = _next_line()
    z = torch.erf(y)
    with pytest.raises(ExecutionError) as info:
        z.cpu()
    message = str(info.value)
    assert f"{__file__}:{line}" in message and "injected execution failure" in message
    assert "EagerMode.DEBUG" in message
    with pytest.raises(ExecutionError):  # the lost value keeps raising, never reads garbage
        z.cpu()


def test_failure_while_running_op_by_op_names_the_op_and_line(monkeypatch):
    from torch_tpu.device import _ops

    monkeypatch.setenv("TORCH_TPU_FUSED_BACKGROUND_COMPILE", "1")
    y = torch.randn(3, 7, device="tpu")
    plan, _, _ = _ops.plan_for(torch.ops.aten.atan.default, (y,), {})

    def runner(arrays):
        raise _jaxlib.JaxRuntimeError("INTERNAL: injected execution failure")

    monkeypatch.setattr(plan.executable, "_runner", runner)
    with set_eager_mode(EagerMode.FUSED):
        line = _next_line()
        z = torch.atan(y).mul(0.123456)  # a fresh trace: it runs op by op
        with pytest.raises(ExecutionError, match=rf"atan.* recorded at {__file__}:{line} failed"):
            z.cpu()


# -- issue 30 item 7: traces that repeat, one transfer of numbers, runs that repeat bit for bit
def _sgd_mlp(seed: int = 0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    cpu_model = copy.deepcopy(model)
    model = model.to("tpu")
    return model, torch.optim.SGD(model.parameters(), lr=0.05), cpu_model, torch.optim.SGD(cpu_model.parameters(), lr=0.05)


def test_a_loop_that_reads_its_loss_every_n_steps_fuses(monkeypatch):
    """The loss is read every 10 steps only: before, traces were cut at the bound on
    recorded ops, at an offset that moved every step, and none repeated (0 fused runs).
    The optimizer's step() ends a trace, so every step is the same trace."""
    monkeypatch.setenv("TORCH_TPU_FUSED_BACKGROUND_COMPILE", "1")
    monkeypatch.setenv("TORCH_TPU_MAX_FUSED_OPS", "100")
    model, opt, cpu_model, cpu_opt = _sgd_mlp()
    x, target = torch.randn(6, 8), torch.randn(6, 4)
    tx, ttarget = x.to("tpu"), target.to("tpu")

    def step(m, o, a, t):
        o.zero_grad()
        loss = torch.nn.functional.mse_loss(m(a), t)
        loss.backward()
        o.step()
        return loss

    with set_eager_mode(EagerMode.FUSED):
        ops = _fused.STATS["ops"]
        step(model, opt, tx, ttarget).item()
        per_step = _fused.STATS["ops"] - ops
        assert 100 % per_step and per_step < 100  # the bound alone would not cut at steps
        step(cpu_model, cpu_opt, x, target)
        before = dict(_fused.STATS)
        for i in range(1, 31):
            loss = step(model, opt, tx, ttarget)
            cpu_loss = step(cpu_model, cpu_opt, x, target)
            if i % 10 == 0:
                assert loss.item() == pytest.approx(cpu_loss.item(), rel=1e-4, abs=1e-6)
    flushes = _fused.STATS["flushes"] - before["flushes"]
    fused_runs = _fused.STATS["fused_runs"] - before["fused_runs"]
    assert flushes == 30  # one per step, at its end
    # Every step is the warm-up step's trace: each runs its program (waiting for the
    # background compile if need be), none goes op by op.
    assert fused_runs == 30


def _fused_step_outputs(zero_grad_last: bool, steps: int = 4) -> tuple[list[float], int]:
    """(losses, outputs of the step's program) of an eager SGD loop in FUSED mode that reads
    its loss after each step."""
    _fused._OUTPUTS_BEFORE.clear()
    model, opt, _, _ = _sgd_mlp()
    x, target = torch.randn(6, 8).to("tpu"), torch.randn(6, 4).to("tpu")
    losses = []
    with set_eager_mode(EagerMode.FUSED):
        for _ in range(steps):
            if not zero_grad_last:
                opt.zero_grad(set_to_none=True)
            loss = torch.nn.functional.mse_loss(model(x), target)
            loss.backward()
            opt.step()
            if zero_grad_last:
                opt.zero_grad(set_to_none=True)
            losses.append(loss.item())
    (outputs,) = {len(o) for o in _fused._OUTPUTS_BEFORE.values()}  # one trace: every step the same
    return losses, outputs


def test_the_optimizer_step_ends_a_trace_that_runs_at_the_next_op_or_read():
    """`opt.step()` ends the trace; it runs at the next op or read -- here the loss's
    `.item()` -- so gradients that `zero_grad(set_to_none=True)` drops right after the step
    are no outputs of its program: one per parameter fewer than where the loop drops them at
    the next step's start (still held at the read). The losses agree."""
    kept_losses, kept = _fused_step_outputs(zero_grad_last=False)
    dropped_losses, dropped = _fused_step_outputs(zero_grad_last=True)
    assert kept - dropped == len(list(_sgd_mlp()[0].parameters())), (kept, dropped)
    assert kept_losses == pytest.approx(dropped_losses, rel=1e-5)  # two programs: fused otherwise by XLA


def test_python_numbers_are_one_transfer_per_run(fused, monkeypatch):
    """150 Python numbers in a chain were 150 host-to-device transfers per run; now one
    array per kind of number, and none when the numbers repeat the last run's (a steady
    loop: the array uploaded then is passed again)."""
    x = torch.randn(64)
    y0 = x.to("tpu")

    def chain(y, base):
        for k in range(50):
            y = y + 1
            y = y * 0.5
            y = y - (base + k)  # a value that differs per op: still one operand array
        return y

    chain(y0, 0).cpu()  # compiles the fused program
    client = _fused._storage.client()
    real, calls = client.to_device, []

    def to_device(value, *args, **kwargs):
        calls.append(getattr(value, "shape", None))
        return real(value, *args, **kwargs)

    monkeypatch.setattr(client, "to_device", to_device)
    runs = _fused.STATS["fused_runs"]
    for base in (1, 2):
        calls.clear()
        monkeypatch.setattr(_fused, "_PACKS", {})  # no pack of another test's
        got = chain(y0, base).cpu()
        assert sorted(calls) == [(50,), (100,)]  # the floats (0.5) and the ints, one array each
        torch.testing.assert_close(got, chain(x, base))
        calls.clear()
        got = chain(y0, base).cpu()  # the same numbers again: their arrays are on the device
        assert calls == []
        torch.testing.assert_close(got, chain(x, base))
    calls.clear()
    chain(y0, 7).cpu()
    assert sorted(calls) == [(100,)]  # the ints changed, the floats did not
    assert _fused.STATS["fused_runs"] == runs + 5


def test_a_known_trace_never_runs_op_by_op(monkeypatch):
    """The second run of a trace waits for its program when the background compile is
    still under way: which path it takes (their results differ in the last bits) no
    longer depends on how fast the compile was, so runs repeat bit for bit."""
    import threading
    from concurrent.futures import Future

    monkeypatch.setenv("TORCH_TPU_FUSED_BACKGROUND_COMPILE", "1")
    client = _fused._storage.client()
    real = client.compile_async

    def slow_compile(*args, **kwargs):  # a compile still running at the second flush
        inner, outer = real(*args, **kwargs), Future()
        threading.Timer(1.0, lambda: outer.set_result(inner.result())).start()
        return outer

    monkeypatch.setattr(client, "compile_async", slow_compile)
    torch.manual_seed(3)
    y = torch.randn(4096).to("tpu")
    results = []
    with set_eager_mode(EagerMode.FUSED):
        stats = dict(_fused.STATS)
        for _ in range(3):
            # A trace no other test records: fused, XLA computes it with other roundings.
            results.append((torch.tanh(y * 0.93) * torch.sigmoid(y) + y.exp() / 3.25).cpu())
    assert _fused.STATS["interpreted_runs"] == stats["interpreted_runs"] + 1  # the first run only
    assert _fused.STATS["fused_runs"] == stats["fused_runs"] + 2
    assert torch.equal(results[1], results[2])


def test_fused_mode_says_once_why_it_is_not_fusing(monkeypatch, caplog):
    """A loop without an optimizer or a read, whose step (17 ops) is cut at a bound (10)
    that does not align with it: every trace is new. FUSED says so once, with what to do."""
    monkeypatch.setenv("TORCH_TPU_FUSED_BACKGROUND_COMPILE", "1")
    monkeypatch.setenv("TORCH_TPU_MAX_FUSED_OPS", "10")
    monkeypatch.setattr(_fused, "_ADVICE", _fused._Advice())
    w, base = torch.randn(32).to("tpu"), torch.randn(64).to("tpu")
    with set_eager_mode(EagerMode.FUSED), caplog.at_level("WARNING", logger="torch_tpu"):
        for _ in range(12):
            for k in range(17):
                w = w + base[k:k + 32]  # 17 different plans (each reads its own offset)
        torch.tpu.synchronize()
    advice = [r.getMessage() for r in caplog.records if "FUSED mode is not fusing" in r.getMessage()]
    assert len(advice) == 1
    assert "TORCH_TPU_MAX_FUSED_OPS=10" in advice[0] and "torch.tpu.synchronize()" in advice[0]


def _three_steps(monkeypatch, **env) -> list[torch.Tensor]:
    """Three steps of a loop (a chain XLA rounds differently once fused, ended by a
    synchronize) in a fresh program table, as in a new process, under `env`."""
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(_fused, "_PROGRAMS", {})
    torch.manual_seed(11)
    s = torch.randn(4096).to("tpu")
    seen = []
    with set_eager_mode(EagerMode.FUSED):
        for _ in range(3):
            s = torch.tanh(s * 0.93) * torch.sigmoid(s) + s.exp() / 3.25
            torch.tpu.synchronize()
            seen.append(s.cpu())
    return seen


def test_results_do_not_depend_on_the_background_compile(monkeypatch):
    """Whether a new trace's program compiles in the background (its first run goes op by
    op meanwhile) or before the first run, the first run goes op by op and every later one
    runs the program: the same results bit for bit. The fused program's roundings differ
    here (TORCH_TPU_FUSED_FIRST_RUN=1 shows it), so the equality says something."""
    background = _three_steps(monkeypatch, TORCH_TPU_FUSED_BACKGROUND_COMPILE="1", TORCH_TPU_FUSED_FIRST_RUN="0")
    foreground = _three_steps(monkeypatch, TORCH_TPU_FUSED_BACKGROUND_COMPILE="0", TORCH_TPU_FUSED_FIRST_RUN="0")
    fused_first = _three_steps(monkeypatch, TORCH_TPU_FUSED_BACKGROUND_COMPILE="0", TORCH_TPU_FUSED_FIRST_RUN="1")
    for b, f in zip(background, foreground):
        assert torch.equal(b, f)
    assert not torch.equal(background[0], fused_first[0])  # the op-by-op and fused roundings differ
    torch.testing.assert_close(background[0], fused_first[0])


def test_cpu_copies_the_value_once(fused, monkeypatch):
    """`.cpu()` of a tensor spanning its storage is the one host copy of the buffer
    (it was that copy, then a clone of it)."""
    from torch_tpu.runtime.buffer import DeviceBuffer

    y = torch.randn(256, 4).to("tpu") * 2
    copies, real = [], DeviceBuffer.copy_to_host

    def copy_to_host(buffer):
        copies.append(real(buffer))
        return copies[-1]

    monkeypatch.setattr(DeviceBuffer, "copy_to_host", copy_to_host)
    host = y.cpu()
    assert len(copies) == 1
    assert host.untyped_storage().data_ptr() == copies[0].untyped_storage().data_ptr()  # no second copy
    host.add_(1)  # memory of its own: the device value is untouched
    torch.testing.assert_close(y.cpu(), host - 1)


# -- the trace's cache key (`Trace.program_key`: derived from the recorded refs at the flush) --------
def _programs_made(run) -> int:
    """How many new fused programs `run()` made (keys it added to the program table)."""
    before = len(_fused._PROGRAMS)
    run()
    return len(_fused._PROGRAMS) - before


def test_a_trace_that_leaves_a_known_one_midway_gets_its_own_program(fused, monkeypatch):
    """A trace that repeats a known one for its first ops, then differs, is a trace of its
    own: right results, its own program; the known one still runs its program after."""
    monkeypatch.setattr(_fused, "_PROGRAMS", {})
    x = torch.randn(16)
    y0 = x.to("tpu")

    def chain(y, turn_at: int):
        for i in range(6):
            y = y + 1
            y = y * 2 if i != turn_at else y.sqrt()
        return y

    assert _programs_made(lambda: torch.testing.assert_close(chain(y0, -1).cpu(), chain(x, -1))) == 1
    for turn_at in (3, 5, 0):  # leaves the known trace after 7, 11 and 1 ops
        assert _programs_made(lambda: torch.testing.assert_close(chain(y0, turn_at).cpu(),
                                                                 chain(x, turn_at), equal_nan=True)) == 1
    runs, compiles = _fused.STATS["fused_runs"], get_client().cache.stats.compiles
    assert _programs_made(lambda: torch.testing.assert_close(chain(y0, -1).cpu(), chain(x, -1))) == 0
    assert _fused.STATS["fused_runs"] == runs + 1 and get_client().cache.stats.compiles == compiles


def test_the_key_follows_shapes_dtypes_and_number_kinds_not_number_values(fused, monkeypatch):
    monkeypatch.setattr(_fused, "_PROGRAMS", {})

    def step(y, a, b):
        return ((y + a) * b).cpu()

    x = torch.randn(8, 4)
    y = x.to("tpu")
    assert _programs_made(lambda: torch.testing.assert_close(step(y, 1, 0.5), step(x, 1, 0.5))) == 1
    # Other values of the same kinds: the same program, given the new values.
    assert _programs_made(lambda: torch.testing.assert_close(step(y, 3, -2.5), step(x, 3, -2.5))) == 0
    # An int where a float was (and back): another program, each number in its own array.
    assert _programs_made(lambda: torch.testing.assert_close(step(y, 1.5, 2), step(x, 1.5, 2))) == 1
    assert _programs_made(lambda: torch.testing.assert_close(step(y, 1, 0.25), step(x, 1, 0.25))) == 0
    # Another shape, another dtype: other plans, other programs.
    x2 = torch.randn(4, 8)
    assert _programs_made(lambda: torch.testing.assert_close(step(x2.to("tpu"), 1, 0.5), step(x2, 1, 0.5))) == 1
    xi = torch.arange(32, dtype=torch.int32).reshape(8, 4)
    assert _programs_made(lambda: torch.testing.assert_close(step(xi.to("tpu"), 2, 3), step(xi, 2, 3))) == 1


def test_the_key_tells_apart_traces_that_wire_their_operands_otherwise(fused, monkeypatch):
    """Traces of the same plans and externals that read them in another order are told
    apart by the operands' refs alone: two programs, each right."""
    monkeypatch.setattr(_fused, "_PROGRAMS", {})
    a, b = torch.randn(32), torch.randn(32)
    ta, tb = a.to("tpu"), b.to("tpu")
    assert _programs_made(lambda: torch.testing.assert_close(((ta + tb) * ta).cpu(), (a + b) * a)) == 1
    assert _programs_made(lambda: torch.testing.assert_close(((ta + tb) * tb).cpu(), (a + b) * b)) == 1
    assert _programs_made(lambda: torch.testing.assert_close(((ta + ta) * tb).cpu(), (a + a) * b)) == 1
    assert _programs_made(lambda: torch.testing.assert_close(((tb + ta) * tb).cpu(), (b + a) * b)) == 0
    # An in-place write of one storage from itself, then from another.
    ca, cb = ta.clone(), tb.clone()
    torch.tpu.synchronize()
    ca.mul_(ca)
    torch.testing.assert_close(ca.cpu(), a * a)
    ca.copy_(ta)
    torch.tpu.synchronize()
    ca.mul_(cb)
    torch.testing.assert_close(ca.cpu(), a * b)


def test_kept_number_arrays_tell_zero_from_negative_zero(fused, monkeypatch):
    """The packed numbers' device arrays are kept by their bytes: 0.0 and -0.0 are equal
    numbers but different operands (`x * -0.0` is -0.0 for a positive x)."""
    monkeypatch.setattr(_fused, "_PACKS", {})
    y = torch.rand(8).add(1).to("tpu")
    for zero in (0.0, -0.0, 0.0, -0.0):
        got = (y * zero * 1.0).cpu()  # two floats: one packed array per run
        assert torch.equal(torch.signbit(got), torch.signbit(y.cpu() * zero))
    assert len(_fused._PACKS) == 2


# -- the garbage collector while FUSED mode is on (`_gc_policy`) ----------------------------------


@pytest.fixture
def default_gc_threshold():
    import gc

    saved = gc.get_threshold()
    gc.set_threshold(PYTHON_DEFAULT_THRESHOLD0, *saved[1:])  # Python's default, as a fresh process has it
    yield saved[1:]
    gc.set_threshold(*saved)


def test_fused_mode_raises_the_young_threshold_and_leaving_it_puts_it_back(default_gc_threshold, monkeypatch):
    import gc

    monkeypatch.setenv("TORCH_TPU_FUSED_GC_THRESHOLD", "12345")
    with set_eager_mode(EagerMode.FUSED):
        assert gc.get_threshold() == (12345, *default_gc_threshold)
        with set_eager_mode(EagerMode.FUSED):  # nested: still raised, put back by the outer scope only
            pass
        assert gc.get_threshold()[0] == 12345
        with set_eager_mode(EagerMode.STRICT):  # a Strict block inside: Python's default there
            assert gc.get_threshold()[0] == PYTHON_DEFAULT_THRESHOLD0
        assert gc.get_threshold()[0] == 12345
    assert gc.get_threshold() == (PYTHON_DEFAULT_THRESHOLD0, *default_gc_threshold)


def test_fused_mode_keeps_a_threshold_the_application_set(default_gc_threshold, monkeypatch):
    import gc

    monkeypatch.setenv("TORCH_TPU_FUSED_GC_THRESHOLD", "12345")
    gc.set_threshold(1500, *default_gc_threshold)
    with set_eager_mode(EagerMode.FUSED):
        assert gc.get_threshold()[0] == 1500  # not Python's default: the application's, kept
    assert gc.get_threshold()[0] == 1500
    gc.set_threshold(PYTHON_DEFAULT_THRESHOLD0, *default_gc_threshold)
    with set_eager_mode(EagerMode.FUSED):
        gc.set_threshold(3000, *default_gc_threshold)  # set inside the FUSED block: kept on leaving
    assert gc.get_threshold()[0] == 3000


def test_fused_gc_threshold_zero_leaves_the_collector_alone(default_gc_threshold, monkeypatch):
    import gc

    monkeypatch.setenv("TORCH_TPU_FUSED_GC_THRESHOLD", "0")
    with set_eager_mode(EagerMode.FUSED):
        assert gc.get_threshold()[0] == PYTHON_DEFAULT_THRESHOLD0


def test_fused_mode_from_the_environment_raises_the_threshold_for_the_process():
    import subprocess
    import sys

    code = ("import gc, torch, torch_tpu.device; from torch_tpu.device import get_eager_mode; "
            "before = gc.get_threshold()[0]; mode = get_eager_mode(); "
            "x = (torch.ones(3).to('tpu') + 1).cpu(); print(before, mode.name, gc.get_threshold()[0], x.tolist())")
    env = {**__import__("os").environ, "TORCH_TPU_DEFER_AND_FUSE": "1", "TORCH_TPU_FUSED_GC_THRESHOLD": "4321"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split()[:4] == [str(PYTHON_DEFAULT_THRESHOLD0), "FUSED", "4321", "[2.0,"]


def test_a_buffer_deleted_after_the_trace_read_it_fails_at_the_flush_with_a_clear_error(fused):
    """A trace checks an external buffer when it first reads it (the op's error names the
    op's line); one deleted after that is caught when the flush gathers the trace's inputs:
    an error naming the flush's line, no crash and no stale value."""
    from torch_tpu.device._buffers import entry_of
    from torch_tpu.runtime.errors import BufferDeletedError

    x = torch.arange(6.0).to("tpu")
    y = x + 1  # the trace reads x's buffer
    entry_of(x)._buffer.delete()
    z = x * 2  # the same buffer, known to the trace: recorded
    line = _next_line()
    with pytest.raises(BufferDeletedError, match=rf"at {__file__}:{line + 1}, a tpu tensor's device buffer"):
        (y + z).cpu()
    with pytest.raises(BufferDeletedError):  # a new trace reading it fails at the op
        x - 1
