"""Scaled dot-product attention lowerings against eager (CPU flash kernel)."""

import pytest
import torch
import torch.nn.functional as F
from harness import check, lower_and_run

aten = torch.ops.aten
torch.manual_seed(0)
FLASH = aten._scaled_dot_product_flash_attention_for_cpu.default
FLASH_BW = aten._scaled_dot_product_flash_attention_for_cpu_backward.default
FUSED = aten._scaled_dot_product_fused_attention_overrideable.default
FUSED_BW = aten._scaled_dot_product_fused_attention_overrideable_backward.default


def _qkv(b=2, hq=4, hk=4, L=5, S=7, E=8, dtype=torch.float32):
    return (torch.randn(b, hq, L, E, dtype=dtype), torch.randn(b, hk, S, E, dtype=dtype),
            torch.randn(b, hk, S, E, dtype=dtype))


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", [{}, {"L": 7, "S": 3}, {"L": 1, "S": 1}, {"hk": 2}, {"hk": 1, "L": 6, "S": 6}],
                         ids=["basic", "L>S", "single", "gqa2", "mqa"])
def test_flash_attention_cpu(shape, causal):
    q, k, v = _qkv(**shape)
    check(lambda q, k, v: FLASH(q, k, v, is_causal=causal), q, k, v, rtol=1e-5, atol=1e-5, ops=[FLASH])


def test_flash_attention_cpu_masks_and_scale():
    q, k, v = _qkv()
    mask = torch.randn(5, 7)
    mask[0] = float("-inf")  # a fully masked row: output 0, logsumexp 0
    mask[2, 3] = float("-inf")
    check(lambda q, k, v, m: FLASH(q, k, v, attn_mask=m, scale=0.3), q, k, v, mask, rtol=1e-5, atol=1e-5, ops=[FLASH])
    check(lambda q, k, v, m: FLASH(q, k, v, 0.0, True, attn_mask=m), q, k, v, torch.randn(2, 1, 5, 7),
          rtol=1e-5, atol=1e-5, ops=[FLASH])


def test_sdpa_functional():
    q, k, v = _qkv()
    bool_mask = torch.rand(5, 7) > 0.3
    check(lambda q, k, v: F.scaled_dot_product_attention(q, k, v), q, k, v, rtol=1e-5, atol=1e-5, ops=[FLASH])
    check(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.5), q, k, v,
          rtol=1e-5, atol=1e-5, ops=[FLASH])
    # A bool mask becomes an additive float mask (where) before the op.
    check(lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m), q, k, v, bool_mask,
          rtol=1e-5, atol=1e-5, ops=[FLASH])
    q, k, v = _qkv(hk=2)
    check(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, enable_gqa=True), q, k, v,
          rtol=1e-5, atol=1e-5, ops=[FLASH])


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-7), (torch.float16, 2e-3), (torch.bfloat16, 2e-2)])
def test_flash_attention_cpu_dtypes(dtype, tol):
    q, k, v = _qkv(dtype=dtype)
    check(lambda q, k, v: FLASH(q, k, v, is_causal=True), q, k, v, rtol=tol, atol=tol, ops=[FLASH])


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", [{}, {"L": 7, "S": 3}, {"hk": 2}, {"hk": 1}], ids=["basic", "L>S", "gqa2", "mqa"])
def test_flash_attention_cpu_backward(shape, causal):
    q, k, v = _qkv(**shape)
    mask = torch.randn(shape.get("L", 5), shape.get("S", 7))
    mask[0, :] = float("-inf")
    out, lse = FLASH(q, k, v, is_causal=causal, attn_mask=mask)
    g = torch.randn(out.shape)

    def fn(g, q, k, v, out, lse, mask):
        return FLASH_BW(g, q, k, v, out, lse, 0.0, causal, attn_mask=mask)

    check(fn, g, q, k, v, out, lse, mask, rtol=1e-4, atol=1e-4, ops=[FLASH_BW])


def test_flash_attention_cpu_backward_half():
    q, k, v = _qkv(dtype=torch.bfloat16)
    out, lse = FLASH(q, k, v)
    g = torch.randn(out.shape, dtype=torch.bfloat16)
    check(lambda g, q, k, v, out, lse: FLASH_BW(g, q, k, v, out, lse, 0.0, False), g, q, k, v, out, lse,
          rtol=3e-2, atol=3e-2, ops=[FLASH_BW])


