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
