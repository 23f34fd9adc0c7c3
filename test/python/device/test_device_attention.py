"""`F.scaled_dot_product_attention` on tpu tensors is ONE fused attention op
(`aten._scaled_dot_product_fused_attention_overrideable`, device/_attention.py), eager and
compiled alike, where PyTorch would otherwise give a PrivateUse1 backend its math
decomposition (both matmuls in float32); everything the fused op does not cover still
runs PyTorch's composite kernel. Values and gradients against CPU eager."""

import pytest
import torch
import torch.nn.functional as F

import torch_tpu.device  # noqa: F401 - registers the device where autoload is off

aten = torch.ops.aten
FUSED = aten._scaled_dot_product_fused_attention_overrideable.default
FUSED_BW = aten._scaled_dot_product_fused_attention_overrideable_backward.default
TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2}


def _inputs(dtype, hq=4, hk=4, L=6, S=6, E=8, grad=True):
    gen = torch.Generator().manual_seed(0)
    return [torch.randn(2, h, n, E, generator=gen).to(dtype).requires_grad_(grad)
            for h, n in ((hq, L), (hk, S), (hk, S))]


def _on_tpu(tensors):
    return [t.detach().to("tpu").requires_grad_(t.requires_grad) for t in tensors]


def _check(fn, cpu_inputs, dtype):
    ref = fn(*cpu_inputs)
    ref.float().square().sum().backward()
    tpu = _on_tpu(cpu_inputs)
    out = fn(*tpu)
    out.float().square().sum().backward()
    tol = TOL[dtype]
    torch.testing.assert_close(out.cpu(), ref, rtol=tol, atol=tol)
    for got, want in zip(tpu, cpu_inputs):
        if want.requires_grad:
            torch.testing.assert_close(got.grad.cpu(), want.grad, rtol=4 * tol, atol=4 * tol)
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case", ["causal", "gqa", "bool_mask", "float_mask_with_grad", "scale", "cross"])
def test_eager_sdpa_is_one_fused_op(case, dtype):
    shape = {"gqa": {"hk": 2}, "cross": {"L": 3, "S": 9}}.get(case, {})
    q, k, v = _inputs(dtype, **shape)
    mask = None
    if case == "bool_mask":
        mask = torch.rand(q.shape[2], k.shape[2], generator=torch.Generator().manual_seed(1)) > 0.4
        mask[:, 0] = True  # no fully masked row (CPU's math gives NaN there, the fused kernels 0)
    elif case == "float_mask_with_grad":
        mask = torch.randn(1, 4, q.shape[2], k.shape[2]).to(dtype).requires_grad_()
    kwargs = {"is_causal": case in ("causal", "gqa"), "enable_gqa": case == "gqa",
              "scale": 0.25 if case == "scale" else None}
    inputs = [q, k, v] + ([mask] if mask is not None else [])

    def attention(q, k, v, m=None):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=m, **kwargs)

    out = _check(attention, inputs, dtype)
    assert type(out.grad_fn).__name__ == "ScaledDotProductFusedAttentionOverrideableBackward0"


@pytest.mark.parametrize("case", ["dropout", "three_dims", "mixed_dtypes", "gqa_not_enabled"])
def test_what_the_fused_op_does_not_cover_runs_pytorchs_kernel(case):
    q, k, v = _inputs(torch.float32, hk=2 if case == "gqa_not_enabled" else 4, grad=False)
    if case == "three_dims":
        q, k, v = q[0], k[0], v[0]
    if case == "mixed_dtypes":
        v = v.double()
    tq, tk, tv = _on_tpu([q, k, v])
    if case == "dropout":
        out = F.scaled_dot_product_attention(tq, tk, tv, dropout_p=0.5)
        assert out.shape == q.shape and torch.isfinite(out.cpu()).all()
        return
    with pytest.raises(RuntimeError) as on_cpu:
        F.scaled_dot_product_attention(q, k, v) if case != "three_dims" else (_ for _ in ()).throw(RuntimeError())
    if case == "three_dims":
        torch.testing.assert_close(F.scaled_dot_product_attention(tq, tk, tv).cpu(),
                                   F.scaled_dot_product_attention(q, k, v), rtol=1e-5, atol=1e-5)
        return
    with pytest.raises(type(on_cpu.value)):
        F.scaled_dot_product_attention(tq, tk, tv)


