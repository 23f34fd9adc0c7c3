"""The first compile of a process: what backend="tpu" runs aot_autograd with, and what it
costs in imports (issue #17; figures in bench/first_call.py)."""

import os
import subprocess
import sys
import textwrap

import torch

from torch_tpu import backend


def _run(script: str, **env: str) -> str:
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)], capture_output=True, text=True, timeout=300,
        env={**os.environ, **env},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def test_first_compile_does_not_import_inductor_debug():
    # Dynamo's AotAutograd helper imports torch._inductor.debug (most of inductor, ~0.4 s)
    # for a logging context that acts only under TORCH_COMPILE_DEBUG=1.
    out = _run(
        """
        import sys, torch
        from torch._dynamo.utils import counters
        model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()).eval()
        x = torch.randn(4, 8)
        with torch.no_grad():
            out = torch.compile(model, backend="tpu")(x)
            torch.testing.assert_close(out, model(x))
        print("inductor.debug imported:", "torch._inductor.debug" in sys.modules)
        print("aot ok:", counters["aot_autograd"]["ok"], "total:", counters["aot_autograd"]["total"])
        """,
        TORCH_COMPILE_DEBUG="0",
    )
    assert "inductor.debug imported: False" in out, out
    assert "aot ok: 1 total: 1" in out, out


def test_training_graph_goes_through_aot_compile_and_backward_matches_eager():
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3))
    reference = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3))
    reference.load_state_dict(model.state_dict())
    x = torch.randn(4, 6)
    torch.compile(model, backend="tpu")(x).square().sum().backward()
    reference(x).square().sum().backward()
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-5)
    assert torch._dynamo.utils.counters["aot_autograd"]["ok"] == 1


def test_aot_compile_counts_a_failed_graph_and_reraises():
    torch._dynamo.utils.counters.clear()
    gm = torch.fx.symbolic_trace(lambda x: (x + 1,))

    def failing_compiler(graph, example_inputs):
        raise RuntimeError("compiler rejected the graph")

    try:
        backend.aot_compile(gm, [torch.ones(2)], fw_compiler=failing_compiler, bw_compiler=failing_compiler,
                            inference_compiler=failing_compiler)
    except RuntimeError as err:
        assert "compiler rejected the graph" in str(err)
    else:
        raise AssertionError("the compiler's error was swallowed")
    assert torch._dynamo.utils.counters["aot_autograd"]["not_ok"] == 1
    assert torch._dynamo.utils.counters["aot_autograd"]["ok"] == 0


def test_compile_debug_keeps_dynamos_aot_logging(tmp_path):
    # With TORCH_COMPILE_DEBUG=1, Dynamo's own helper runs (and writes its debug logs).
    out = _run(
        """
        import sys, torch
        with torch.no_grad():
            out = torch.compile(lambda x: torch.sin(x) + 1, backend="tpu")(torch.ones(3))
        torch.testing.assert_close(out, torch.sin(torch.ones(3)) + 1)
        print("inductor.debug imported:", "torch._inductor.debug" in sys.modules)
        """,
        TORCH_COMPILE_DEBUG="1", TORCH_COMPILE_DEBUG_DIR=str(tmp_path),
    )
    assert "inductor.debug imported: True" in out, out


# -- the decomposition table for tracing (compiler/lowering/decompositions.py) --------------

def test_tracing_table_leaves_out_only_entries_that_run_the_ops_own_composite_kernel():
    import functools

    from torch_tpu.compiler.lowering.decompositions import (
        EAGER_RESULT_DTYPE, decomposition_table, tracing_decompositions,
    )

    full, tracing = decomposition_table(), tracing_decompositions()
    assert set(tracing) <= set(full)
    composite = torch._C.DispatchKey.CompositeImplicitAutograd
    left_out = set(full) - set(tracing)
    assert left_out, "the full table has CompositeImplicitAutograd entries"
    for op in left_out:
        entry = full[op]
        runs_own_kernel = (
            isinstance(entry, functools.partial) and entry.keywords.get("kernel") is op
            and entry.func.__name__ == "_special_op_to_decompose_cia"
        ) or op.py_kernels.get(composite) is entry
        assert runs_own_kernel and op._can_decompose(), op
    for op, entry in tracing.items():
        if op not in EAGER_RESULT_DTYPE:
            assert entry is full[op], op
    # A fresh dict each time: make_fx adds entries to the table it is given.
    assert tracing_decompositions() is not tracing


