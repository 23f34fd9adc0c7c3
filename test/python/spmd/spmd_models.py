"""Single-device training steps (forward + backward via autograd, traced with make_fx)
and their shardings, for the partitioner tests and bench/spmd.py."""

from __future__ import annotations

import torch
from torch.fx.experimental.proxy_tensor import make_fx
from torch.nn import functional as F
from torch_tpu.compiler.importer.fx_importer import import_graph
from torch_tpu.spmd import annotate_shardings, process_groups_of


def mlp_step(x, y, w1, b1, w2, b2):
    params = [w1, b1, w2, b2]
    for p in params:
        p.requires_grad_(True)
    h = torch.relu(F.linear(x, w1, b1))
    loss = ((F.linear(h, w2, b2) - y) ** 2).mean()
    return (loss, *torch.autograd.grad(loss, params))


def mlp_args(batch=64, width=16, hidden=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g)
    return [r(batch, width), r(batch, width), r(hidden, width) * 0.3, r(hidden) * 0.1, r(width, hidden) * 0.3, r(width) * 0.1]


HEADS = 4


def block_step(x, wq, wk, wv, wo, w1, w2, g):
    """A pre-norm transformer block (attention + MLP); loss = sum(out * g)."""
    params = [wq, wk, wv, wo, w1, w2]
    for p in params:
        p.requires_grad_(True)
    b, s, d = x.shape
    heads = HEADS
    hd = d // heads
    hn = F.layer_norm(x, (d,))
    q = F.linear(hn, wq).view(b, s, heads, hd).transpose(1, 2)
    k = F.linear(hn, wk).view(b, s, heads, hd).transpose(1, 2)
    v = F.linear(hn, wv).view(b, s, heads, hd).transpose(1, 2)
    att = torch.softmax(q @ k.transpose(-1, -2) / hd**0.5, dim=-1)
    o = (att @ v).transpose(1, 2).reshape(b, s, d)
    x = x + F.linear(o, wo)
    x = x + F.linear(torch.relu(F.linear(F.layer_norm(x, (d,)), w1)), w2)
    loss = (x * g).sum()
    return (loss, *torch.autograd.grad(loss, params))


def block_args(seq=8, dim=16, seed=0, batch=2):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g)
    return ([r(batch, seq, dim)] + [r(dim, dim) * 0.3 for _ in range(4)]
            + [r(4 * dim, dim) * 0.3, r(dim, 4 * dim) * 0.3, r(batch, seq, dim)])


ROW = ("x", None)  # dimension 0 on axis "x"
COL = (None, "x")

# FSDP: every parameter and the batch sharded on dim 0; gradients like their parameters.
FSDP_ARGS = [ROW, ROW, ROW, ("x",), ROW, ("x",)]
FSDP_RESULTS = [()] + FSDP_ARGS[2:]
# Megatron TP MLP: w1 column-parallel (its output features), w2 row-parallel.
TP_MLP_ARGS = [None, None, ROW, ("x",), COL, None]
TP_MLP_RESULTS = [()] + TP_MLP_ARGS[2:]
# Megatron TP block: q/k/v and w1 column-parallel, wo and w2 row-parallel.
TP_BLOCK_ARGS = [None, ROW, ROW, ROW, COL, ROW, COL, None]
TP_BLOCK_RESULTS = [()] + TP_BLOCK_ARGS[1:7]


def sharded_module(step, args, arg_shardings, result_shardings, devices: int, forward_only: bool = False):
    """The single-device StableHLO module of `step` with sdy shardings on a 1-D mesh."""
    fn = step
    if forward_only:
        fn = lambda *a: step(*a)[0]
        result_shardings = result_shardings[:1]
    gm = make_fx(fn)(*args)
    module = import_graph(gm, process_groups=process_groups_of(gm)).module
    return annotate_shardings(module, [("x", devices)], arg_shardings, result_shardings)


def expected(step, args):
    return [t.detach() for t in step(*[a.clone() for a in args])]
