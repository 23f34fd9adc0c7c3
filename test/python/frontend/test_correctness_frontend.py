"""Frontend correctness and polish (issue #11): precision keys compiled programs, outputs
of bounded-dynamic graphs have eager's strides, the compile-cache key covers the
compiler's code, `torch_tpu.mark_dynamic`, fallback reasons, lazy attributes, warnings."""

from __future__ import annotations

import dataclasses
import logging
import re
import subprocess
import sys
import warnings

import pytest
import torch

import torch_tpu
from torch_tpu.runtime import Client
from torch_tpu.runtime.executable import Executable

# -- precision: the mode in force at call time selects the program (item 3) -------------


@pytest.fixture()
def executed_precisions(monkeypatch):
    """The precision_config of the dot in every program the test runs, in call order."""
    texts: dict[int, str] = {}
    ran: list[str] = []
    from concurrent.futures import Future

    compile_ = Client.compile
    compile_async = Client.compile_async
    call = Executable.__call__
    caller = Executable.caller

    def precision_of(module) -> str:
        if isinstance(module, bytes):  # a first program compiled in the background: bytecode
            from torch_tpu.program import shared_context
            from torch_tpu.compiler.context import ir

            with shared_context():
                module = ir.Module.parse(module)
        text = str(module) if not isinstance(module, str) else module
        found = re.findall(r"precision = \[(\w+), \1\]", text)
        return found[0] if found else "none"

    def compile_spy(self, module, **kw):
        exe = compile_(self, module, **kw)
        texts[id(exe)] = precision_of(module)
        return exe

    def compile_async_spy(self, module, **kw):
        precision, spied = precision_of(module), Future()

        def relay(future):  # the text is recorded before the caller gets the executable
            if future.exception() is not None:
                spied.set_exception(future.exception())
            else:
                texts[id(future.result())] = precision
                spied.set_result(future.result())

        compile_async(self, module, **kw).add_done_callback(relay)
        return spied

    def call_spy(self, *args):
        ran.append(texts.get(id(self), "?"))
        return call(self, *args)

    monkeypatch.setattr(Client, "compile", compile_spy)
    monkeypatch.setattr(Client, "compile_async", compile_async_spy)
    def caller_spy(self, result_type=list):
        # A compiled graph's fast path (`CompiledGraph.fast_path`) calls this closure.
        run = caller(self, result_type)

        def spied(*args):
            ran.append(texts.get(id(self), "?"))
            return run(*args)

        return spied

    monkeypatch.setattr(Executable, "__call__", call_spy)
    monkeypatch.setattr(Executable, "caller", caller_spy)
    return ran


def _matmul(a, b):
    return (a @ b).relu()


def test_precision_block_selects_the_program_at_call_time(executed_precisions):
    torch._dynamo.reset()
    a, b = torch.randn(8, 8), torch.randn(8, 8)
    f = torch.compile(_matmul, backend="tpu")
    with torch_tpu.precision("medium"):
        f(a, b)
    with torch_tpu.precision("high"):
        out = f(a, b)
    with torch_tpu.precision("highest"):
        f(a, b)
    with torch_tpu.precision("medium"):
        f(a, b)
    assert executed_precisions == ["DEFAULT", "HIGH", "HIGHEST", "DEFAULT"]
    torch.testing.assert_close(out, _matmul(a, b))


def test_precision_block_recompiles_a_graph_compiled_under_set_float32_matmul_precision(executed_precisions):
    torch._dynamo.reset()
    old = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("highest")
        f = torch.compile(_matmul, backend="tpu")
        a, b = torch.randn(4, 4), torch.randn(4, 4)
        f(a, b)
        with torch_tpu.precision("medium"):
            f(a, b)
        f(a, b)
    finally:
        torch.set_float32_matmul_precision(old)
    assert executed_precisions == ["HIGHEST", "DEFAULT", "HIGHEST"]


def test_precision_selects_the_program_with_torchtpu_views(executed_precisions):
    torch._dynamo.reset()
    f = torch.compile(_matmul, backend="tpu", options={"functionalize": "torchtpu"})
    a, b = torch.randn(4, 4), torch.randn(4, 4)
    with torch.no_grad():
        for mode in ("high", "medium", "highest"):
            with torch_tpu.precision(mode):
                torch.testing.assert_close(f(a, b), _matmul(a, b))
    assert executed_precisions == ["HIGH", "DEFAULT", "HIGHEST"]


