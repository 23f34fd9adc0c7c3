"""The Pallas flash-attention example (torch_tpu.kernels.flash_attention, issue 16
part 2), run by Pallas's interpreter on XLA:CPU, against
F.scaled_dot_product_attention: forward and backward, eager (CPU and tpu tensors) and
compiled with no fallback."""

import pytest
import torch
import torch.nn.functional as F

import torch_tpu.device  # noqa: F401 - registers the device where autoload is off
from torch_tpu.kernels import flash_attention

pytest.importorskip("jax.experimental.pallas")


def _qkv(seq_q=32, seq_k=32, dtype=torch.float32):
    torch.manual_seed(0)
    return (torch.randn(2, 3, seq_q, 16, dtype=dtype), torch.randn(2, 3, seq_k, 16, dtype=dtype),
            torch.randn(2, 3, seq_k, 16, dtype=dtype))


def _grads(fn, q, k, v, grad):
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out = fn(*leaves)
    return (out.detach(), *torch.autograd.grad(out, leaves, grad))


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_forward_and_backward_match_sdpa(causal):
    q, k, v = _qkv()
    grad = torch.randn_like(q)
    got = _grads(lambda q, k, v: flash_attention(q, k, v, causal=causal, block_q=8, block_k=16), q, k, v, grad)
    want = _grads(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal), q, k, v, grad)
    for name, a, b in zip(("out", "dq", "dk", "dv"), got, want):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5, msg=name)


def test_cross_attention_with_scale():
    q, k, v = _qkv(seq_q=16, seq_k=48)
    grad = torch.randn_like(q)
    got = _grads(lambda q, k, v: flash_attention(q, k, v, scale=0.3, block_q=8, block_k=16), q, k, v, grad)
    want = _grads(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, scale=0.3), q, k, v, grad)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_compiled_and_tpu(monkeypatch):
    monkeypatch.setenv("TORCH_TPU_STRICT", "1")  # a fallback would raise
    q, k, v = _qkv()
    grad = torch.randn_like(q)

    def attend(q, k, v):
        return flash_attention(q * 1.5, k, v, causal=True, block_q=16, block_k=8)

    explanation = torch._dynamo.explain(attend)(q, k, v)
    assert explanation.graph_break_count == 0, explanation.break_reasons
    torch._dynamo.reset()
    compiled = torch.compile(attend, backend="tpu")
    got = _grads(compiled, q, k, v, grad)
    want = _grads(lambda q, k, v: F.scaled_dot_product_attention(q * 1.5, k, v, is_causal=True), q, k, v, grad)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    out = attend(*(t.to("tpu") for t in (q, k, v)))
    assert out.device.type == "tpu"
    torch.testing.assert_close(out.cpu(), want[0], rtol=1e-5, atol=1e-5)


def test_block_must_divide_sequence():
    q, k, v = _qkv(seq_q=24)
    with pytest.raises(ValueError, match="query block 16 must divide the sequence length 24"):
        flash_attention(q, k[..., :24, :], v[..., :24, :], block_q=16)
