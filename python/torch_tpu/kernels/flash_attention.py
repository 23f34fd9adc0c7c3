"""A flash-attention kernel written in Pallas (`jax.experimental.pallas`), called from
PyTorch through `torch_tpu.jax_op`: the example of docs/howto/call-a-jax-kernel.md.

    from torch_tpu.kernels import flash_attention
    out = flash_attention(q, k, v, causal=True)     # q, k, v: (batch, heads, seq, dim)

equals `F.scaled_dot_product_attention(q, k, v, is_causal=True)`, forward and backward.

Forward: one Pallas program per (batch*head, query block); it walks the key/value
blocks with an online softmax (running max `m`, running sum `l`), so the (seq x seq)
score matrix never exists, and also writes each row's log-sum-exp. Backward: a
`jax.custom_vjp` that recomputes the probabilities from the saved log-sum-exp (flash
attention's backward) in plain JAX. On a TPU the kernel is lowered by Pallas's Mosaic
backend to a `tpu_custom_call` that XLA:TPU compiles (`interpret=None`, the default, picks
that on the tpu platform); elsewhere it runs with `interpret=True` (Pallas lowers it to plain
StableHLO loops).
"""

from __future__ import annotations

import functools
import math
import threading

import torch

__all__ = ["flash_attention"]

_ops: dict[tuple, object] = {}
_lock = threading.Lock()


def _forward_kernel(q_ref, k_ref, v_ref, o_ref, lse_ref, *, scale: float, causal: bool, block_k: int):
    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl

    block_q, head_dim = q_ref.shape
    seq_k = k_ref.shape[0]
    # The matrix unit's operands stay in the input dtype and accumulate in f32 (f32
    # operands would take several passes of a bf16 MXU); the probabilities are rounded to
    # the input dtype before the P V product, as the flash kernels and our StableHLO
    # lowering do.
    q = q_ref[...]
    first_row = pl.program_id(1) * block_q
    rows = first_row + jax.lax.broadcasted_iota(jnp.int32, (block_q, block_k), 0)

    def step(j, carry):
        m, l, acc = carry
        k = k_ref[pl.ds(j * block_k, block_k), :]
        v = v_ref[pl.ds(j * block_k, block_k), :]
        s = jax.lax.dot_general(q, k, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32) * scale
        if causal:
            cols = j * block_k + jax.lax.broadcasted_iota(jnp.int32, (block_q, block_k), 1)
            s = jnp.where(cols <= rows, s, -jnp.inf)
        m_new = jnp.maximum(m, s.max(axis=-1, keepdims=True))
        p = jnp.exp(s - m_new)
        correction = jnp.exp(m - m_new)
        l = l * correction + p.sum(axis=-1, keepdims=True)
        acc = acc * correction + jnp.dot(p.astype(v.dtype), v, preferred_element_type=jnp.float32)
        return m_new, l, acc

    blocks = key_blocks(seq_k, first_row, block_q, block_k, causal)
    init = (jnp.full((block_q, 1), -jnp.inf, jnp.float32), jnp.zeros((block_q, 1), jnp.float32),
            jnp.zeros((block_q, head_dim), jnp.float32))
    m, l, acc = jax.lax.fori_loop(0, blocks, step, init)
    o_ref[...] = (acc / l).astype(o_ref.dtype)
    lse_ref[...] = m + jnp.log(l)