def test_graph_without_matrix_ops_compiles_once_for_every_mode(monkeypatch):
    from torch_tpu.backend import _compile

    torch._dynamo.reset()
    builds = []
    original = _compile._compile_graph
    monkeypatch.setattr(_compile, "_compile_graph", lambda *a: builds.append(1) or original(*a))
    f = torch.compile(lambda x: x.sin() + 1, backend="tpu")
    x = torch.randn(5)
    for mode in ("medium", "high", "highest"):
        with torch_tpu.precision(mode):
            torch.testing.assert_close(f(x), x.sin() + 1)
    assert len(builds) == 1


def test_precision_cost_warning_only_on_tpu(caplog):
    from torch_tpu.program import precision as _precision

    _precision._warned.clear()
    with caplog.at_level(logging.WARNING, logger="torch_tpu"):
        with torch_tpu.precision("highest"):
            pass
        _precision.warn_cost("highest", "cpu")
        assert not [r for r in caplog.records if "matrix-unit" in r.getMessage()]
        _precision.warn_cost("highest", "tpu")
        _precision.warn_cost("highest", "tpu")
    assert len([r for r in caplog.records if "6x the matrix-unit passes" in r.getMessage()]) == 1
    _precision._warned.clear()


# -- outputs have eager's sizes and strides (item 2) ----------------------------------------


def _cat_and_transpose(x, y):
    return torch.cat([x, y], dim=1) * 2, x.transpose(1, 2) + 1


def test_bounded_dynamic_outputs_have_eager_strides():
    torch._dynamo.reset()
    first = torch.compile(_cat_and_transpose, backend="tpu")
    for n in (10, 7, 12, 3):
        x, y = torch.randn(2, n, 4), torch.randn(2, n, 4)
        for t in (x, y):
            torch._dynamo.mark_dynamic(t, 1, min=2, max=64)
        got, expected = first(x, y), _cat_and_transpose(x, y)
        for g, e in zip(got, expected):
            assert g.shape == e.shape and g.stride() == e.stride(), (n, g.stride(), e.stride())
            torch.testing.assert_close(g, e)
        # HF Llama's `logits.view(-1, vocab)` raised "view size is not compatible".
        torch.testing.assert_close(got[0].view(-1, 4), expected[0].view(-1, 4))


def _append(cache, new):
    return torch.cat([cache, new], dim=1) * 1


def test_outputs_fed_back_do_not_recompile_on_strides():
    """A KV-cache-like loop (as `generate` runs): each output is the next call's input. A
    padded view's stride differs from the first call's contiguous input and made Dynamo
    recompile on its stride guard."""
    from torch._dynamo.testing import CompileCounterWithBackend

    torch._dynamo.reset()
    counter = CompileCounterWithBackend("tpu")
    step = torch.compile(_append, backend=counter)
    cache = expected = torch.randn(2, 3, 4)
    for _ in range(5):
        new = torch.randn(2, 1, 4)
        torch._dynamo.mark_dynamic(cache, 1, min=2, max=64)
        cache, expected = step(cache, new), _append(expected, new)
        assert cache.stride() == expected.stride()
    torch.testing.assert_close(cache, expected)
    assert counter.frame_count == 1


@pytest.mark.parametrize("requires_grad", [False, True])
def test_static_outputs_keep_eager_non_contiguous_layout(requires_grad):
    torch._dynamo.reset()

    def f(x):
        return (x.sin() + 1).transpose(0, 1)

    x = torch.randn(3, 5, requires_grad=requires_grad)
    got, expected = torch.compile(f, backend="tpu")(x), f(x)
    assert got.stride() == expected.stride() == (1, 5)
    torch.testing.assert_close(got, expected)
    if requires_grad:  # the forward's saved activations keep whatever layout they have
        (grad,) = torch.autograd.grad(got.square().sum(), x)
        torch.testing.assert_close(grad, torch.autograd.grad(expected.square().sum(), x)[0])


# -- torch_tpu.mark_dynamic: the documented forms run, size 1 included (item 8) -----------


@pytest.fixture()
def size_oblivious_restored():
    import torch.fx.experimental._config as fx_config

    old = fx_config.backed_size_oblivious
    fx_config.backed_size_oblivious = False
    torch._dynamo.reset()
    yield fx_config
    fx_config.backed_size_oblivious = old
    torch._dynamo.reset()