def _composite_ops(x, w, y):
    # CompositeImplicitAutograd ops without a lowering of their own, and aliasing ones.
    a = torch.nn.functional.cosine_similarity(x, y, dim=-1)
    b = torch.einsum("ij,jk->ik", x, w)
    c = torch.nn.functional.group_norm(x.reshape(2, 4, 2), 2)
    d = torch.nn.functional.kl_div(x.log_softmax(-1), y.softmax(-1), reduction="batchmean")
    e = torch.nn.functional.pixel_shuffle(x.reshape(1, 4, 2, 2), 2)
    f = torch.flatten(x.t()).unflatten(0, (4, 4)).narrow(0, 1, 2)
    return a, b, c, d, e, f, torch.nn.functional.linear(x, w, y[0])


def _traced_code(table, context, requires_grad):
    from torch._functorch.aot_autograd import aot_function

    codes = []

    def capture(gm, example_inputs):
        codes.append(gm.code)
        return gm

    torch.manual_seed(0)
    x, w, y = torch.randn(2, 8), torch.randn(8, 8), torch.randn(2, 8)
    if requires_grad:
        x.requires_grad_(True)
    with context():
        out = aot_function(_composite_ops, fw_compiler=capture, bw_compiler=capture, decompositions=table)(x, w, y)
    return codes, out


def test_tracing_table_traces_the_same_graphs_as_the_full_table():
    import contextlib

    from torch_tpu.compiler.lowering.decompositions import decomposition_table, tracing_decompositions

    for context, requires_grad in ((contextlib.nullcontext, True), (torch.no_grad, False),
                                   (torch.inference_mode, False)):
        full_codes, full_out = _traced_code(decomposition_table(), context, requires_grad)
        codes, out = _traced_code(tracing_decompositions(), context, requires_grad)
        assert codes == full_codes, (context, requires_grad)
        torch.testing.assert_close(out, full_out)
        torch.testing.assert_close(out, _composite_ops(*_traced_inputs()))


def _traced_inputs():
    torch.manual_seed(0)
    return torch.randn(2, 8), torch.randn(8, 8), torch.randn(2, 8)


def test_backend_traces_with_the_tracing_table():
    from torch_tpu.compiler.lowering.decompositions import tracing_decompositions

    gm = torch.fx.symbolic_trace(lambda x: (x + 1,))
    compile_with = backend._aot_backend(gm, backend.BackendOptions())
    assert compile_with.keywords["decompositions"].keys() == tracing_decompositions().keys()


# -- XLA compiles while tracing goes on (_compile.PendingGraph) -----------------------------

def _aten_graph():
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    x.meta["val"] = torch.empty(3, 4)
    y = graph.call_function(torch.ops.aten.mul.Tensor, (x, x))
    z = graph.call_function(torch.ops.aten.mm.default, (y, graph.call_function(torch.ops.aten.t.default, (x,))))
    for node, val in ((y, torch.empty(3, 4)), (z, torch.empty(3, 3))):
        node.meta["val"] = val
    graph.output((z,))
    return torch.fx.GraphModule(torch.nn.Module(), graph)


def _expected(x):
    return (x * x) @ x.t()


def test_xla_compiles_in_the_background_until_the_first_call(monkeypatch):
    import threading
    from concurrent.futures import Future

    from torch_tpu.backend import _compile
    from torch_tpu.runtime import get_client

    client = get_client()
    client.cache.clear_l1()
    original, gate, events = client.compile_async, threading.Event(), []

    def gated(module, **kwargs):
        inner, outer = original(module, **kwargs), Future()

        def relay():
            gate.wait(60)
            events.append("compiled")
            error = inner.exception()
            outer.set_exception(error) if error is not None else outer.set_result(inner.result())

        threading.Thread(target=relay, daemon=True).start()
        return outer

    monkeypatch.setattr(client, "compile_async", gated)
    monkeypatch.setattr(_compile, "_defer_first_compile", lambda: True)
    keyed = _compile.compile_graph(_aten_graph(), name="background")
    events.append("returned")
    assert isinstance(keyed._pending, _compile.PendingGraph)
    gate.set()
    x = torch.randn(3, 4)
    torch.testing.assert_close(keyed(x)[0], _expected(x))
    assert events == ["returned", "compiled"]
    assert keyed._pending is None
    # Later calls go to the program (its fast path, `CompiledGraph.fast_path`), without the
    # first call's resolution step.
    entry = keyed._any_mode or next(iter(keyed._by_mode.values()))
    assert entry is not keyed._resolving and not isinstance(entry, _compile.PendingGraph)
    torch.testing.assert_close(keyed(x + 1)[0], _expected(x + 1))


def _missing_target_sin(monkeypatch):
    """aten.sin lowers to a custom call XLA:CPU has no handler for: XLA rejects the module."""
    from torch_tpu.compiler.context import stablehlo
    from torch_tpu.compiler.lowering.registry import LOWERINGS, Lowering

    op = torch.ops.aten.sin.default

    def rule(ctx, x):
        return stablehlo.CustomCallOp([x.type], [x], "torchtpu_test_missing_target").result

    monkeypatch.setitem(LOWERINGS, op, Lowering(op, rule, "test", padding=LOWERINGS[op].padding))


