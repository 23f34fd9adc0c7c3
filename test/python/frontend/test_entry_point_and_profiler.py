"""backend="tpu" works without importing torch_tpu; compile phases show in the profiler."""

import os
import subprocess
import sys
import textwrap

import torch


def test_backend_found_through_entry_point_without_import():
    script = textwrap.dedent(
        """
        import sys, torch
        assert "torch_tpu" not in sys.modules
        out = torch.compile(lambda x: torch.sin(x) * 2, backend="tpu")(torch.ones(3))
        torch.testing.assert_close(out, torch.sin(torch.ones(3)) * 2)
        assert "torch_tpu.backend" in sys.modules
        print("ok")
        """
    )
    # The eager tpu device autoloads torch_tpu on `import torch` (torch.backends entry
    # point); with it off, this checks the Dynamo entry point alone.
    env = {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().endswith("ok")


def test_compile_phases_appear_in_profiler_trace():
    torch._dynamo.reset()
    compiled = torch.compile(lambda x: torch.relu(x) + 1, backend="tpu")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        compiled(torch.randn(5))
    names = {event.name for event in prof.events()}
    for phase in ("torch_tpu::convert", "torch_tpu::passes", "torch_tpu::xla_compile"):
        assert phase in names, sorted(n for n in names if "torch_tpu" in n)
