"""Hugging Face `generate` on a compiled forward (#30 item 9): a greedy decode loop compiles
a bounded, fixed number of graphs and gives eager's tokens, for GPT-2 and Llama (tiny
configs, random weights, nothing downloaded); what PyTorch's own graph passes add under
`dynamic=True` is lowered (`true_divide` from Dynamo's tensorify pass, in GPT-2's GELU;
the lowerings themselves: test/python/lowering/test_elementwise.py),
and an error about a node that has no source line of its own names its neighbour's.

The recipes and the counts measured here are in docs/tutorials/getting-started.md
("Hugging Face models and `generate`")."""

from __future__ import annotations

import pytest
import torch
import torch.fx

transformers = pytest.importorskip("transformers")

VOCAB = 128
PROMPT = 7
NEW_TOKENS = 12


@pytest.fixture(autouse=True)
def _fresh():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _model(which: str):
    torch.manual_seed(0)
    if which == "gpt2":
        config = transformers.GPT2Config(vocab_size=VOCAB, n_positions=64, n_embd=32, n_layer=2, n_head=2,
                                         bos_token_id=0, eos_token_id=0)
        return transformers.GPT2LMHeadModel(config).eval()
    config = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
                                      bos_token_id=0, eos_token_id=0)
    return transformers.LlamaForCausalLM(config).eval()


def _generate(model, ids, **kwargs):
    # eos never stops the loop early (min_new_tokens), so every run takes NEW_TOKENS steps.
    with torch.no_grad():
        return model.generate(ids, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False,
                              pad_token_id=0, **kwargs)


def _compile_counting(model, **compile_kwargs) -> list:
    """Compiles `model.forward` (what `generate` calls) with the tpu backend; the list
    collects one entry per graph Dynamo hands the backend."""
    graphs: list = []
    tpu = torch._dynamo.lookup_backend("tpu")

    def counting(gm, example_inputs):
        graphs.append(gm)
        return tpu(gm, example_inputs)

    model.forward = torch.compile(model.forward, backend=counting, **compile_kwargs)
    return graphs


# Graphs measured for a 12-token greedy generate of a 7-token prompt (torch 2.13,
# transformers 5.23). Static cache: the prefill graph and one decode graph, whatever the
# number of tokens (the cache has its full length from the first step).
STATIC_CACHE_GRAPHS = {"gpt2": 2, "llama": 2}


@pytest.mark.parametrize("which", sorted(STATIC_CACHE_GRAPHS))
def test_static_cache_generate_compiles_once_per_phase_and_equals_eager(which, monkeypatch):
    monkeypatch.setenv("TORCH_TPU_STRICT", "1")  # nothing falls back to eager
    model = _model(which)
    ids = torch.randint(1, VOCAB, (1, PROMPT), generator=torch.Generator().manual_seed(1))
    expected = _generate(model, ids, cache_implementation="static")
    graphs = _compile_counting(model)
    assert torch.equal(_generate(model, ids, cache_implementation="static"), expected)
    assert len(graphs) == STATIC_CACHE_GRAPHS[which]
    # A second generate of another prompt compiles nothing more.
    other = torch.randint(1, VOCAB, (1, PROMPT), generator=torch.Generator().manual_seed(2))
    with torch._dynamo.config.patch(error_on_recompile=True):
        compiled = _generate(model, other, cache_implementation="static")
    model.forward = model.forward._torchdynamo_orig_callable
    assert torch.equal(compiled, _generate(model, other, cache_implementation="static"))


def test_dynamic_true_generate_compiles_under_strict_with_a_bounded_count(monkeypatch):
    """dynamic=True with the default (growing) cache: GPT-2's GELU constant becomes
    `true_divide` tensor ops in Dynamo's tensorify pass; they compile (under
    TORCH_TPU_STRICT they raised 'no lowering'). Two Dynamo frames (prefill, decode) of
    two graphs each; the cache length grows past its bound (16) once, a recompile of the
    same graph at bound 32, not a new graph."""
    monkeypatch.setenv("TORCH_TPU_STRICT", "1")
    model = _model("gpt2")
    ids = torch.randint(1, VOCAB, (1, PROMPT), generator=torch.Generator().manual_seed(1))
    expected = _generate(model, ids)
    graphs = _compile_counting(model, dynamic=True)
    assert torch.equal(_generate(model, ids), expected)
    assert len(graphs) == 4
    ops = {str(n.target) for g in graphs for n in g.graph.nodes if n.op == "call_function"}
    assert any("truediv" in op or "true_divide" in op for op in ops), ops


def test_a_node_without_a_source_line_is_described_by_its_users_line():
    from torch_tpu.compiler.fx_locations import describe_node

    def fn(x):
        return torch.tanh(x * 2.0) + 1

    gm = torch.fx.symbolic_trace(fn)
    mul, tanh, add = [n for n in gm.graph.nodes if n.op == "call_function"]
    tanh.meta["stack_trace"] = '  File "model.py", line 12, in forward\n    y = torch.tanh(x * 2.0)\n'
    add.meta["stack_trace"] = '  File "model.py", line 13, in forward\n    return y + 1\n'
    assert describe_node(tanh).endswith("(node tanh) at model.py:12")
    assert describe_node(mul).endswith("(node mul) near model.py:12")  # its user's line
    del tanh.meta["stack_trace"], add.meta["stack_trace"]
    assert describe_node(mul).endswith("(node mul)")  # nothing to borrow: no location
