"""nn.LSTM, nn.GRU and their cells on the tpu device. PyTorch hands an accelerator's gates to
fused cell kernels that exist for CUDA only (`_thnn_fused_lstm_cell`, `_thnn_fused_gru_cell`
and their backward ops); the device decomposes them (compiler/lowering/rnn_cells.py). Each
case runs a CPU copy and a tpu copy of one module, eager and under torch.compile, and
compares outputs, final states and every gradient, in Strict and FUSED mode."""

import copy

import pytest
import torch
import torch.nn as nn

import torch_tpu.device  # noqa: F401 - registers the device where autoload is off
from torch_tpu.compiler.lowering import rnn_cells

aten = torch.ops.aten

MODULES = {
    "lstm": lambda: nn.LSTM(6, 5, batch_first=True),
    "lstm-2-layers-bidirectional": lambda: nn.LSTM(6, 5, num_layers=2, bidirectional=True),
    "lstm-proj-no-bias": lambda: nn.LSTM(6, 5, proj_size=3, bias=False, batch_first=True),
    "gru": lambda: nn.GRU(6, 5, batch_first=True),
    "gru-2-layers-bidirectional": lambda: nn.GRU(6, 5, num_layers=2, bidirectional=True),
    "gru-no-bias": lambda: nn.GRU(6, 5, bias=False, batch_first=True),
}


def _run(call, module, x, h0):
    """`call(x, h0)` (the module or its compiled form) and a backward through its output
    and final states -> (output and states, `module`'s gradients by name, x's gradient)."""
    out, state = call(x, h0)
    states = list(state) if isinstance(state, tuple) else [state]
    loss = out.square().sum() + sum(s.square().sum() for s in states)
    loss.backward()
    return [out, *states], {name: p.grad for name, p in module.named_parameters()}, x.grad


def _inputs(name, module, device):
    gen = torch.Generator().manual_seed(1)
    batch_first = module.batch_first
    x = torch.randn((3, 4, 6) if batch_first else (4, 3, 6), generator=gen)
    layers = module.num_layers * (2 if module.bidirectional else 1)
    h_size = module.proj_size or module.hidden_size
    h0 = torch.randn(layers, 3, h_size, generator=gen)
    state = (h0, torch.randn(layers, 3, module.hidden_size, generator=gen)) if name.startswith("lstm") else h0
    x = x.to(device).requires_grad_()
    state = tuple(s.to(device) for s in state) if isinstance(state, tuple) else state.to(device)
    return x, state


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("name", list(MODULES))
def test_recurrent_module_matches_cpu(name, compiled):
    torch.manual_seed(0)
    cpu = MODULES[name]()
    tpu = copy.deepcopy(cpu).to("tpu")
    run_tpu = torch.compile(tpu, backend="tpu") if compiled else tpu
    outs_cpu, grads_cpu, gx_cpu = _run(cpu, cpu, *_inputs(name, cpu, "cpu"))
    outs, grads, gx = _run(run_tpu, tpu, *_inputs(name, tpu, "tpu"))
    for got, want in zip(outs, outs_cpu):
        assert got.device.type == "tpu"
        torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(gx.cpu(), gx_cpu, rtol=1e-5, atol=1e-5)
    assert grads.keys() == grads_cpu.keys()
    for pname, grad in grads.items():
        torch.testing.assert_close(grad.cpu(), grads_cpu[pname], rtol=1e-5, atol=1e-5, msg=pname)


