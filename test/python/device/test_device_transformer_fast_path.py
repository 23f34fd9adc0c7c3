"""The inference fast path of nn.TransformerEncoderLayer and nn.MultiheadAttention on the
tpu device: in eval mode without gradients PyTorch calls `_transformer_encoder_layer_fwd` /
`_native_multi_head_attention` (CPU and CUDA kernels only), which the device decomposes
(compiler/lowering/transformer_fast_path.py) instead of running them on the CPU. Each case
compares a tpu copy of a module with its CPU original, eager and under torch.compile, and
checks that no op fell back to the CPU."""

import copy
import logging

import pytest
import torch
import torch.nn as nn

import torch_tpu.device  # noqa: F401 - registers the device where autoload is off
from torch_tpu.compiler.lowering import transformer_fast_path as fast

B, T, D, H = 2, 5, 16, 2


def _padding():
    return torch.tensor([[False] * T, [False, False, False, True, True]])


def _causal(dtype=torch.bool):
    mask = torch.triu(torch.ones(T, T, dtype=torch.bool), 1)
    return mask if dtype is torch.bool else torch.zeros(T, T).masked_fill(mask, float("-inf"))


MASKS = {
    "none": {},
    "key-padding": {"src_key_padding_mask": _padding()},
    "causal-bool": {"src_mask": _causal()},
    "causal-float": {"src_mask": _causal(torch.float32)},
    "causal-and-padding": {"src_mask": _causal(), "src_key_padding_mask": _padding()},
}


def _compiled(module):
    """torch.compile of `module` in a fresh Dynamo state: the parametrized cases share the
    modules' code objects, and other cases' recompiles would otherwise mark dimensions
    dynamic (automatic dynamic shapes), which is not what a case here checks."""
    import torch._dynamo

    torch._dynamo.reset()
    return torch.compile(module, backend="tpu")


def _no_cpu_fallback(caplog):
    return not [r for r in caplog.records if "runs on CPU" in r.getMessage() or "runs in PyTorch eager" in r.getMessage()]


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("norm_first", [False, True], ids=["post-norm", "pre-norm"])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
@pytest.mark.parametrize("masks", list(MASKS))
def test_encoder_layer_fast_path_matches_cpu(masks, activation, norm_first, compiled, caplog):
    torch.manual_seed(0)
    cpu = nn.TransformerEncoderLayer(D, H, 32, activation=activation, norm_first=norm_first, batch_first=True).eval()
    tpu = copy.deepcopy(cpu).to("tpu")
    run = _compiled(tpu) if compiled else tpu
    x = torch.randn(B, T, D)
    kwargs = MASKS[masks]
    caplog.set_level(logging.INFO, logger="torch_tpu")
    with torch.no_grad():
        want = cpu(x, **kwargs)
        got = run(x.to("tpu"), **{k: v.to("tpu") for k, v in kwargs.items()})
    assert got.device.type == "tpu"
    keep = ~_padding() if "padding" in masks else torch.ones(B, T, dtype=torch.bool)
    # Positions the padding mask leaves out hold unspecified values (PyTorch's own compiled
    # path and its eager one differ there too); the others are compared.
    torch.testing.assert_close(got.cpu()[keep], want[keep], rtol=1e-5, atol=1e-5)
    assert _no_cpu_fallback(caplog), [r.getMessage() for r in caplog.records]


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("need_weights,average", [(False, True), (True, True), (True, False)])
@pytest.mark.parametrize("masks", ["none", "key-padding", "causal-bool"])
def test_multi_head_attention_fast_path_matches_cpu(masks, need_weights, average, compiled, caplog):
    torch.manual_seed(0)
    cpu = nn.MultiheadAttention(D, H, batch_first=True).eval()
    tpu = copy.deepcopy(cpu).to("tpu")
    run = _compiled(tpu) if compiled else tpu
    x = torch.randn(B, T, D)
    kwargs = {"key_padding_mask": _padding()} if masks == "key-padding" else (
        {"attn_mask": _causal()} if masks == "causal-bool" else {})
    caplog.set_level(logging.INFO, logger="torch_tpu")
    with torch.no_grad():
        want, want_w = cpu(x, x, x, need_weights=need_weights, average_attn_weights=average, **kwargs)
        xt = x.to("tpu")
        got, got_w = run(xt, xt, xt, need_weights=need_weights, average_attn_weights=average,
                         **{k: v.to("tpu") for k, v in kwargs.items()})
    torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-5)
    if need_weights:
        torch.testing.assert_close(got_w.cpu(), want_w, rtol=1e-5, atol=1e-6)
    else:
        assert got_w is None and want_w is None
    assert _no_cpu_fallback(caplog), [r.getMessage() for r in caplog.records]