def key_blocks(seq_k: int, first_row, block_q: int, block_k: int, causal: bool):
    """How many key blocks the query block starting at `first_row` walks: all of them, or
    (causal) those up to its last row -- later ones contribute nothing."""
    import jax.numpy as jnp

    blocks = seq_k // block_k
    if causal:
        blocks = jnp.minimum(blocks, (first_row + block_q + block_k - 1) // block_k)
    return blocks


def pallas_forward(q, k, v, *, scale, causal, block_q, block_k, interpret, group: int = 1):
    """q: (bh, seq_q, d), k/v: (bh // group, seq_k, d) -> (out (bh, seq_q, d), lse (bh, seq_q, 1)
    f32). `group` query heads share each key/value head (grouped-query attention: row `b`
    of q reads row `b // group` of k and v, which are never repeated). One program per
    (row, query block) holds its row's whole K and V. (lse keeps a unit last dimension:
    Mosaic tiles the last two dimensions of a block by (8, 128) unless they span the
    array's, so a (block_q,) row block would not lower.)"""
    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl

    bh, seq_q, d = q.shape
    seq_k = k.shape[1]
    kernel = functools.partial(_forward_kernel, scale=scale, causal=causal, block_k=block_k)
    return pl.pallas_call(
        kernel,
        grid=(bh, seq_q // block_q),
        in_specs=[
            pl.BlockSpec((None, block_q, d), lambda b, i: (b, i, 0)),
            pl.BlockSpec((None, seq_k, d), lambda b, i: (b // group, 0, 0)),
            pl.BlockSpec((None, seq_k, d), lambda b, i: (b // group, 0, 0)),
        ],
        out_specs=[
            pl.BlockSpec((None, block_q, d), lambda b, i: (b, i, 0)),
            pl.BlockSpec((None, block_q, 1), lambda b, i: (b, i, 0)),
        ],
        out_shape=[jax.ShapeDtypeStruct(q.shape, q.dtype), jax.ShapeDtypeStruct((bh, seq_q, 1), jnp.float32)],
        interpret=interpret,
    )(q, k, v)


def _attention_function(*, scale, causal, block_q, block_k, interpret):
    """The JAX function (q, k, v) -> out over (batch, heads, seq, dim) arrays, with the
    flash backward as its custom VJP."""
    import jax
    import jax.numpy as jnp

    def flatten(x):
        return x.reshape((-1,) + x.shape[-2:])

    def forward(q, k, v):
        out, lse = pallas_forward(flatten(q), flatten(k), flatten(v), scale=_scale(scale, q), causal=causal,
                                   block_q=block_q, block_k=block_k, interpret=interpret)
        return out.reshape(q.shape), lse.reshape(q.shape[:-1])  # (bh, seq_q, 1) -> (..., seq_q)

    @jax.custom_vjp
    def attention(q, k, v):
        return forward(q, k, v)[0]

    def attention_fwd(q, k, v):
        out, lse = forward(q, k, v)
        return out, (q, k, v, out, lse)

    def attention_bwd(residuals, d_out):
        q, k, v, out, lse = residuals
        f32 = jnp.float32
        qf, kf, vf, of, dof = (x.astype(f32) for x in (q, k, v, out, d_out))
        s = jnp.einsum("...qd,...kd->...qk", qf, kf) * _scale(scale, q)
        if causal:
            seq_q, seq_k = s.shape[-2:]
            s = jnp.where(jnp.tril(jnp.ones((seq_q, seq_k), bool)), s, -jnp.inf)
        p = jnp.exp(s - lse[..., None])
        dv = jnp.einsum("...qk,...qd->...kd", p, dof)
        dp = jnp.einsum("...qd,...kd->...qk", dof, vf)
        delta = (dof * of).sum(-1, keepdims=True)
        ds = p * (dp - delta) * _scale(scale, q)
        dq = jnp.einsum("...qk,...kd->...qd", ds, kf)
        dk = jnp.einsum("...qk,...qd->...kd", ds, qf)
        return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype)

    attention.defvjp(attention_fwd, attention_bwd)
    return attention


def _scale(scale, q) -> float:
    return scale if scale is not None else 1.0 / math.sqrt(q.shape[-1])


def _block(requested: int | None, size: int, what: str) -> int:
    block = requested if requested is not None else min(size, 128)
    if block <= 0 or size % block:
        raise ValueError(f"flash_attention: {what} block {block} must divide the sequence length {size}")
    return block


def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
                    scale: float | None = None, block_q: int | None = None, block_k: int | None = None,
                    interpret: bool | None = None) -> torch.Tensor:
    """Attention of `q` (..., seq_q, dim) over `k`, `v` (..., seq_k, dim), as
    `F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)` (causal:
    the top-left aligned lower triangle). Block sizes (default: min(seq, 128)) must
    divide the sequence lengths. Differentiable; works eagerly (tpu or CPU tensors) and
    inside `torch.compile(backend="tpu")`. `interpret`: run the kernel through Pallas's
    interpreter (None: on every platform but the TPU, where Mosaic compiles it)."""
    if q.dim() < 3 or q.shape[-1] != k.shape[-1] or k.shape != v.shape or q.shape[:-2] != k.shape[:-2]:
        raise ValueError(f"flash_attention: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}: expected "
                         "(..., seq_q, dim), (..., seq_k, dim), (..., seq_k, dim)")
    if interpret is None:
        interpret = _platform() != "tpu"  # Mosaic compiles Pallas kernels for TPUs only
    block_q = _block(block_q, q.shape[-2], "query")
    block_k = _block(block_k, k.shape[-2], "key")
    name = _op_name(causal, scale, block_q, block_k, interpret)
    return getattr(torch.ops.torch_tpu, name).default([q, k, v])[0]


@torch.compiler.assume_constant_result
def _platform() -> str:
    from torch_tpu.runtime import get_client

    return get_client().platform


@torch.compiler.assume_constant_result
def _op_name(causal: bool, scale: float | None, block_q: int, block_k: int, interpret: bool) -> str:
    """The jax_op of one static configuration (jax_op's functions take arrays only),
    defined on first use. Dynamo runs this as plain Python and keeps the name as a
    constant: tracing the lock and the definition would break the graph."""
    from torch_tpu.kernels._jax_op import jax_op

    key = (causal, scale, block_q, block_k, interpret)
    with _lock:
        op = _ops.get(key)
        if op is None:
            op = jax_op(f"flash_attention_{len(_ops)}", _LazyAttention(key))
            _ops[key] = op
    return op.name


class _LazyAttention:
    """The attention function of one configuration, built on first call (building it
    imports jax, which defining the op must not)."""

    def __init__(self, key: tuple) -> None:
        self.key = key
        self._fn = None
        self.__qualname__ = f"flash_attention{key}"

    def __call__(self, q, k, v):
        if self._fn is None:
            causal, scale, block_q, block_k, interpret = self.key
            self._fn = _attention_function(scale=scale, causal=causal, block_q=block_q, block_k=block_k,
                                           interpret=interpret)
        return self._fn(q, k, v)