def test_sdpa_training_graph_matches_autograd():
    # aot_autograd's backward graph for SDPA holds the flash backward op.
    from functorch.compile import make_boxed_func
    from torch._functorch.aot_autograd import aot_function

    graphs = []

    def compiler(gm, _):
        graphs.append(gm)
        return make_boxed_func(gm.forward)

    q, k, v = (t.requires_grad_() for t in _qkv(hk=2))
    fn = aot_function(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True),
                      fw_compiler=compiler, bw_compiler=compiler)
    fn(q, k, v).sum().backward()
    targets = {n.target for gm in graphs for n in gm.graph.nodes}
    assert FLASH_BW in targets


def test_efficient_attention():
    # No CPU kernel: compare with the flash lowering's eager result.
    q, k, v = _qkv(L=40, S=9)
    bias = torch.randn(2, 4, 40, 9)
    outs, _, _ = lower_and_run(
        lambda q, k, v, b: aten._scaled_dot_product_efficient_attention(q, k, v, b, True, 0.0, True, scale=0.2),
        q, k, v, bias)
    ref, lse = FLASH(q, k, v, is_causal=True, attn_mask=bias, scale=0.2)
    torch.testing.assert_close(outs[0], ref, rtol=1e-5, atol=1e-5)
    assert outs[1].shape == (2, 4, 64)
    torch.testing.assert_close(outs[1][..., :40], lse, rtol=1e-5, atol=1e-5)


def test_dropout_fails_clearly():
    from torch_tpu.compiler.lowering import LoweringError

    q, k, v = _qkv()
    with pytest.raises(LoweringError, match="dropout"):
        lower_and_run(lambda q, k, v: FLASH_BW(q, q, k, v, q, q[..., 0], 0.5, False), q, k, v)


@pytest.mark.parametrize("mask", [None, "bool", "float"])
@pytest.mark.parametrize("shape", [{}, {"hk": 2}, {"L": 7, "S": 3}], ids=["basic", "gqa2", "L>S"])
def test_fused_attention_overrideable(shape, mask):
    # PyTorch has no CPU kernel for the op out-of-tree backends override: compare with the
    # CPU flash kernel, which computes the same attention.
    q, k, v = _qkv(**shape)
    m = {None: None, "bool": torch.rand(q.shape[2], k.shape[2]) > 0.3,
         "float": torch.randn(2, 1, q.shape[2], k.shape[2])}[mask]
    causal = mask is None
    outs, _, _ = lower_and_run(lambda q, k, v, *m: FUSED(q, k, v, *(m or (None,)), 0.0, causal, scale=0.4),
                               q, k, v, *(() if m is None else (m,)))
    additive = None if m is None else torch.where(m, 0.0, float("-inf")) if m.dtype == torch.bool else m
    ref, lse = FLASH(q, k, v, is_causal=causal, attn_mask=additive, scale=0.4)
    torch.testing.assert_close(outs[0], ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(outs[1], lse, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("bias_grad", [False, True])
def test_fused_attention_overrideable_backward(bias_grad):
    q, k, v = _qkv(hk=2)
    bias = torch.randn(1, 4, 5, 7)
    grad_out = torch.randn(2, 4, 5, 8)
    # Reference: autograd through PyTorch's math attention, the bias a leaf.
    refs = [t.clone().requires_grad_() for t in (q, k, v, bias)]
    rq, rk, rv, rb = refs
    rep = lambda t: t.repeat_interleave(2, dim=1)  # noqa: E731
    scores = rq @ rep(rk).transpose(-1, -2) * 0.3 + rb
    ref_out = scores.softmax(-1) @ rep(rv)
    ref_out.backward(grad_out)
    out, lse = ref_out.detach(), scores.logsumexp(-1).detach()

    def backward(g, q, k, v, b, o, l):
        return FUSED_BW(g, q, k, v, b, [True, True, True, bias_grad], o, l, None, None, 5, 7, 0.0, False,
                        torch.tensor(0), torch.tensor(0), scale=0.3)

    outs, _, _ = lower_and_run(backward, grad_out, q, k, v, bias, out, lse)
    for got, ref in zip(outs[:3], refs[:3]):
        torch.testing.assert_close(got, ref.grad, rtol=1e-4, atol=1e-4)
    if bias_grad:
        torch.testing.assert_close(outs[3], rb.grad, rtol=1e-4, atol=1e-4)
    else:
        assert not outs[3].any()  # not asked for: zeros of the mask's shape, as PyTorch's meta says