def _scaled_rowsum(x):
    return (x * 2).sum(-1) + x.shape[1]


@pytest.mark.parametrize(
    "dim, kwargs, lengths",
    [
        (1, {"max": 64}, [5, 1, 7, 64]),  # max only (torch's own form crashed in Dynamo)
        (1, {"min": 1, "max": 64}, [9, 1, 2, 33]),  # the form docs showed (size 1 raised)
        ([0, 1], {"max": 32}, [4, 1, 32]),  # several dims at once
        (-1, {"min": 2, "max": 16}, [3, 16, 2]),  # a min of 2 needs no torch setting
    ],
)
def test_mark_dynamic_forms_compile_once(size_oblivious_restored, monkeypatch, dim, kwargs, lengths):
    from torch._dynamo.testing import CompileCounterWithBackend

    counter = CompileCounterWithBackend("tpu")
    f = torch.compile(_scaled_rowsum, backend=counter)
    for n in lengths:
        shape = [n, n] if isinstance(dim, list) else [3, n]
        x = torch.randn(*shape)
        torch_tpu.mark_dynamic(x, dim, **kwargs)
        torch.testing.assert_close(f(x), _scaled_rowsum(x))
    assert counter.frame_count == 1
    assert size_oblivious_restored.backed_size_oblivious == (kwargs.get("min", 1) < 2)


def test_mark_dynamic_rejects_bad_arguments():
    x = torch.randn(2, 3)
    with pytest.raises(ValueError, match="max must be an int >= 2"):
        torch_tpu.mark_dynamic(x, 1, max=None)
    with pytest.raises(ValueError, match="need 0 <= min < max"):
        torch_tpu.mark_dynamic(x, 1, min=8, max=8)
    with pytest.raises(IndexError, match="dim 2 is out of range for a 2-d tensor"):
        torch_tpu.mark_dynamic(x, 2, max=8)
    with pytest.raises(TypeError, match="dim must be an int or a list of ints"):
        torch_tpu.mark_dynamic(x, "1", max=8)


def test_bound_exceeded_warning_names_the_input_and_dim(size_oblivious_restored, caplog, monkeypatch):
    monkeypatch.setenv("TORCH_TPU_DYNAMIC_BOUND", "8")  # a bound PyTorch does not know
    f = torch.compile(_scaled_rowsum, backend="tpu", dynamic=True)
    with caplog.at_level(logging.WARNING, logger="torch_tpu"):
        for n in (5, 20):
            x = torch.randn(3, n)
            torch.testing.assert_close(f(x), _scaled_rowsum(x))
    notes = [r.getMessage() for r in caplog.records if "exceeds its compiled bound" in r.getMessage()]
    assert len(notes) == 1, [r.getMessage() for r in caplog.records]
    assert "L['x'].size()[1]: size 20 > bound 8, new bound 32" in notes[0], notes
    assert not re.search(r"\bs\d+\b", notes[0]), notes  # no sympy symbol names
    assert "torch_tpu.mark_dynamic(tensor, dim, max=...)" in notes[0]


# -- polish: lazy attributes, warnings, cache names, slow compiles (item 10) ------------------


def _documented_attributes() -> set[str]:
    from pathlib import Path

    root = Path(__file__).resolve().parents[3]
    texts = [(root / "README.md").read_text()] + [p.read_text() for p in (root / "docs").rglob("*.md")]
    found = {m for text in texts for m in re.findall(r"\btorch_tpu\.([A-Za-z]\w*)", text)}
    return found | set(torch_tpu.__all__)


def test_every_documented_attribute_loads_in_a_fresh_process():
    names = sorted(_documented_attributes() - {"__version__"})
    assert {"spmd", "precision", "mark_dynamic", "export", "spmd_safe", "runtime"} <= set(names)
    code = "import torch_tpu\n" + "".join(f"getattr(torch_tpu, {n!r})\n" for n in names) + "print('ok')"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-2000:]
    with pytest.raises(AttributeError, match="has no attribute 'nonexistent'"):
        torch_tpu.nonexistent  # noqa: B018


