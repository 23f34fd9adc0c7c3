"""The backward of the flash forward (`flash_attention.pallas_forward`) as two Pallas
kernels, which recompute each block's probabilities from the forward's log-sum-exp instead
of reading a (seq_q x seq_k) matrix from memory:

* dQ: one program per (query row, query block) walks the key blocks (as the forward does);
* dK and dV: one program per (key/value row, key block, query head of its group) walks the
  query blocks and adds its head's share into f32 dK and dV blocks, which stay in place
  across the group's heads (the innermost grid axis), so grouped K/V heads are never
  repeated.

The dK/dV kernel works on transposed blocks (keys along rows: S^T = K Q^T), so each of its
matmuls is a plain or a right-transposed product, as in the forward; the log-sum-exp and
the row terms D = rowsum(dO * O) come in as rows (1, seq_q) for it, as columns for dQ.
Numerics are those of the StableHLO backward (compiler/lowering/attention.py): operands in
the input dtype, P and dS rounded to it, f32 accumulation.
"""

from __future__ import annotations

import functools

from .flash_attention import key_blocks

__all__ = ["pallas_backward"]


def _dq_kernel(q_ref, k_ref, v_ref, do_ref, lse_ref, d_ref, dq_ref, *, scale: float, causal: bool, block_k: int):
    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl

    block_q, head_dim = q_ref.shape
    seq_k = k_ref.shape[0]
    q, do = q_ref[...], do_ref[...]
    lse, d = lse_ref[...], d_ref[...]  # (block_q, 1) f32
    first_row = pl.program_id(1) * block_q
    rows = first_row + jax.lax.broadcasted_iota(jnp.int32, (block_q, block_k), 0)
    nt = (((1,), (1,)), ((), ()))

    def step(j, dq):
        k = k_ref[pl.ds(j * block_k, block_k), :]
        v = v_ref[pl.ds(j * block_k, block_k), :]
        s = jax.lax.dot_general(q, k, nt, preferred_element_type=jnp.float32) * scale
        p = jnp.exp(s - lse)
        if causal:
            cols = j * block_k + jax.lax.broadcasted_iota(jnp.int32, (block_q, block_k), 1)
            p = jnp.where(cols <= rows, p, 0.0)
        dp = jax.lax.dot_general(do, v, nt, preferred_element_type=jnp.float32)
        ds = p * (dp - d)
        return dq + jnp.dot(ds.astype(k.dtype), k, preferred_element_type=jnp.float32)

    blocks = key_blocks(seq_k, first_row, block_q, block_k, causal)
    dq = jax.lax.fori_loop(0, blocks, step, jnp.zeros((block_q, head_dim), jnp.float32))
    dq_ref[...] = (dq * scale).astype(dq_ref.dtype)


