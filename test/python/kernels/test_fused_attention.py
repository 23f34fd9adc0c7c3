"""The Pallas attention kernels (forward and backward) offered to the compiler's
attention lowerings (kernels/_fused_attention.py through core.kernel_slots). On XLA:CPU it runs only when
forced (TORCH_TPU_ATTENTION_KERNEL=pallas), through Pallas's interpreter: the same
kernel the TPU compiles, checked here against PyTorch's CPU attention and against the
StableHLO lowering it replaces, forward and backward, eager and compiled."""

import pytest
import torch
import torch.nn.functional as F

import torch_tpu.device  # noqa: F401 - registers the device where autoload is off
from torch_tpu.core import kernel_slots
from torch_tpu.kernels import _fused_attention as fused

pytest.importorskip("jax.experimental.pallas")


def _qkv(heads, kv_heads, seq_q, seq_k, dtype, dim=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(2, heads, seq_q, dim, generator=g).to(dtype),
            torch.randn(2, kv_heads, seq_k, dim, generator=g).to(dtype),
            torch.randn(2, kv_heads, seq_k, dim, generator=g).to(dtype))


def _attention(q, k, v, causal, mask=None):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, enable_gqa=True)


def _tpu_grads(q, k, v, causal, grad, compiled=False):
    leaves = [t.to("tpu").requires_grad_() for t in (q, k, v)]
    fn = torch.compile(_attention, backend="tpu") if compiled else _attention
    out = fn(*leaves, causal)
    out.backward(grad.to("tpu"))
    return [out.detach().cpu()] + [t.grad.cpu() for t in leaves]


def _cpu_grads(q, k, v, causal, grad):
    leaves = [t.float().requires_grad_() for t in (q, k, v)]
    out = _attention(*leaves, causal)
    out.backward(grad.float())
    return [out.detach()] + [t.grad for t in leaves]


