"""jax_op on the chip: a Pallas kernel compiled for the TPU by Mosaic (not interpret mode),
forward and backward, eager and inside torch.compile."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tpu_support import tpu_only


@pytest.fixture
def qkv():
    g = torch.Generator().manual_seed(0)
    return [torch.randn(2, 4, 256, 64, generator=g) for _ in range(3)]


@pytest.mark.parametrize("causal", [True, False])
def test_flash_attention_forward_and_backward_on_tpu_tensors(chip, platform, qkv, causal, monkeypatch):
    pytest.importorskip("jax")
    from torch_tpu.kernels import flash_attention

    tpu_only(platform, "Mosaic compiles Pallas kernels for TPUs only")
    from torch_tpu.kernels import _jax_op

    lowered = []
    original = _jax_op.trace

    def spy(*args, **kwargs):
        traced = original(*args, **kwargs)
        lowered.append(traced.stablehlo)
        return traced

    monkeypatch.setattr(_jax_op, "trace", spy)
    q, k, v = (t.to("tpu").requires_grad_() for t in qkv)
    out = flash_attention(q, k, v, causal=causal)
    (out * out).sum().backward()
    # Forward through Mosaic (a tpu_custom_call XLA:TPU compiles), not Pallas's interpreter.
    assert lowered and "tpu_custom_call" in lowered[0], "the kernel was not lowered by Mosaic"
    ref_q, ref_k, ref_v = (t.clone().requires_grad_() for t in qkv)
    ref = F.scaled_dot_product_attention(ref_q, ref_k, ref_v, is_causal=causal)
    (ref * ref).sum().backward()
    torch.testing.assert_close(out.detach().cpu(), ref.detach(), atol=2e-3, rtol=2e-3)
    for got, want in ((q, ref_q), (k, ref_k), (v, ref_v)):
        torch.testing.assert_close(got.grad.cpu(), want.grad, atol=5e-3, rtol=5e-3)


def test_flash_attention_inside_torch_compile(chip, qkv):
    pytest.importorskip("jax")
    from torch_tpu.kernels import flash_attention

    q, k, v = (t.to("tpu") for t in qkv)
    compiled = torch.compile(lambda a, b, c: flash_attention(a, b, c, causal=True) * 2, backend="tpu")
    got = compiled(q, k, v)
    torch.testing.assert_close(got.cpu(), F.scaled_dot_product_attention(*qkv, is_causal=True) * 2,
                               atol=2e-3, rtol=2e-3)


@pytest.mark.parametrize("seq,kernels", [(1024, {"forward", "backward"})])
def test_sdpa_runs_the_pallas_kernels_at_long_sequences(chip, platform, monkeypatch, seq, kernels):
    """`auto`: bf16 attention over 1024 tokens lowers its forward and backward to the
    Mosaic kernels (kernels/_fused_attention.py, _flash_backward.py) and agrees with the
    StableHLO lowering."""
    pytest.importorskip("jax")
    tpu_only(platform, "the kernel is offered on TPUs only")
    from torch_tpu.kernels import _fused_attention as fused

    g = torch.Generator().manual_seed(3)
    q = torch.randn(1, 8, seq, 128, generator=g).bfloat16()
    k, v = (torch.randn(1, 2, seq, 128, generator=g).bfloat16() for _ in range(2))
    grad = torch.randn(q.shape, generator=g).bfloat16()

    def run(choice):
        monkeypatch.setenv("TORCH_TPU_ATTENTION_KERNEL", choice)
        torch._dynamo.reset()
        leaves = [t.to("tpu").requires_grad_() for t in (q, k, v)]
        step = torch.compile(lambda a, b, c: F.scaled_dot_product_attention(a, b, c, is_causal=True, enable_gqa=True),
                             backend="tpu")
        out = step(*leaves)
        out.backward(grad.to("tpu"))
        return [out.detach().cpu().float()] + [t.grad.cpu().float() for t in leaves]

    before = len(fused._traces)
    got = run("auto")
    used = {key[0]: t for key, t in fused._traces.items() if key[3][0] == tuple(q.shape)}
    assert len(fused._traces) > before and set(used) == kernels
    assert all("tpu_custom_call" in t.stablehlo for t in used.values()), "not lowered by Mosaic"
    want = run("xla")
    for name, a, b in zip(("out", "dq", "dk", "dv"), got, want):
        assert (a - b).abs().max().item() <= 2e-2 * max(b.abs().max().item(), 1.0), name