def test_background_compile_failure_is_met_and_recovered_as_a_synchronous_one(monkeypatch, caplog):
    import logging
    import re

    from torch_tpu.backend import _compile
    from torch_tpu.runtime import get_client

    _missing_target_sin(monkeypatch)

    def model(x):
        return torch.cos(torch.sin(x) * 2) + x.sum()

    x = torch.randn(5, 3)
    outcomes = {}
    for defer in (False, True):
        monkeypatch.setattr(_compile, "_defer_first_compile", lambda defer=defer: defer)
        monkeypatch.setattr(_compile, "_reported_fallbacks", set())
        torch._dynamo.reset()
        get_client().cache.clear_l1()
        builds = []
        original = _compile._compile_graph
        monkeypatch.setattr(_compile, "_compile_graph", lambda *a, original=original: builds.append(1) or original(*a))
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="torch_tpu"):
            out = torch.compile(model, backend="tpu")(x)
        monkeypatch.setattr(_compile, "_compile_graph", original)
        torch.testing.assert_close(out, model(x), atol=1e-5, rtol=1e-5)
        warnings = [re.sub(r"-g\d+-", "-g-", r.getMessage())  # graph ids count up
                    for r in caplog.records if r.name == "torch_tpu" and r.levelno >= logging.WARNING]
        outcomes[defer] = (warnings, len(builds))
    (sync_warnings, sync_builds), (deferred_warnings, deferred_builds) = outcomes[False], outcomes[True]
    assert deferred_warnings == sync_warnings and len(sync_warnings) == 1
    assert "torchtpu_test_missing_target" in sync_warnings[0] and "runs in PyTorch eager" in sync_warnings[0]
    assert (sync_builds, deferred_builds) == (1, 2)  # the background compile's failure, then the rebuild


def test_a_failed_background_compile_raises_at_each_resolve_and_never_yields_a_future():
    import time
    from concurrent.futures import Future

    import pytest

    from torch_tpu.program import Program, ProgramKey

    future = Future()
    future.set_exception(RuntimeError("XLA rejected the module"))
    program = Program(ProgramKey("fx_graph", "graph"), "graph", future, module=None, lowered=None, timings={},
                      seconds=0.0, _submitted=time.perf_counter())
    for _ in range(2):
        with pytest.raises(RuntimeError, match="XLA rejected the module"):
            program.resolve()
    done = Future()
    done.set_result("executable")
    program = Program(ProgramKey("fx_graph", "graph"), "graph", done, module=None, lowered=None, timings={},
                      seconds=0.0, _submitted=time.perf_counter())
    assert program.resolve().executable == "executable" and program.resolve().executable == "executable"
    assert set(program.timings) == {"xla_wait", "xla_compile"}


_TOKENIZED_FILES = """
    import torch
    import torch._dynamo.funcname_cache as names
    tokenized = []
    add_file = names._add_file
    names._add_file = lambda filename: (tokenized.append(filename), add_file(filename))[1]

    def gelu_mlp(x):
        return torch.nn.functional.gelu(torch.nn.functional.linear(x, x))

    with torch.no_grad():
        out = torch.compile(gelu_mlp, backend="tpu")(torch.ones(4, 4))
        torch.testing.assert_close(out, gelu_mlp(torch.ones(4, 4)))
    print("tokenized:", len(tokenized))
"""


def test_dynamo_trace_headers_tokenize_no_source_while_their_logs_are_off():
    # Dynamo names the function of every traced line for a debug log (tokenizing each
    # source file in Python, ~0.1 s on the quickstart model's first call) even when the
    # log is off; _dynamo_funcnames makes that lookup wait for the log.
    env = {k: v for k, v in os.environ.items() if k != "TORCH_LOGS"}
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(_TOKENIZED_FILES)], capture_output=True,
                            text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "tokenized: 0" in result.stdout, result.stdout


def test_dynamo_trace_call_log_still_names_the_function_when_on(tmp_path):
    script = tmp_path / "traced.py"  # a file: Dynamo names functions by tokenizing their source file
    script.write_text(textwrap.dedent(_TOKENIZED_FILES))
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300,
                            env={**os.environ, "TORCH_LOGS": "trace_call"})
    assert result.returncode == 0, result.stderr[-3000:]
    assert "tokenized: 0" not in result.stdout, result.stdout
    # The header Dynamo logs names the function after the line: "traced.py:12 in gelu_mlp (gelu_mlp)".
    assert "in gelu_mlp (gelu_mlp)" in result.stderr, result.stderr[-3000:]


