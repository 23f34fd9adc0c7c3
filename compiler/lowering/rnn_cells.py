"""The fused LSTM and GRU cells PyTorch's recurrent modules call on an accelerator.

`nn.LSTM`, `nn.GRU`, `nn.LSTMCell` and `nn.GRUCell` compute a cell's gate matmuls with
ordinary ops, then, for an input on CUDA, XPU or a PrivateUse1 device (ours), hand the
gates to one fused kernel: `_thnn_fused_lstm_cell` / `_thnn_fused_gru_cell`, whose
backward is `_thnn_fused_lstm_cell_backward_impl` / `_thnn_fused_gru_cell_backward`. Those
kernels exist for CUDA only (a CPU tensor never reaches them), so on the tpu device they
are decomposed here into elementwise ops, for eager ops and for traced graphs alike.

The formulas and the workspace each forward returns follow PyTorch's CUDA kernels
(aten/src/ATen/native/cuda/RNN.cu): the LSTM workspace holds the four activated gates
[input, forget, cell, output], the GRU workspace [reset, update, new gate, hx, the
hidden part of the new gate]; the backward reads them in that order. float16 and
bfloat16 compute in float32 and round once, as the CUDA kernels' accumulate type does.
"""

from __future__ import annotations

import torch

from .opmath import to_opmath

aten = torch.ops.aten


def _opmath(*tensors: torch.Tensor | None) -> list[torch.Tensor | None]:
    return [to_opmath(t) for t in tensors]


def _gates_with_bias(gates: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return gates if bias is None else gates + bias


def lstm_cell(input_gates, hidden_gates, cx, input_bias=None, hidden_bias=None):
    """-> (hy, cy, workspace)."""
    out = cx.dtype
    ig_, hg_, c, ib, hb = _opmath(input_gates, hidden_gates, cx, input_bias, hidden_bias)
    gates = _gates_with_bias(ig_, ib) + _gates_with_bias(hg_, hb)
    i, f, g, o = gates.chunk(4, 1)
    i, f, g, o = i.sigmoid(), f.sigmoid(), g.tanh(), o.sigmoid()
    cy = f * c + i * g
    hy = o * cy.tanh()
    workspace = torch.cat([i, f, g, o], 1)
    return hy.to(out), cy.to(out), workspace.to(input_gates.dtype)


def lstm_cell_backward(grad_hy, grad_cy, cx, cy, workspace, has_bias):
    """-> (grad_gates, grad_cx, grad_bias or None)."""
    if grad_hy is None and grad_cy is None:
        return None, None, None
    out = workspace.dtype
    gh, gc, c, c_new, ws = _opmath(grad_hy, grad_cy, cx, cy, workspace)
    i, f, g, o = ws.chunk(4, 1)
    gh = torch.zeros_like(c) if gh is None else gh
    tanh_cy = c_new.tanh()
    grad_c = gh * o * (1 - tanh_cy * tanh_cy)
    if gc is not None:
        grad_c = grad_c + gc
    grad_gates = torch.cat([grad_c * g * (1 - i) * i,
                            grad_c * c * (1 - f) * f,
                            grad_c * i * (1 - g * g),
                            gh * tanh_cy * (1 - o) * o], 1).to(out)
    grad_cx = (grad_c * f).to(cx.dtype)
    return grad_gates, grad_cx, grad_gates.sum(0) if has_bias else None


def gru_cell(input_gates, hidden_gates, hx, input_bias=None, hidden_bias=None):
    """-> (hy, workspace)."""
    out = hx.dtype
    ig_, hg_, h, ib, hb = _opmath(input_gates, hidden_gates, hx, input_bias, hidden_bias)
    ir, ii, in_ = _gates_with_bias(ig_, ib).chunk(3, 1)
    hr, hi, hn = _gates_with_bias(hg_, hb).chunk(3, 1)
    r = (ir + hr).sigmoid()
    z = (ii + hi).sigmoid()
    n = (in_ + r * hn).tanh()
    hy = n + z * (h - n)
    workspace = torch.cat([r, z, n, h, hn], 1)
    return hy.to(out), workspace.to(input_gates.dtype)


def gru_cell_backward(grad_hy, workspace, has_bias):
    """-> (grad_input_gates, grad_hidden_gates, grad_hx, grad_input_bias, grad_hidden_bias)."""
    out = grad_hy.dtype
    gh, ws = _opmath(grad_hy, workspace)
    r, z, n, h, hn = ws.chunk(5, 1)
    grad_z = gh * (h - n) * (1 - z) * z
    grad_in = gh * (1 - z) * (1 - n * n)
    grad_hn = grad_in * r
    grad_r = grad_in * hn * (1 - r) * r
    grad_input_gates = torch.cat([grad_r, grad_z, grad_in], 1).to(out)
    grad_hidden_gates = torch.cat([grad_r, grad_z, grad_hn], 1).to(out)
    grad_hx = (gh * z).to(out)
    if not has_bias:
        return grad_input_gates, grad_hidden_gates, grad_hx, None, None
    return grad_input_gates, grad_hidden_gates, grad_hx, grad_input_gates.sum(0), grad_hidden_gates.sum(0)


DECOMPOSITIONS = {
    aten._thnn_fused_lstm_cell.default: lstm_cell,
    aten._thnn_fused_lstm_cell_backward_impl.default: lstm_cell_backward,
    aten._thnn_fused_gru_cell.default: gru_cell,
    aten._thnn_fused_gru_cell_backward.default: gru_cell_backward,
}