def test_compile_and_export_raise_no_future_warning():
    torch._dynamo.reset()
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
    x = torch.randn(2, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        torch.testing.assert_close(torch.compile(model, backend="tpu")(x), model(x))
        exported = torch_tpu.export(model, (x,))
    torch.testing.assert_close(exported(x), model(x))


def test_quickstart_runs_with_future_warnings_as_errors():
    result = subprocess.run(
        [sys.executable, "-W", "error::FutureWarning", "-m", "torch_tpu.examples.quickstart",
         "--batch", "1", "--seq", "8", "--show-stablehlo", "0"],
        capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "max |tpu - eager|" in result.stdout and "FutureWarning" not in result.stderr


def test_cache_entries_are_named_after_the_traced_function(tmp_path, capsys):
    from torch_tpu.runtime import CacheConfig, get_client
    from torch_tpu.tools import cache as cache_tool

    client = get_client()
    old = client.cache.config
    client.configure_cache(CacheConfig(l2_dir=str(tmp_path / "l2")))
    try:
        torch._dynamo.reset()

        def decode_step(x):
            return x.cos() * 3

        torch.compile(decode_step, backend="tpu")(torch.randn(6))
        assert cache_tool.main(["list", "--dir", str(tmp_path / "l2")]) == 0
    finally:
        client.configure_cache(old)
    listing = capsys.readouterr().out
    assert re.search(r"  cpu  test_cache_entries_are_named_after_the_traced_function\.decode_step-g\d+-inference$",
                     listing, re.MULTILINE), listing


def test_slow_compile_is_a_warning(monkeypatch, caplog):
    monkeypatch.setenv("TORCH_TPU_SLOW_COMPILE_S", "0")
    torch._dynamo.reset()
    with caplog.at_level(logging.INFO, logger="torch_tpu"):
        torch.compile(lambda x: x.exp() - 1, backend="tpu")(torch.randn(3))
    slow = [r for r in caplog.records if re.search(r"compiling .* took [\d.]+s: convert", r.getMessage())]
    assert slow and all(r.levelno == logging.WARNING for r in slow)
    monkeypatch.setenv("TORCH_TPU_SLOW_COMPILE_S", "1000")
    torch._dynamo.reset()
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="torch_tpu"):
        torch.compile(lambda x: x.exp() - 2, backend="tpu")(torch.randn(3))
    assert not [r for r in caplog.records if " took " in r.getMessage()]


# -- fallback messages state the real reason (item 9) ------------------------------------------


@pytest.fixture()
def fallback_log(caplog, monkeypatch):
    from torch_tpu.backend import _compile

    monkeypatch.delenv("TORCH_TPU_STRICT", raising=False)
    monkeypatch.setattr(_compile, "_reported_fallbacks", set())
    torch._dynamo.reset()
    caplog.set_level(logging.WARNING, logger="torch_tpu")

    def messages() -> list[str]:
        return [r.getMessage() for r in caplog.records if "runs in PyTorch eager" in r.getMessage()]

    return messages


def test_python_float_changing_per_call_compiles_without_fallback(fallback_log):
    """Dynamo traces a float that changes between calls as a graph input, converted by
    prims.convert_element_type, which was reported as "no lowering"."""
    f = torch.compile(lambda x, scale: x * scale + 1, backend="tpu")
    x = torch.randn(4)
    for scale in (0.5, 1.5, 2.5):
        torch.testing.assert_close(f(x, scale), x * scale + 1)
    assert fallback_log() == []


@torch.library.custom_op("torchtpu_test::unlowered", mutates_args=())
def _unlowered(x: torch.Tensor) -> torch.Tensor:
    # Reads values (.tolist()), so its implementation cannot be traced into the graph.
    return x.new_tensor([v * 3 + 1 for v in x.tolist()])


@_unlowered.register_fake
def _(x):
    return torch.empty_like(x)


def test_fallback_reason_untraceable_custom_op(fallback_log):
    f = torch.compile(lambda x: _unlowered(x.sin()) + 1, backend="tpu")
    x = torch.randn(3)
    torch.testing.assert_close(f(x), _unlowered(x.sin()) + 1)
    assert fallback_log() == [
        "torch_tpu: custom op torchtpu_test.unlowered.default has no lowering and its implementation "
        "cannot be traced: DataDependentOutputException: aten._local_scalar_dense.default; it runs in "
        "PyTorch eager. Make its implementation traceable (torch ops on its arguments only: no .item(), "
        ".tolist(), numpy or data-dependent Python control flow), or give it a lowering with "
        "@torch_tpu.register_lowering (docs/howto/write-a-lowering.md)."
    ]


def test_fallback_reason_lowering_error(fallback_log):
    f = torch.compile(lambda x: torch.linspace(0, 1, 3, dtype=torch.complex64) * x, backend="tpu")
    x = torch.randn(3)
    torch.testing.assert_close(f(x), torch.linspace(0, 1, 3, dtype=torch.complex64) * x)
    (message,) = fallback_log()
    assert message.startswith("torch_tpu: aten.linspace.default cannot be compiled: its lowering rejected "
                              "these arguments (complex linspace is not supported)"), message
    assert "has no lowering" not in message and "so it gets a lowering" not in message


def test_fallback_reason_bounded_dynamism_limit(fallback_log, size_oblivious_restored):
    f = torch.compile(lambda x: x.flip(1).cumsum(1), backend="tpu")
    x = torch.randn(2, 9)
    torch_tpu.mark_dynamic(x, 1, max=32)
    torch.testing.assert_close(f(x), x.flip(1).cumsum(1))
    (message,) = fallback_log()
    assert message.startswith("torch_tpu: aten.flip.default cannot be compiled with bounded-dynamic shapes "
                              "(flip along a dynamic (padded) dimension is not supported"), message
    assert "documented limit of bounded dynamism" in message
    assert "report" not in message and "has no lowering" not in message


def test_fallback_reason_symbolic_scalar(fallback_log, monkeypatch):
    """A lowering that needs a Python number at compile time, given a Python int that
    Dynamo traced as a symbolic graph input (dynamic=True)."""
    from torch_tpu.compiler.lowering import LOWERINGS
    from torch_tpu.compiler.lowering.registry import Lowering

    add = torch.ops.aten.add.Tensor
    original = LOWERINGS[add]

    def needs_a_constant(ctx, x, other, alpha=1):
        if type(other) not in (int, float):  # a symbolic size arrives as an int subclass
            raise TypeError(f"expected a Python number, got {type(other).__name__}")
        return original.fn(ctx, x, other, alpha=alpha)

    monkeypatch.setitem(LOWERINGS, add, dataclasses.replace(original, fn=needs_a_constant))
    f = torch.compile(lambda x, n: (x * 2) + n, backend="tpu", dynamic=True)
    x = torch.randn(3)
    for n in (2, 3):
        torch.testing.assert_close(f(x, n), x * 2 + n)
    (message,) = fallback_log()
    assert re.match(r"torch_tpu: aten\.add\.Tensor cannot be compiled: argument \w+ \(SymInt\) is a Python "
                    r"number traced as a symbolic value \(it changed between calls\), and the lowering needs "
                    r"it at compile time: lowering failed: TypeError", message), message
    assert "torch._dynamo.config.specialize_float = True, or specialize_int" in message
    assert "has no lowering" not in message


def test_a_lowering_refusing_its_arguments_with_pytorchs_check_falls_back(fallback_log, monkeypatch):
    """A lowering that reuses PyTorch's own checks (torch._check, broadcast_shapes) raises
    RuntimeError for arguments it cannot take (a bounded-dynamic size beside a static one,
    as jetmoe's expert outputs times its gates): that op runs in eager, the rest compiles;
    under TORCH_TPU_STRICT it is an error naming the op and the user's line."""
    from torch_tpu.compiler.lowering import LOWERINGS
    from torch_tpu.compiler.lowering.registry import Lowering

    mul = torch.ops.aten.mul.Tensor
    original = LOWERINGS[mul]

    def refuses(ctx, x, other):
        torch._check(False, lambda: "these shapes cannot broadcast here")
        return original.fn(ctx, x, other)

    monkeypatch.setitem(LOWERINGS, mul, dataclasses.replace(original, fn=refuses))
    torch._dynamo.reset()
    f = torch.compile(lambda x, y: (x + 1) * y, backend="tpu")
    x, y = torch.randn(3), torch.randn(3)
    torch.testing.assert_close(f(x, y), (x + 1) * y)
    (message,) = fallback_log()
    assert message.startswith("torch_tpu: aten.mul.Tensor cannot be compiled"), message
    assert "lowering failed: RuntimeError: these shapes cannot broadcast here" in message

    monkeypatch.setenv("TORCH_TPU_STRICT", "1")
    torch._dynamo.reset()
    with pytest.raises(Exception, match=r"aten\.mul\.Tensor.*lowering failed: RuntimeError") as caught:
        torch.compile(lambda x, y: (x + 1) * y, backend="tpu")(x, y)
    assert "test_correctness_frontend.py" in str(caught.value)
