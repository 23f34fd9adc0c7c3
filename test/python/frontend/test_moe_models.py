"""Mixture-of-experts architectures of transformers 5.23 (Mixtral, Qwen2-MoE, Qwen3-MoE,
DeepSeek-V3), built from tiny configs with random weights, compiled with TORCH_TPU_STRICT=1
(no op may fall back to eager) and compared with eager.

Their experts run `grouped_mm_experts_forward`: under Dynamo with float32 weights that calls
the custom op `transformers::grouped_mm_fallback` (a Python loop over `offs.tolist()`, not
traceable), which `_custom_ops.ATEN_EQUIVALENTS` compiles as `aten._grouped_mm`; its
backward op likewise."""

from __future__ import annotations

import os

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="transformers is not installed (test extra)")

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing is downloaded: configs are built here

_COMMON = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_attention_heads=4,
               num_key_value_heads=2, max_position_embeddings=64)


def _mixtral():
    config = transformers.MixtralConfig(**_COMMON, num_hidden_layers=1, num_local_experts=4, num_experts_per_tok=2)
    return transformers.MixtralForCausalLM(config)


def _qwen2_moe():
    config = transformers.Qwen2MoeConfig(**_COMMON, num_hidden_layers=1, num_experts=4, num_experts_per_tok=2,
                                         moe_intermediate_size=32, shared_expert_intermediate_size=32)
    return transformers.Qwen2MoeForCausalLM(config)


def _qwen3_moe():
    config = transformers.Qwen3MoeConfig(**_COMMON, num_hidden_layers=1, num_experts=4, num_experts_per_tok=2,
                                         moe_intermediate_size=32, head_dim=8)
    return transformers.Qwen3MoeForCausalLM(config)


def _deepseek_v3():
    # Layer 0 is dense (first_k_dense_replace), layer 1 the MoE one; grouped routing (n_group).
    config = transformers.DeepseekV3Config(
        **{**_COMMON, "num_key_value_heads": 4}, num_hidden_layers=2, first_k_dense_replace=1,
        n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1, moe_intermediate_size=32,
        n_group=2, topk_group=1, kv_lora_rank=16, q_lora_rank=16, qk_rope_head_dim=8,
        qk_nope_head_dim=8, v_head_dim=8,
    )
    return transformers.DeepseekV3ForCausalLM(config)


@pytest.fixture
def strict(monkeypatch):
    monkeypatch.setenv("TORCH_TPU_STRICT", "1")
    torch._dynamo.reset()


@pytest.mark.parametrize("build", [_mixtral, _qwen2_moe, _qwen3_moe, _deepseek_v3],
                         ids=["mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v3"])
def test_moe_model_compiles_strictly_and_equals_eager(strict, build):
    torch.manual_seed(0)
    model = build().eval()
    assert model.config._experts_implementation == "grouped_mm"  # the path under test
    ids = torch.randint(0, 64, (2, 8))
    with torch.no_grad():
        expected = model(ids).logits
        actual = torch.compile(model, backend="tpu")(ids).logits
    torch.testing.assert_close(actual, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("build", [_mixtral, _qwen3_moe], ids=["mixtral", "qwen3_moe"])
def test_moe_model_on_tpu_tensors_compiles_and_equals_cpu_eager(strict, build):
    # On tpu tensors transformers calls torch.nn.functional.grouped_mm in float32 directly
    # (its "tpu" branch), not the fallback op: Dynamo's fake tensors must take it.
    torch.manual_seed(0)
    model = build().eval()
    ids = torch.randint(0, 64, (2, 8))
    with torch.no_grad():
        expected = model(ids).logits
        model.to("tpu")
        eager = model(ids.to("tpu")).logits
        compiled = torch.compile(model, backend="tpu")(ids.to("tpu")).logits
    assert compiled.device.type == "tpu"
    torch.testing.assert_close(eager.cpu(), expected, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(compiled.cpu(), expected, rtol=1e-4, atol=1e-4)


def test_the_grouped_mm_fallback_op_and_its_backward(strict):
    # Empty expert 1, and rows of every other expert: forward and both gradients.
    torch.manual_seed(0)
    x = torch.randn(10, 8, requires_grad=True)
    w = torch.randn(3, 8, 16, requires_grad=True)
    offs = torch.tensor([4, 4, 10], dtype=torch.int32)

    def f(x, w):
        return (torch.ops.transformers.grouped_mm_fallback(x.tanh(), w, offs) ** 2).sum()

    import transformers.integrations.moe  # noqa: F401 - defines the op

    torch.compile(f, backend="tpu")(x, w).backward()
    compiled = x.grad, w.grad
    x.grad = w.grad = None
    f(x, w).backward()
    torch.testing.assert_close(compiled[0], x.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(compiled[1], w.grad, rtol=1e-5, atol=1e-5)