# Sizes the traces cache of earlier tests never saw: each case lowers anew.
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 4e-2)], ids=["f32", "bf16"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("heads,kv_heads,seq_q,seq_k", [(4, 2, 64, 64), (3, 3, 32, 96), (2, 1, 768, 1024)],
                         ids=["gqa", "longer-keys", "several-blocks"])
def test_eager_forward_and_backward_match_pytorch(monkeypatch, dtype, tol, causal, heads, kv_heads, seq_q, seq_k):
    monkeypatch.setenv("TORCH_TPU_ATTENTION_KERNEL", "pallas")
    monkeypatch.setenv("TORCH_TPU_STRICT", "1")
    q, k, v = _qkv(heads, kv_heads, seq_q, seq_k, dtype, seed=seq_q + seq_k + heads)
    grad = torch.randn(q.shape).to(dtype)
    before = set(fused._traces)
    got = _tpu_grads(q, k, v, causal, grad)
    assert {key[0] for key in set(fused._traces) - before} == {"forward", "backward"}, "the kernels were not used"
    for name, a, b in zip(("out", "dq", "dk", "dv"), got, _cpu_grads(q, k, v, causal, grad)):
        scale = b.abs().max().item()
        assert (a.float() - b).abs().max().item() <= tol * max(scale, 1.0), name


def test_compiled_graph_uses_the_kernel_and_matches_the_stablehlo_lowering(monkeypatch):
    monkeypatch.setenv("TORCH_TPU_STRICT", "1")
    q, k, v = _qkv(4, 2, 128, 128, torch.bfloat16, dim=32, seed=7)
    grad = torch.randn(q.shape).to(torch.bfloat16)
    monkeypatch.setenv("TORCH_TPU_ATTENTION_KERNEL", "xla")
    want = _tpu_grads(q, k, v, True, grad, compiled=True)
    torch._dynamo.reset()
    monkeypatch.setenv("TORCH_TPU_ATTENTION_KERNEL", "pallas")
    before = len(fused._traces)
    got = _tpu_grads(q, k, v, True, grad, compiled=True)
    assert len(fused._traces) == before + 2  # the forward and the backward
    for name, a, b in zip(("out", "dq", "dk", "dv"), got, want):
        # Same numerics (bf16 operands, f32 accumulation and softmax, P rounded to bf16):
        # only the order of the f32 sums differs.
        assert (a.float() - b.float()).abs().max().item() <= 2e-2 * max(b.float().abs().max().item(), 1.0), name


def test_a_mask_keeps_the_stablehlo_lowering(monkeypatch):
    monkeypatch.setenv("TORCH_TPU_ATTENTION_KERNEL", "pallas")
    q, k, v = _qkv(2, 2, 48, 48, torch.float32, seed=11)
    mask = torch.rand(48, 48, generator=torch.Generator().manual_seed(1)) > 0.3
    before = len(fused._traces)
    got = _attention(q.to("tpu"), k.to("tpu"), v.to("tpu"), False, mask.to("tpu")).cpu()
    assert len(fused._traces) == before
    torch.testing.assert_close(got, _attention(q, k, v, False, mask), atol=1e-5, rtol=1e-5)


def test_auto_uses_the_kernels_only_on_a_tpu_at_measured_sizes():
    bf16 = torch.bfloat16
    q, kv = (2, 16, 2048, 96), (2, 4, 2048, 96)
    for direction in ("forward", "backward"):
        assert fused._applies(direction, "auto", "tpu", bf16, q, kv, kv)
        assert not fused._applies(direction, "auto", "cpu", bf16, q, kv, kv)  # XLA:CPU: StableHLO
        assert not fused._applies(direction, "auto", "tpu", torch.float32, q, kv, kv)  # not measured for f32
    q512, kv512 = (4, 16, 512, 96), (4, 4, 512, 96)
    for direction in ("forward", "backward"):  # no faster in a training step at 512 tokens
        assert not fused._applies(direction, "auto", "tpu", bf16, q512, kv512, kv512)
    assert fused._applies("forward", "pallas", "cpu", torch.float32, q512, kv512, kv512)


def test_blocks_divide_the_sequences_in_lane_multiples_or_span_them():
    assert fused._blocks("forward", 2048, 2048) == (256, 512)
    assert fused._blocks("backward", 2048, 2048) == (512, 512)
    assert fused._blocks("backward", 768, 768) == (256, 256)
    assert fused._blocks("forward", 96, 40) == (96, 40)  # one block spanning each
    assert fused._blocks("forward", 1000, 1024) is None  # no multiple of 128 divides 1000


def test_shapes_the_kernel_cannot_take_are_declined():
    bf16 = torch.bfloat16
    kv = (1, 2, 2048, 64)
    assert not fused._applies("forward", "pallas", "tpu", bf16, (1, 3, 2048, 64), kv, kv)  # 3 heads over 2
    assert not fused._applies("forward", "pallas", "tpu", bf16, (1, 4, 2048, 64), kv, (1, 2, 2048, 32))  # value dim
    assert not fused._applies("forward", "pallas", "tpu", bf16, (1, 4, 1000, 64), kv, kv)  # no block divides 1000
    long_kv = (1, 2, 65536, 128)  # K and V of one head beyond the VMEM budget
    assert not fused._applies("backward", "pallas", "tpu", bf16, (1, 4, 2048, 128), long_kv, long_kv)


def test_the_choice_keys_compiled_programs():
    from torch_tpu.compiler.lowering.attention import _backward_identity, _forward_identity

    assert kernel_slots.offered(kernel_slots.FUSED_ATTENTION_FORWARD), "torch_tpu.kernels offers the forward"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TORCH_TPU_ATTENTION_KERNEL", "xla")
        xla = _forward_identity(None)
        mp.setenv("TORCH_TPU_ATTENTION_KERNEL", "pallas")
        pallas = _forward_identity(None)
    assert xla != pallas and "lower_forward" in pallas
    assert "lower_backward" in _backward_identity(None)


def test_forcing_the_kernel_without_jax_names_what_to_do(monkeypatch):
    monkeypatch.setenv("TORCH_TPU_ATTENTION_KERNEL", "pallas")
    monkeypatch.setenv("TORCH_TPU_STRICT", "1")
    monkeypatch.setattr(fused, "_jax_available", lambda: False)
    q, k, v = _qkv(2, 2, 40, 40, torch.float32, seed=13)
    with pytest.raises(Exception, match="TORCH_TPU_ATTENTION_KERNEL=pallas needs jax"):
        _attention(q.to("tpu"), k.to("tpu"), v.to("tpu"), False).cpu()


def test_a_reloaded_kernel_replaces_the_one_it_offered_before():
    def kernel(*args):
        return None

    slot = "test-slot"
    kernel_slots.offer(slot, kernel)
    first = kernel_slots.offered(slot)

    def kernel(*args):  # noqa: F811 - the same module and name, as after a reload
        return None

    kernel_slots.offer(slot, kernel)
    assert len(first) == 1 and kernel_slots.offered(slot) == (kernel,)


def test_import_torch_offers_the_kernels_without_loading_jax_or_the_compiler():
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent("""
        import sys, torch
        from torch_tpu.core import kernel_slots
        print(len(kernel_slots.offered(kernel_slots.FUSED_ATTENTION_FORWARD)),
              len(kernel_slots.offered(kernel_slots.FUSED_ATTENTION_BACKWARD)),
              "jax" in sys.modules, "torch_tpu.compiler.lowering" in sys.modules)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["1", "1", "False", "False"]


def _rejected_forward(ctx, q, k, v, attn_mask, is_causal, scale):
    """A forward 'kernel' XLA cannot compile: a custom call to a target nobody registered
    (as a Mosaic kernel a chip or libtpu does not take)."""
    from torch_tpu.compiler.context import ir, stablehlo

    q_type = ir.RankedTensorType(q.type)
    lse_type = ir.RankedTensorType.get(list(q_type.shape)[:3], ir.F32Type.get())
    call = stablehlo.CustomCallOp([q_type, lse_type], [q, k, v], call_target_name="torch_tpu_test_rejected_kernel")
    return call.results[0], call.results[1]


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_a_kernel_xla_rejects_is_replaced_by_the_stablehlo_lowering_with_a_warning(monkeypatch, caplog, compiled):
    """When XLA rejects a module holding an offered kernel, the program is built again
    without kernels (`kernel_slots.declined`) and runs the StableHLO lowering: the right
    values and a warning naming the kernel's slot, never an error or a CPU fallback."""
    import logging

    slot = kernel_slots.FUSED_ATTENTION_FORWARD
    monkeypatch.setitem(kernel_slots._SLOTS, slot, [_rejected_forward])
    monkeypatch.setenv("TORCH_TPU_STRICT", "1")  # a CPU fallback would be an error
    torch._dynamo.reset()
    q, k, v = _qkv(2, 2, 24 + compiled, 24 + compiled, torch.float32, seed=31)
    fn = torch.compile(_attention, backend="tpu") if compiled else _attention
    with caplog.at_level(logging.WARNING, logger="torch_tpu"):
        got = fn(q.to("tpu"), k.to("tpu"), v.to("tpu"), True).cpu()
    torch.testing.assert_close(got, _attention(q, k, v, True), rtol=1e-5, atol=1e-5)
    warnings = [r.getMessage() for r in caplog.records if "XLA rejected" in r.getMessage()]
    assert warnings and slot in warnings[0] and "StableHLO lowering" in warnings[0], warnings
    torch._dynamo.reset()