@pytest.mark.parametrize("cell", [nn.LSTMCell, nn.GRUCell])
def test_cell_modules_train_like_cpu(cell):
    """Three steps of SGD on a cell give CPU's parameters (the fused backward's bias
    gradients included)."""
    torch.manual_seed(0)
    cpu = cell(4, 3)
    tpu = copy.deepcopy(cpu).to("tpu")
    for module, device in ((cpu, "cpu"), (tpu, "tpu")):
        opt = torch.optim.SGD(module.parameters(), lr=0.1)
        gen = torch.Generator().manual_seed(2)
        for _ in range(3):
            x = torch.randn(5, 4, generator=gen).to(device)
            out = module(x)
            h = out[0] if isinstance(out, tuple) else out
            opt.zero_grad()
            h.sum().backward()
            opt.step()
    for (name, want), got in zip(cpu.named_parameters(), tpu.parameters()):
        torch.testing.assert_close(got.detach().cpu(), want.detach(), rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.parametrize("make", [lambda: nn.LSTM(6, 5, batch_first=True), lambda: nn.GRU(6, 5, batch_first=True),
                                  lambda: nn.LSTMCell(6, 5), lambda: nn.GRUCell(6, 5)],
                         ids=["lstm", "gru", "lstm-cell", "gru-cell"])
def test_compiled_recurrent_module_is_one_graph(make):
    """The fused cell is decomposed inside the traced graph: with Dynamo's RNN support on
    (`allow_rnn`; without it Dynamo runs nn.LSTM/GRU/RNN eagerly for every backend) the
    module compiles as one graph, forward and backward, and gives CPU's values."""
    import torch._dynamo

    torch._dynamo.reset()
    torch.manual_seed(0)
    cpu = make()
    tpu = copy.deepcopy(cpu).to("tpu")
    x = torch.randn(2, 3, 6) if isinstance(cpu, nn.RNNBase) else torch.randn(3, 6)
    with torch._dynamo.config.patch(allow_rnn=True):
        out = torch.compile(tpu, backend="tpu", fullgraph=True)(x.to("tpu"))
    want = cpu(x)
    out, want = (out[0], want[0]) if isinstance(out, tuple) else (out, want)
    out.sum().backward()
    want.sum().backward()
    torch.testing.assert_close(out.cpu(), want, rtol=1e-5, atol=1e-5)
    for (name, p_cpu), p_tpu in zip(cpu.named_parameters(), tpu.parameters()):
        torch.testing.assert_close(p_tpu.grad.cpu(), p_cpu.grad, rtol=1e-5, atol=1e-5, msg=name)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_reduced_precision_cells_compute_in_float32(dtype):
    """float16/bfloat16 gates are computed in float32 and rounded once (CUDA's accumulate
    type): the decomposition's results equal the float32 formula rounded to `dtype`."""
    gen = torch.Generator().manual_seed(3)
    gates = [torch.randn(4, 12, generator=gen) for _ in range(2)]
    cx = torch.randn(4, 3, generator=gen)
    hy32, cy32, _ = rnn_cells.lstm_cell(*gates, cx)
    hy, cy, ws = rnn_cells.lstm_cell(*(g.to(dtype) for g in gates), cx.to(dtype))
    assert hy.dtype == cy.dtype == ws.dtype == dtype
    low = [g.to(dtype).float() for g in gates]
    want_hy, want_cy, _ = rnn_cells.lstm_cell(*low, cx.to(dtype).float())
    assert torch.equal(hy, want_hy.to(dtype)) and torch.equal(cy, want_cy.to(dtype))
    torch.testing.assert_close(hy.float(), hy32, rtol=2e-2, atol=2e-2)
    gru_gates = [torch.randn(4, 9, generator=gen) for _ in range(2)]
    hx = torch.randn(4, 3, generator=gen)
    hy, ws = rnn_cells.gru_cell(*(g.to(dtype) for g in gru_gates), hx.to(dtype))
    want, _ = rnn_cells.gru_cell(*(g.to(dtype).float() for g in gru_gates), hx.to(dtype).float())
    assert hy.dtype == ws.dtype == dtype and torch.equal(hy, want.to(dtype))


def test_lstm_backward_without_gradients_returns_none():
    """Neither output used: the backward returns no gradients, as PyTorch's kernel does."""
    cx = torch.randn(2, 3)
    assert rnn_cells.lstm_cell_backward(None, None, cx, cx, torch.randn(2, 12), True) == (None, None, None)


@pytest.mark.parametrize("op", list(rnn_cells.DECOMPOSITIONS))
def test_fused_cell_ops_are_in_the_decomposition_table(op):
    from torch_tpu.compiler.lowering.decompositions import decomposition_table, tracing_decompositions

    assert op in decomposition_table() and op in tracing_decompositions()