@pytest.mark.parametrize("mask_type,shape", [(0, (T, T)), (1, (B, T)), (2, (B, H, T, T)), (None, (B, H, T, T))])
def test_masked_softmax_matches_pytorchs_kernel(mask_type, shape):
    """`_masked_softmax` against PyTorch's CPU kernel for each mask type, rows whose every
    entry is masked included (NaN there, as PyTorch's kernel gives)."""
    gen = torch.Generator().manual_seed(4)
    scores = torch.randn(B, H, T, T, generator=gen)
    mask = torch.rand(shape, generator=gen) > 0.6
    if mask_type == 1:
        mask[1] = True  # a whole sequence padded: every row of its scores masked
    else:
        mask[..., 0, :] = True  # the first query sees no key
    want = torch.ops.aten._masked_softmax(scores, mask, 3, mask_type)
    got = torch.ops.aten._masked_softmax(scores.to("tpu"), mask.to("tpu"), 3, mask_type).cpu()
    assert want.isnan().any()
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7, equal_nan=True)
    torch.testing.assert_close(fast.masked_softmax(scores, mask, 3, mask_type), want, rtol=1e-6, atol=1e-7,
                               equal_nan=True)


def test_reduced_precision_softmax_in_float32():
    scores = torch.randn(B, H, T, T).to(torch.bfloat16)
    mask = torch.zeros(T, T, dtype=torch.bool)
    got = fast.masked_softmax(scores, mask, 3, 0)
    assert got.dtype == torch.bfloat16
    assert torch.equal(got, torch.softmax(scores.float(), -1).to(torch.bfloat16))


@pytest.mark.parametrize("op", list(fast.DECOMPOSITIONS))
def test_fast_path_ops_are_in_the_decomposition_table(op):
    from torch_tpu.compiler.lowering.decompositions import decomposition_table, tracing_decompositions

    assert op in decomposition_table() and op in tracing_decompositions()


def _encoder(**kwargs):
    torch.manual_seed(0)
    return nn.TransformerEncoder(nn.TransformerEncoderLayer(D, H, 32, batch_first=True), 2, **kwargs).eval()


def test_encoder_moved_to_the_device_runs_without_nested_tensors():
    """An nn.TransformerEncoder (nested tensors on by default) given a padding mask in eval
    mode: moved to the device it takes the path without nested tensors (they do not exist
    there), so the call works and the unpadded positions equal CPU's; moved back, its nested
    path is on again."""
    cpu = _encoder()
    assert cpu.use_nested_tensor
    tpu = copy.deepcopy(cpu).to("tpu")
    assert not tpu.use_nested_tensor
    x, pad = torch.randn(B, T, D), _padding()
    with torch.no_grad():
        want = cpu(x, src_key_padding_mask=pad)
        got = tpu(x.to("tpu"), src_key_padding_mask=pad.to("tpu")).cpu()
    torch.testing.assert_close(got[~pad], want[~pad], rtol=1e-5, atol=1e-5)
    assert tpu.cpu().use_nested_tensor
    assert not _encoder(enable_nested_tensor=False).to("tpu").cpu().use_nested_tensor


def test_nested_tensor_on_the_device_is_a_clear_error():
    """An encoder whose nested path is still on (built from layers already on the device)
    fails at the nested tensor with a message that says what to do."""
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(D, H, 32, batch_first=True, device="tpu")
    encoder = nn.TransformerEncoder(layer, 2).eval()
    assert encoder.use_nested_tensor
    x, pad = torch.randn(B, T, D).to("tpu"), _padding().to("tpu")
    with torch.no_grad(), pytest.raises(RuntimeError, match="nested tensors do not exist on the tpu device.*"
                                                               "enable_nested_tensor=False"):
        encoder(x, src_key_padding_mask=pad)
    encoder.use_nested_tensor = False
    with torch.no_grad():
        assert encoder(x, src_key_padding_mask=pad).device.type == "tpu"