def test_dynamo_funcname_lookup_is_wrapped_once_and_follows_the_loggers():
    import logging

    from torch._dynamo import symbolic_convert

    from torch_tpu.backend import _dynamo_funcnames

    assert _dynamo_funcnames.install()
    wrapped = symbolic_convert.get_funcname
    assert _dynamo_funcnames.install() and symbolic_convert.get_funcname is wrapped  # not wrapped twice
    logger = logging.getLogger("torch_tpu.test.trace_call")
    calls = []
    lookup = _dynamo_funcnames.named_when_logged(lambda f, n: calls.append((f, n)) or "Model.forward", [logger])
    logger.setLevel(logging.INFO)
    assert lookup("model.py", 3) is None and calls == []
    logger.setLevel(logging.DEBUG)
    assert lookup("model.py", 3) == "Model.forward" and calls == [("model.py", 3)]


_LOCAL_MAP_MODULE = "torch.distributed.tensor.experimental._func_map"


def test_first_compile_does_not_import_context_parallelism_to_check_for_local_map():
    # Dynamo asks, for every function it wraps (F.scaled_dot_product_attention here),
    # whether it is local_map's wrapper, importing torch.distributed.tensor.experimental
    # (context-parallel attention, flex attention) to ask; _dynamo_local_map answers "no"
    # without it while that module is not imported.
    out = _run(
        f"""
        import sys, torch
        import torch.nn.functional as F

        def attend(q):
            return F.gelu(F.scaled_dot_product_attention(q, q, q, is_causal=True))

        q = torch.randn(1, 2, 8, 4)
        with torch.no_grad():
            out = torch.compile(attend, backend="tpu")(q)
            torch.testing.assert_close(out, attend(q), rtol=1e-5, atol=1e-5)
        print("imported:", {_LOCAL_MAP_MODULE!r} in sys.modules, "torch.distributed.tensor.experimental" in sys.modules)
        """
    )
    assert "imported: False False" in out, out


def test_local_map_check_answers_as_dynamos_once_the_module_is_imported(monkeypatch):
    import importlib

    from torch._dynamo.variables.higher_order_ops import LocalMapWrappedHigherOrderVariable as variable

    from torch_tpu.backend import _dynamo_local_map

    assert _dynamo_local_map.install()
    check = variable.__dict__["should_wrap_in_hop"]
    assert _dynamo_local_map.install() and variable.__dict__["should_wrap_in_hop"] is check  # not wrapped twice
    func_map = importlib.import_module(_LOCAL_MAP_MODULE)
    with variable.enable():
        assert variable.should_wrap_in_hop(func_map._local_map_wrapped)
        assert not variable.should_wrap_in_hop(torch.nn.functional.gelu)
    assert not variable.should_wrap_in_hop(func_map._local_map_wrapped)  # wrapping not enabled: Dynamo's answer
    # Without the module, nothing is local_map's wrapper and nothing is imported to say so.
    monkeypatch.delitem(sys.modules, _LOCAL_MAP_MODULE)
    with variable.enable():
        assert not variable.should_wrap_in_hop(func_map._local_map_wrapped)
    assert _LOCAL_MAP_MODULE not in sys.modules


def test_first_static_compile_imports_neither_the_distributed_runtime_nor_bounded_graphs():
    # A process outside a tpu_dist job compiling a graph of static sizes needs neither
    # (~25 ms of imports on the first compile): _compile asks _dist_graph only once
    # runtime.distributed exists (only its initialize() makes a job).
    out = _run(
        """
        import sys, torch
        model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()).eval()
        x = torch.randn(4, 8)
        with torch.no_grad():
            torch.testing.assert_close(torch.compile(model, backend="tpu")(x), model(x))
        print("imported:", [m for m in ("torch_tpu.runtime.distributed", "torch_tpu.backend._dist_graph", "torch_tpu.backend._dynamic")
                            if m in sys.modules])
        """
    )
    assert "imported: []" in out, out


def test_in_distributed_graph_asks_dist_graph_once_the_distributed_runtime_is_imported(monkeypatch):
    import torch_tpu.runtime.distributed  # noqa: F401 - the module a tpu_dist job imports
    from torch_tpu.backend import _compile, _dist_graph

    gm = torch.fx.symbolic_trace(torch.nn.ReLU())
    asked = []
    monkeypatch.setattr(_dist_graph, "applies", lambda graph: asked.append(graph) or True)
    assert _compile._in_distributed_graph(gm) and asked == [gm]
    monkeypatch.delitem(sys.modules, "torch_tpu.runtime.distributed")
    assert not _compile._in_distributed_graph(gm) and asked == [gm]
