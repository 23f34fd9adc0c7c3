"""Tiny Hugging Face causal LMs (configs with random weights, nothing downloaded) on tpu
tensors, eager and under torch.compile, against the same model on CPU.

Their attention masks are built from `torch.arange` positions (transformers' packed-sequence
detection: a diff, a cumsum and gathers over int64 values): on a TPU v5e 41 of 50 such models
compiled on tpu tensors were off CPU by up to 0.67 relative while every one ran exactly in
eager mode, until `torchtpu-narrow-iotas` made each int64 iota a 32-bit iota converted
(docs/howto/run-on-a-tpu-vm.md). The MoE ones call `F.grouped_mm` on tpu tensors in float32
(device/_tracing_rules.py). Skipped where transformers is not installed (the TPU machine
has it only when staged with the project)."""

from __future__ import annotations

import os

import pytest
import torch

import torch_tpu

transformers = pytest.importorskip("transformers", reason="transformers is not installed (test extra)")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

_SMALL = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
              intermediate_size=64, vocab_size=128, max_position_embeddings=64, head_dim=8, use_cache=False,
              n_embd=32, n_layer=2, n_head=4, n_positions=64, moe_intermediate_size=32, num_local_experts=4,
              num_experts=4, num_experts_per_tok=2, shared_expert_intermediate_size=32, pad_token_id=0)
_MODELS = ["llama", "gpt2", "gemma2", "phi3", "qwen2", "gpt_neox", "mixtral", "qwen3_moe"]


def _model(model_type: str):
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    config = AutoConfig.for_model(model_type)
    for key, value in _SMALL.items():
        if hasattr(config, key):
            setattr(config, key, value)
    torch.manual_seed(0)
    return getattr(transformers, MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type])(config).eval()


def _relative(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.cpu() - want).abs().max() / want.abs().max())


@pytest.mark.parametrize("model_type", _MODELS)
def test_causal_lm_on_tpu_tensors_equals_cpu(chip, model_type, monkeypatch):
    monkeypatch.setenv("TORCH_TPU_STRICT", "1")
    torch._dynamo.reset()
    model = _model(model_type)
    ids = torch.randint(1, 128, (2, 16))
    with torch.no_grad(), torch_tpu.precision("highest"):
        want = model(input_ids=ids).logits
        model.to("tpu")
        eager = model(input_ids=ids.to("tpu")).logits
        compiled = torch.compile(model, backend="tpu")(input_ids=ids.to("tpu")).logits
    print(f"{model_type}: eager {_relative(eager, want):.2e}, compiled {_relative(compiled, want):.2e} relative")
    assert compiled.device.type == "tpu"
    assert _relative(eager, want) < 1e-4
    assert _relative(compiled, want) < 1e-4
