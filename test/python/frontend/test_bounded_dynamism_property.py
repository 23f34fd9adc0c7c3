"""Property: random chains of padding-sensitive ops over a dynamic dim, compiled once at
a bound, equal eager at random sizes below it (fixed seed; atol/rtol 1e-4, float32)."""

import os

import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch_tpu.runtime import get_client

BOUND = 16
W = torch.randn(8, 8, generator=torch.Generator().manual_seed(1))

# Each step maps [2, s, 8] -> [2, s, 8] and reads across the dynamic dim s (or changes
# its layout), so padding that leaks anywhere shows up in the output.
STEPS = {
    "softmax_s": lambda x: x.softmax(1),
    "cumsum_s": lambda x: x.cumsum(1) / x.shape[1],
    "center_s": lambda x: x - x.mean(1, keepdim=True),
    "scale_by_std_s": lambda x: x / (x.std(1, keepdim=True) + 1.0),
    "attend": lambda x: F.scaled_dot_product_attention(x[:, None], x[:, None], x[:, None])[:, 0],
    "causal": lambda x: F.scaled_dot_product_attention(
        x[:, None], x[:, None], x[:, None], is_causal=True
    )[:, 0],
    "linear_flat": lambda x: (x.reshape(-1, 8) @ W).reshape(x.shape),
    "add_max_s": lambda x: x + x.amax(1, keepdim=True),
    "add_last": lambda x: x + x[:, -1:],
    "positions": lambda x: x + torch.arange(x.shape[1], dtype=x.dtype)[None, :, None] / BOUND,
    "norm_over_s": lambda x: F.layer_norm(x.transpose(1, 2), (x.shape[1],)).transpose(1, 2),
}


@settings(max_examples=12, deadline=None, derandomize=True)
@given(
    chain=st.lists(st.sampled_from(sorted(STEPS)), min_size=2, max_size=4),
    sizes=st.lists(st.integers(2, BOUND), min_size=2, max_size=3),
)
def test_chains_match_eager_below_the_bound(chain, sizes):
    def fn(x):
        for name in chain:
            x = STEPS[name](x)
        return x

    torch._dynamo.reset()
    compiled = torch.compile(fn, backend="tpu")
    strict = os.environ.get("TORCH_TPU_STRICT")
    os.environ["TORCH_TPU_STRICT"] = "1"  # every step compiles: no eager fallback
    try:
        _check(compiled, fn, chain, sizes)
    finally:
        if strict is None:
            del os.environ["TORCH_TPU_STRICT"]
        else:
            os.environ["TORCH_TPU_STRICT"] = strict


def _check(compiled, fn, chain, sizes):
    client = get_client()
    before = client.cache.stats.compiles
    # Own generator: the values must not depend on which tests ran before.
    g = torch.Generator().manual_seed(len(sizes))
    for n in [BOUND, *sizes]:
        x = torch.randn(2, n, 8, generator=g)
        torch._dynamo.mark_dynamic(x, 1, min=2, max=BOUND)
        torch.testing.assert_close(
            compiled(x), fn(x), atol=1e-4, rtol=1e-4, msg=f"{chain} at size {n}"
        )
    assert client.cache.stats.compiles - before <= 1  # one compile (0: an L1 hit)