def test_compiled_attention_graphs_hold_the_fused_op_and_its_backward():
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    graphs = []

    def keep(gm, _):
        graphs.append(gm)
        return make_boxed_func(gm.forward)

    torch._dynamo.reset()
    fn = torch.compile(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True),
                       backend=aot_autograd(fw_compiler=keep, bw_compiler=keep))
    q, k, v = _on_tpu(_inputs(torch.bfloat16, hk=2))
    fn(q, k, v).float().sum().backward()
    targets = {n.target for gm in graphs for n in gm.graph.nodes}
    assert FUSED in targets and FUSED_BW in targets
    assert aten.bmm.default not in targets and aten._to_copy.default not in targets


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_compiled_attention_matches_cpu(dtype, strict_compile):
    torch._dynamo.reset()
    compiled = torch.compile(
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True), backend="tpu")
    _check(compiled, _inputs(dtype, hk=2), dtype)


@pytest.fixture
def reduced_precision_attention():
    """PyTorch's switch for 16-bit reductions in attention, on for the test only."""
    before = torch.backends.cuda.fp16_bf16_reduction_math_sdp_allowed()
    torch.backends.cuda.allow_fp16_bf16_reduction_math_sdp(True)
    yield
    torch.backends.cuda.allow_fp16_bf16_reduction_math_sdp(before)


def _attention_reference(q, k, v, round_scores):
    """Causal attention in float64 from bf16 inputs, and the gradients of its output's sum of
    squares: Q K^T rounded to bf16 first or not, softmax in full precision, P and the
    output rounded to bf16 (as the lowering does; each rounding passes the gradient
    through)."""
    q, k, v = (t.detach().double().requires_grad_() for t in (q, k, v))

    def rounded(x):
        return x + (x.to(torch.bfloat16).double() - x).detach()

    s = q @ k.transpose(-1, -2)
    if round_scores:
        s = rounded(s)
    s = s / q.shape[-1] ** 0.5
    s = s.masked_fill(~torch.ones(s.shape[-2:], dtype=torch.bool).tril(), float("-inf"))
    out = rounded(rounded(torch.softmax(s, -1)) @ v)
    out.square().sum().backward()
    return out.detach().to(torch.bfloat16), [t.grad.float() for t in (q, k, v)]


def _relative_error(got, want, scale):
    return max(((g - w).abs().max() / s.abs().max()).item() for g, w, s in zip(got, want, scale))


def test_reduced_precision_attention_rounds_the_scores_of_compiled_graphs(reduced_precision_attention,
                                                                         strict_compile):
    """With `allow_fp16_bf16_reduction_math_sdp(True)` a compiled graph's bf16 attention
    rounds Q K^T to bf16 before its float32 softmax (JAX's reference attention does; half
    the bytes where the scores are stored); the switch keys the compiled programs, so
    turning it off again gives the float32 scores back. Eager attention keeps float32
    scores either way (its programs are not keyed by the switch, which only permits).
    The backward recomputes P from the same rounded scores: the gradients follow the rounded
    reference too. Scores near 250 (bf16's step there is 1) that differ by a few units make
    the two differ far beyond the output's rounding."""
    torch._dynamo.reset()
    gen = torch.Generator().manual_seed(3)
    q = (32 + 0.1 * torch.randn(1, 2, 16, 8, generator=gen)).to(torch.bfloat16)
    k = (1 + 0.05 * torch.randn(1, 2, 16, 8, generator=gen)).to(torch.bfloat16)
    v = torch.randn(1, 2, 16, 8, generator=gen).to(torch.bfloat16)
    (rounded, rounded_grads), (exact, exact_grads) = (_attention_reference(q, k, v, r) for r in (True, False))
    # The inputs tell the two apart, in the output and in the gradients (the backward
    # recomputes P from the scores).
    assert (rounded.float() - exact.float()).abs().max() > 0.1
    assert _relative_error(rounded_grads, exact_grads, exact_grads) > 0.12

    def attention(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    def compiled_run():
        torch._dynamo.reset()
        tq, tk, tv = _on_tpu([q.requires_grad_(), k.requires_grad_(), v.requires_grad_()])
        out = torch.compile(attention, backend="tpu")(tq, tk, tv)
        out.float().square().sum().backward()
        return out.detach().cpu(), [t.grad.cpu().float() for t in (tq, tk, tv)]

    out, grads = compiled_run()
    torch.testing.assert_close(out, rounded, rtol=0, atol=1.6e-2)
    assert _relative_error(grads, rounded_grads, exact_grads) < 0.06  # (bf16 P and dS in the matmuls)
    torch.testing.assert_close(attention(*_on_tpu([q, k, v])).cpu(), exact, rtol=0, atol=1.6e-2)  # eager
    torch.backends.cuda.allow_fp16_bf16_reduction_math_sdp(False)
    out, grads = compiled_run()
    torch.testing.assert_close(out, exact, rtol=0, atol=1.6e-2)
    assert _relative_error(grads, exact_grads, exact_grads) < 0.06
