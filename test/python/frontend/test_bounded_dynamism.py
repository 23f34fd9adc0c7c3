"""Bounded dynamism end to end: one compile for every size up to a bound, outputs equal
to eager at every size (docs/explanation/bounded-dynamism.md).

Tolerances: float32 models, atol/rtol 1e-4 (XLA:CPU vs eager differ by reassociation)."""

import logging

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch_tpu.examples.quickstart import TinyGPT

from bounded_support import compiles, fresh_dynamic_compiles

TOL = {"atol": 1e-4, "rtol": 1e-4}
BOUND = 32
# 20 lengths in [1, BOUND], in a fixed shuffled order. The first one is what Dynamo
# traces with: tracing at size 1 lets PyTorch specialize some metadata to 1.
LENGTHS = [9, 1, 32, 5, 17, 2, 30, 13, 3, 24, 7, 28, 16, 11, 31, 8, 21, 19, 26, 23]


@pytest.fixture(autouse=True)
def _fresh():
    with fresh_dynamic_compiles():
        yield




class EncoderBlock(nn.Module):
    """A BERT block: bidirectional attention (no mask), post-LayerNorm, GELU MLP."""

    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d, 3 * d)
        self.out = nn.Linear(d, d)
        self.ln1 = nn.LayerNorm(d)
        self.ff = nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))
        self.ln2 = nn.LayerNorm(d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = (
            z.view(b, t, self.heads, d // self.heads).transpose(1, 2)
            for z in self.qkv(x).split(d, -1)
        )
        # (SDPA, as BERT implementations use: PyTorch's decomposition of a 4-D `q @ k^T`
        # guards on `t != 1`, which would compile size 1 separately.)
        attn = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, t, d)
        x = self.ln1(x + self.out(attn))
        return self.ln2(x + self.ff(x))


class TinyBert(nn.Module):
    """BERT-style encoder: token + position embeddings, bidirectional blocks, mean pooling
    over the sequence and a pooled classifier head."""

    def __init__(self, vocab=64, d=32, heads=4, layers=2, seq=BOUND) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(seq, d)
        self.blocks = nn.ModuleList(EncoderBlock(d, heads) for _ in range(layers))
        self.cls = nn.Linear(d, 3)

    def forward(self, ids):
        x = self.tok(ids) + self.pos(torch.arange(ids.shape[1]))
        for block in self.blocks:
            x = block(x)
        return x, self.cls(torch.tanh(x.mean(dim=1)))


def _run_lengths(model, make_input, dim, lengths):
    compiled = torch.compile(model, backend="tpu")
    before = compiles()
    for n in lengths:
        x = make_input(n)
        torch._dynamo.mark_dynamic(x, dim, min=1, max=BOUND)
        with torch.no_grad():
            torch.testing.assert_close(compiled(x), model(x), **TOL, msg=f"size {n}")
    return compiles() - before


def test_gpt_dynamic_sequence_one_compile():
    torch.manual_seed(0)
    model = TinyGPT(vocab=64, d=32, heads=4, layers=2, seq=BOUND).eval()
    assert _run_lengths(model, lambda n: torch.randint(0, 64, (2, n)), 1, LENGTHS) == 1


def test_bert_dynamic_sequence_one_compile():
    torch.manual_seed(0)
    model = TinyBert().eval()
    assert _run_lengths(model, lambda n: torch.randint(0, 64, (2, n)), 1, LENGTHS) == 1


def test_gpt_dynamic_batch_one_compile():
    torch.manual_seed(0)
    model = TinyGPT(vocab=64, d=32, heads=4, layers=1, seq=8).eval()
    assert _run_lengths(model, lambda n: torch.randint(0, 64, (n, 8)), 0, LENGTHS[::2]) == 1


def test_gpt_dynamic_batch_and_sequence_one_compile():
    """Two symbols: the flattening views take the gather path (two dynamic dims)."""
    torch.manual_seed(0)
    model = TinyGPT(vocab=64, d=32, heads=4, layers=1, seq=16).eval()
    compiled = torch.compile(model, backend="tpu")
    before = compiles()
    for batch, n in [(3, 5), (1, 16), (4, 2), (2, 9), (8, 1)]:
        ids = torch.randint(0, 64, (batch, n))
        torch._dynamo.mark_dynamic(ids, 0, min=1, max=8)
        torch._dynamo.mark_dynamic(ids, 1, min=1, max=16)
        with torch.no_grad():
            torch.testing.assert_close(compiled(ids), model(ids), **TOL)
    assert compiles() - before == 1


def test_training_step_dynamic_batch():
    """aot_autograd forward + backward with a symbolic batch: loss and gradients match
    eager at every batch size, one compile per graph (forward, backward)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.LayerNorm(32), nn.Linear(32, 10))
    reference = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.LayerNorm(32), nn.Linear(32, 10))
    reference.load_state_dict(model.state_dict())

    def step(m, x, y):
        loss = F.cross_entropy(m(x), y)
        loss.backward()
        return loss

    compiled = torch.compile(lambda x, y: step(model, x, y), backend="tpu")
    before = compiles()
    for n in (3, 9, 17, 32, 5):
        x, y = torch.randn(n, 16), torch.randint(0, 10, (n,))
        torch._dynamo.mark_dynamic(x, 0, min=1, max=BOUND)
        torch._dynamo.mark_dynamic(y, 0, min=1, max=BOUND)
        model.zero_grad()
        reference.zero_grad()
        loss = compiled(x, y)
        expected = step(reference, x, y)
        torch.testing.assert_close(loss, expected, **TOL)
        for p, q in zip(model.parameters(), reference.parameters()):
            torch.testing.assert_close(p.grad, q.grad, **TOL)
    assert compiles() - before == 2  # the forward and the backward graph, once each


def _ops():
    w = torch.randn(8, 8)
    conv = nn.Conv1d(8, 4, 3, padding=1)
    bn = nn.BatchNorm1d(8)
    idx = torch.tensor([0, 2, 1, 0])

    def rms(x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)

    def causal(x):
        t = x.shape[1]
        mask = torch.tril(torch.ones(t, t, dtype=torch.bool))
        scores = (x @ x.transpose(1, 2)).masked_fill(~mask, float("-inf"))
        return scores.softmax(-1) @ x

    return {
        "sum": lambda x: x.sum(1),
        "amax": lambda x: x.amax(1),
        "softmax": lambda x: x.softmax(1),
        "log_softmax": lambda x: x.log_softmax(1),
        "mean": lambda x: x.mean(1),
        "var": lambda x: x.var(1),
        "std_mean": lambda x: torch.std_mean(x, 1)[0] + torch.std_mean(x, 1)[1],
        "layer_norm_over_dynamic": lambda x: F.layer_norm(x.transpose(1, 2), (x.shape[1],)),
        "rms_norm": rms,
        "matmul_contract_dynamic": lambda x: x.transpose(1, 2) @ x,
        "causal_mask": causal,
        "arange": lambda x: x + torch.arange(x.shape[1], dtype=x.dtype)[None, :, None],
        "argmax": lambda x: x.argmax(1),
        "cumsum": lambda x: x.cumsum(1),
        "cat": lambda x: torch.cat([x, 2 * x], 1).sum(1),
        "gather_along_dynamic": lambda x: x.index_select(2, idx).sum(1),
        "take_rows": lambda x: torch.gather(x, 1, torch.zeros(2, x.shape[1], 8, dtype=torch.long)),
        "flatten_merge": lambda x: (x.reshape(-1, 8) @ w).reshape(x.shape),
        "last_token": lambda x: x[:, -1] * 2,
        "tail_slice": lambda x: x[:, -2:] * 2,
        "drop_first": lambda x: (x[:, 1:] * 2).sum(1),
        "narrow_from_end": lambda x: x.narrow(1, x.shape[1] - 2, 2) * 2,
        "mse_loss_mean": lambda x: F.mse_loss(x, torch.full_like(x, 0.5)),
        "bce_with_logits_mean": lambda x: F.binary_cross_entropy_with_logits(x, torch.ones_like(x)),
        "cumsum_two_dynamic_dims": lambda x: x.transpose(1, 2).reshape(2 * 8, -1).cumsum(0),
        "flip_falls_back": lambda x: x.flip(1).cumsum(1),
        "conv_along_dynamic_falls_back": lambda x: conv(x.transpose(1, 2)).sum(-1),
        "batch_norm_train_falls_back": lambda x: bn(x.transpose(1, 2)).sum(-1),
    }


@pytest.mark.parametrize("name", list(_ops()))
def test_ops_ignore_padding(name, monkeypatch):
    """Each op compiles (TORCH_TPU_STRICT: no eager fallback) and matches eager at sizes
    below the bound; the `*_falls_back` ones depend on where the dynamic dim ends (or XLA
    rejects them) and must run in eager instead, still matching."""
    falls_back = name.endswith("falls_back")
    if not falls_back:
        monkeypatch.setenv("TORCH_TPU_STRICT", "1")
    torch.manual_seed(0)
    fn = _ops()[name]
    compiled = torch.compile(fn, backend="tpu")
    counts = []
    for n in (3, 7, 16):
        before = compiles()
        x = torch.randn(2, n, 8)
        torch._dynamo.mark_dynamic(x, 1, min=3, max=16)
        torch.testing.assert_close(compiled(x), fn(x), **TOL, msg=f"{name} at size {n}")
        counts.append(compiles() - before)
    # Compiled once, at the first size (all partitions around an eager op then).
    assert counts[1:] == [0, 0]
    if not falls_back:
        assert counts[0] == 1


def test_size_above_bound_recompiles_once(monkeypatch, caplog):
    """dynamic=True without a max: the policy bound (fixed 8 here); a larger size
    recompiles once with a larger bound and is logged; never a wrong answer."""
    monkeypatch.setenv("TORCH_TPU_DYNAMIC_BOUND", "8")

    def f(x):
        return F.softmax(x * 2, dim=0).sum(0) * x.shape[0]

    compiled = torch.compile(f, backend="tpu", dynamic=True)
    before = compiles()
    with caplog.at_level(logging.WARNING, logger="torch_tpu"):
        for n in (3, 5, 8, 12, 9, 16, 4):
            x = torch.randn(n, 4)
            torch.testing.assert_close(compiled(x), f(x), **TOL)
    notes = [r for r in caplog.records if "exceeds its compiled bound" in r.getMessage()]
    assert len(notes) == 1
    assert compiles() - before == 2


def test_static_graphs_stay_static():
    compiled = torch.compile(lambda x: x.sum(0), backend="tpu")
    for n in (2, 6):
        x = torch.randn(n, 3)
        torch.testing.assert_close(compiled(x), x.sum(0))


def test_gpt_training_step_dynamic_batch():
    """A GPT training step (embeddings, attention, LM loss; embedding_dense_backward
    scatters rows) with a dynamic batch: loss and every gradient match eager."""
    torch.manual_seed(0)
    model = TinyGPT(vocab=64, d=32, heads=4, layers=1, seq=8)
    reference = TinyGPT(vocab=64, d=32, heads=4, layers=1, seq=8)
    reference.load_state_dict(model.state_dict())

    def step(m, ids, targets):
        loss = F.cross_entropy(m(ids).reshape(-1, 64), targets.reshape(-1))
        loss.backward()
        return loss

    compiled = torch.compile(lambda i, t: step(model, i, t), backend="tpu")
    before = compiles()
    for n in (5, 1, 12, 3, 16):
        ids, targets = torch.randint(0, 64, (n, 8)), torch.randint(0, 64, (n, 8))
        torch._dynamo.mark_dynamic(ids, 0, min=1, max=16)
        torch._dynamo.mark_dynamic(targets, 0, min=1, max=16)
        model.zero_grad()
        reference.zero_grad()
        torch.testing.assert_close(compiled(ids, targets), step(reference, ids, targets), **TOL)
        for (name, p), q in zip(model.named_parameters(), reference.parameters()):
            torch.testing.assert_close(p.grad, q.grad, **TOL, msg=f"grad of {name} at batch {n}")
    assert compiles() - before == 2


def test_bad_bound_policy_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("TORCH_TPU_DYNAMIC_BOUND", "huge")
    compiled = torch.compile(lambda x: x.sum(0), backend="tpu", dynamic=True)
    with pytest.raises(
        Exception, match="TORCH_TPU_DYNAMIC_BOUND='huge': use 'pow2' or a positive integer"
    ):
        compiled(torch.randn(5, 3))


def test_pow2_policy_bound(monkeypatch):
    """dynamic=True without a max: the default policy bounds a size n by the next power
    of two (at least 16); sizes up to it share one compile."""
    monkeypatch.delenv("TORCH_TPU_DYNAMIC_BOUND", raising=False)
    compiled = torch.compile(lambda x: x.cumsum(0) * x.shape[0], backend="tpu", dynamic=True)
    before = compiles()
    for n in (20, 3, 32, 17):
        x = torch.randn(n, 3)
        torch.testing.assert_close(compiled(x), x.cumsum(0) * n, **TOL)
    assert compiles() - before == 1