def _dkv_kernel(q_ref, k_ref, v_ref, do_ref, lse_ref, d_ref, dk_ref, dv_ref, *, scale: float, causal: bool,
                block_q: int):
    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl

    block_k, head_dim = k_ref.shape
    seq_q = q_ref.shape[0]
    k, v = k_ref[...], v_ref[...]
    first_col = pl.program_id(1) * block_k  # this block's first key
    keys = first_col + jax.lax.broadcasted_iota(jnp.int32, (block_k, block_q), 0)
    nt = (((1,), (1,)), ((), ()))

    @pl.when(pl.program_id(2) == 0)
    def _():
        dk_ref[...] = jnp.zeros(dk_ref.shape, dk_ref.dtype)
        dv_ref[...] = jnp.zeros(dv_ref.shape, dv_ref.dtype)

    def step(i, carry):
        dk, dv = carry
        start = pl.multiple_of(i * block_q, block_q)
        q = q_ref[pl.ds(start, block_q), :]
        do = do_ref[pl.ds(start, block_q), :]
        lse = lse_ref[:, pl.ds(start, block_q)]  # (1, block_q) f32
        d = d_ref[:, pl.ds(start, block_q)]
        st = jax.lax.dot_general(k, q, nt, preferred_element_type=jnp.float32) * scale  # (block_k, block_q)
        pt = jnp.exp(st - lse)
        if causal:
            queries = start + jax.lax.broadcasted_iota(jnp.int32, (block_k, block_q), 1)
            pt = jnp.where(keys <= queries, pt, 0.0)
        dv = dv + jnp.dot(pt.astype(do.dtype), do, preferred_element_type=jnp.float32)
        dpt = jax.lax.dot_general(v, do, nt, preferred_element_type=jnp.float32)
        dst = pt * (dpt - d)
        dk = dk + jnp.dot(dst.astype(q.dtype), q, preferred_element_type=jnp.float32)
        return dk, dv

    # Causal: query blocks wholly before this key block's first key see none of it.
    first = first_col // block_q if causal else 0
    zeros = jnp.zeros((block_k, head_dim), jnp.float32)
    dk, dv = jax.lax.fori_loop(first, seq_q // block_q, step, (zeros, zeros))
    dk_ref[...] += dk * scale
    dv_ref[...] += dv


def pallas_backward(q, k, v, out, d_out, lse, *, scale, causal, block_q, block_k, interpret, group: int = 1):
    """q, out, d_out: (bh, seq_q, d); k, v: (bh // group, seq_k, d); lse: (bh, seq_q) f32 ->
    (dq in q's dtype, dk and dv in f32)."""
    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl

    bh, seq_q, dim = q.shape
    bkv, seq_k, _ = k.shape
    f32 = jnp.float32
    d = jnp.sum(d_out.astype(f32) * out.astype(f32), axis=-1)  # (bh, seq_q)
    dq = pl.pallas_call(
        functools.partial(_dq_kernel, scale=scale, causal=causal, block_k=block_k),
        grid=(bh, seq_q // block_q),
        in_specs=[
            pl.BlockSpec((None, block_q, dim), lambda b, i: (b, i, 0)),
            pl.BlockSpec((None, seq_k, dim), lambda b, i: (b // group, 0, 0)),
            pl.BlockSpec((None, seq_k, dim), lambda b, i: (b // group, 0, 0)),
            pl.BlockSpec((None, block_q, dim), lambda b, i: (b, i, 0)),
            pl.BlockSpec((None, block_q, 1), lambda b, i: (b, i, 0)),
            pl.BlockSpec((None, block_q, 1), lambda b, i: (b, i, 0)),
        ],
        out_specs=pl.BlockSpec((None, block_q, dim), lambda b, i: (b, i, 0)),
        out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
        interpret=interpret,
    )(q, k, v, d_out, lse[..., None], d[..., None])
    # (bh, 1, seq_q): the rows the dK/dV kernel reads (a reshape of a unit dim, no copy).
    lse_rows, d_rows = lse[:, None, :], d[:, None, :]
    dk, dv = pl.pallas_call(
        functools.partial(_dkv_kernel, scale=scale, causal=causal, block_q=block_q),
        grid=(bkv, seq_k // block_k, group),
        in_specs=[
            pl.BlockSpec((None, seq_q, dim), lambda b, j, g: (b * group + g, 0, 0)),
            pl.BlockSpec((None, block_k, dim), lambda b, j, g: (b, j, 0)),
            pl.BlockSpec((None, block_k, dim), lambda b, j, g: (b, j, 0)),
            pl.BlockSpec((None, seq_q, dim), lambda b, j, g: (b * group + g, 0, 0)),
            pl.BlockSpec((None, 1, seq_q), lambda b, j, g: (b * group + g, 0, 0)),
            pl.BlockSpec((None, 1, seq_q), lambda b, j, g: (b * group + g, 0, 0)),
        ],
        out_specs=[
            pl.BlockSpec((None, block_k, dim), lambda b, j, g: (b, j, 0)),
            pl.BlockSpec((None, block_k, dim), lambda b, j, g: (b, j, 0)),
        ],
        out_shape=[jax.ShapeDtypeStruct(k.shape, f32), jax.ShapeDtypeStruct(v.shape, f32)],
        interpret=interpret,
    )(q, k, v, d_out, lse_rows, d_rows)
    return dq, dk, dv
