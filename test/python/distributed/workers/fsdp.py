"""FSDP2 (`fully_shard`) on tpu tensors for 5 steps equals single-process training on the
full batch, computed on CPU in the same process (run by job.py). Every block and the root
are sharded, so each step all-gathers parameters (into storages FSDP2 frees and
re-allocates with `untyped_storage().resize_`) and reduce-scatters gradients."""

import copy
import time

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard


class Block(torch.nn.Module):
    """A tiny pre-norm transformer block (causal self-attention, MLP)."""

    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
        self.qkv, self.proj = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(d, 2 * d), torch.nn.GELU(), torch.nn.Linear(2 * d, d))

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        att = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(att.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.norm2(x))


class TinyGPT(torch.nn.Module):
    def __init__(self, vocab=32, d=16, heads=2, layers=2, context=8):
        super().__init__()
        self.tok, self.pos = torch.nn.Embedding(vocab, d), torch.nn.Embedding(context, d)
        self.blocks = torch.nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.norm, self.head = torch.nn.LayerNorm(d), torch.nn.Linear(d, vocab)

    def forward(self, idx):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def loss_of(model, idx, targets):
    logits = model(idx)
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())


def check_fsdp():
    """In Strict eager, then in FUSED eager (recorded traces, flushed at the collectives)."""
    from torch_tpu.device import EagerMode, get_eager_mode, set_eager_mode

    previous = get_eager_mode()
    try:
        for mode in (EagerMode.STRICT, EagerMode.FUSED):
            set_eager_mode(mode)
            start = time.monotonic()
            train_and_compare(mode.name)
            print(f"rank {dist.get_rank()}: FSDP2 {mode.name} 5 steps in {time.monotonic() - start:.1f}s", flush=True)
    finally:
        set_eager_mode(previous)
    print(f"rank {dist.get_rank()}: FSDP2 OK", flush=True)


def train_and_compare(mode_name):
    r, n = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    reference = TinyGPT()
    model = copy.deepcopy(reference).to("tpu")
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    # SGD, not Adam: the key bias's gradient is zero up to rounding (softmax ignores a
    # shift), and Adam's normalisation would turn that rounding noise into lr-sized steps.
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(1)
    for step in range(5):
        idx = torch.randint(0, 32, (2 * n, 8), generator=gen)
        targets = torch.randint(0, 32, (2 * n, 8), generator=gen)
        ref_opt.zero_grad()
        loss_of(reference, idx, targets).backward()
        ref_opt.step()
        # this rank's share of the batch; FSDP2 averages the gradients over the ranks
        opt.zero_grad()
        mine = slice(2 * r, 2 * r + 2)
        loss_of(model, idx[mine].to("tpu"), targets[mine].to("tpu")).backward()
        opt.step()
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        got = p.full_tensor().detach().cpu()  # DTensor shards gathered
        if not torch.allclose(got, q.detach(), rtol=1e-4, atol=1e-5):
            raise AssertionError(f"FSDP2 ({mode_name}) {name}: max diff {(got - q).abs().max()}")
