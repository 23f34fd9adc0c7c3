"""Several tpu devices in one process (issue 13): tensors, ops, autograd and an optimizer
step on `tpu:1`; PyTorch's device-mismatch error when one op mixes tpu:0 and tpu:1.

The tests' process has one device (TORCH_TPU_NUM_CPU_DEVICES defaults to 1 and the client
exists already), so each check runs in a subprocess with two XLA:CPU devices, in Strict
and in FUSED mode."""

import os
import subprocess
import sys
import textwrap

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def _run_on_two_devices(code: str, fused: bool) -> str:
    env = {**os.environ, "TORCH_TPU_NUM_CPU_DEVICES": "2", "TORCH_TPU_DEFER_AND_FUSE": "1" if fused else "0"}
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                         timeout=600, env=env, cwd=REPO)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


@pytest.mark.parametrize("fused", [False, True], ids=["strict", "fused"])
def test_training_on_tpu1_matches_cpu(fused):
    out = _run_on_two_devices("""
        import copy
        import torch
        import torch_tpu.device

        assert torch.tpu.device_count() == 2
        x = torch.randn(4, requires_grad=True, device="tpu:1")
        assert x.device == torch.device("tpu:1")
        (x * x).sum().backward()
        assert x.grad.device == torch.device("tpu:1")
        torch.testing.assert_close(x.grad.cpu(), 2 * x.detach().cpu())

        torch.manual_seed(0)
        cpu_model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
        model = copy.deepcopy(cpu_model).to("tpu:1")
        assert {p.device for p in model.parameters()} == {torch.device("tpu:1")}
        cpu_opt = torch.optim.AdamW(cpu_model.parameters(), lr=0.05)
        opt = torch.optim.AdamW(model.parameters(), lr=0.05)
        data = torch.randn(16, 4)
        for _ in range(3):
            for m, o, d in ((cpu_model, cpu_opt, data), (model, opt, data.to("tpu:1"))):
                o.zero_grad()
                loss = m(d).pow(2).mean()
                loss.backward()
                o.step()
        for p, q in zip(model.parameters(), cpu_model.parameters()):
            assert p.device == torch.device("tpu:1") and p.grad.device == torch.device("tpu:1")
            torch.testing.assert_close(p.cpu(), q, rtol=1e-4, atol=1e-5)

        # A graph across the devices: the gradient flows back through the copy.
        a = torch.randn(3, requires_grad=True, device="tpu:0")
        (a.to("tpu:1") * torch.arange(3.0, device="tpu:1")).sum().backward()
        assert a.grad.device == torch.device("tpu:0")
        torch.testing.assert_close(a.grad.cpu(), torch.arange(3.0))

        # "tpu" alone is the current device in factories and Tensor.tpu().
        with torch.tpu.device(1):
            assert torch.ones(2, device="tpu").device == torch.device("tpu:1")
            assert torch.empty(2, device="tpu").device == torch.device("tpu:1")
            assert torch.zeros(2).tpu().device == torch.device("tpu:1")
        assert torch.ones(2, device="tpu").device == torch.device("tpu:0")
        print("ok")
    """, fused)
    assert out.split()[-1] == "ok"


@pytest.mark.parametrize("fused", [False, True], ids=["strict", "fused"])
def test_mixing_tpu0_and_tpu1_is_a_device_mismatch(fused):
    out = _run_on_two_devices("""
        import torch
        import torch_tpu.device

        a = torch.ones(2, device="tpu:0")
        b = torch.ones(2, device="tpu:1", requires_grad=True)
        for fn in (lambda: a + b, lambda: torch.mm(a.view(1, 2), b.view(2, 1)), lambda: b.detach().mul_(a)):
            try:
                fn()
            except RuntimeError as err:
                print(err)
            else:
                print("no error")
        # Copies between devices are not ops: they move the value.
        torch.testing.assert_close(b.detach().to("tpu:0").cpu(), torch.ones(2))
        assert b.detach().to("tpu:0").device == torch.device("tpu:0")
        c = torch.zeros(2, device="tpu:0")
        c.copy_(b.detach() * 3)
        torch.testing.assert_close(c.cpu(), torch.full((2,), 3.0))
    """, fused)
    lines = out.strip().splitlines()
    assert len(lines) == 3, out
    for line in lines:
        assert "Expected all tensors to be on the same device, but found at least two devices" in line, out
        assert "tpu:0" in line and "tpu:1" in line, out


def test_compiled_graph_on_tpu1_runs_there():
    out = _run_on_two_devices("""
        import torch
        import torch_tpu.device

        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
        data = torch.randn(5, 4)
        expected = model(data)
        model = model.to("tpu:1")
        compiled = torch.compile(model, backend="tpu")
        for _ in range(2):
            y = compiled(data.to("tpu:1"))
            assert y.device == torch.device("tpu:1"), y.device
            torch.testing.assert_close(y.cpu(), expected, rtol=1e-5, atol=1e-5)
        print("OK")
    """, fused=False)
    assert "OK" in out
