"""Training through backend="tpu": 20 steps of SGD/AdamW follow eager's loss curve."""

import copy

import pytest
import torch
import torch.nn.functional as F
from models import SmallCNN, mlp, tiny_gpt


def _train(model, make_batch, loss_fn, optimizer_cls, steps, compile_model):
    torch.manual_seed(0)
    model = copy.deepcopy(model)
    step_model = torch.compile(model, backend="tpu") if compile_model else model
    optimizer = optimizer_cls(model.parameters())
    losses = []
    for step in range(steps):
        x, y = make_batch(step)
        optimizer.zero_grad()
        loss = loss_fn(step_model(x), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def _batches(shape, classes, dtype=torch.float32):
    generator = torch.Generator().manual_seed(1)
    data = [(torch.randn(shape, generator=generator) if dtype.is_floating_point
             else torch.randint(0, classes, shape, generator=generator),
             torch.randint(0, classes, (shape[0],) if dtype.is_floating_point else shape, generator=generator))
            for _ in range(4)]
    return lambda step: data[step % len(data)]


CASES = {
    "mlp-sgd": (lambda: mlp(), _batches((8, 16), 10), F.cross_entropy,
                lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9)),
    "cnn-adamw": (lambda: SmallCNN(), _batches((4, 3, 8, 8), 10), F.cross_entropy,
                  lambda p: torch.optim.AdamW(p, lr=1e-2)),
    "gpt-adamw": (lambda: tiny_gpt(), _batches((2, 16), 64, torch.int64),
                  lambda logits, y: F.cross_entropy(logits.flatten(0, 1), y.flatten()),
                  lambda p: torch.optim.AdamW(p, lr=3e-3)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_loss_curve_matches_eager(case):
    build, batches, loss_fn, optimizer = CASES[case]
    torch.manual_seed(0)
    model = build()
    eager = _train(model, batches, loss_fn, optimizer, 20, compile_model=False)
    ours = _train(model, batches, loss_fn, optimizer, 20, compile_model=True)
    assert eager[-1] < eager[0], "the reference run should learn"
    torch.testing.assert_close(torch.tensor(ours), torch.tensor(eager), rtol=2e-3, atol=2e-4)


def _forward_graph_outputs(partitioner):
    """The FX nodes a compiled Linear -> RMS-style norm -> Linear training graph's forward
    returns (its result first, then what it saves for the backward), per partitioner."""
    import torch_tpu.backend as tpu_backend

    seen = []
    make = tpu_backend._make_compiler

    def spying(role, *args, **kwargs):
        compiler = make(role, *args, **kwargs)

        def compile_graph(gm, example_inputs):
            if role == "forward":
                seen.extend(next(n for n in gm.graph.nodes if n.op == "output").args[0])
            return compiler(gm, example_inputs)

        return compile_graph

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.up, self.down = torch.nn.Linear(16, 32), torch.nn.Linear(32, 16)

        def forward(self, x):
            h = self.up(x).float()
            h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
            return self.down(F.silu(h))

    torch.manual_seed(0)
    model, x = Block(), torch.randn(8, 16)
    expected_grads = torch.autograd.grad(model(x).square().sum(), list(model.parameters()))
    torch._dynamo.reset()
    tpu_backend._make_compiler = spying
    try:
        compiled = torch.compile(model, backend="tpu", options={"partitioner": partitioner})
        grads = torch.autograd.grad(compiled(x).square().sum(), list(model.parameters()))
    finally:
        tpu_backend._make_compiler = make
        torch._dynamo.reset()
    for got, want in zip(grads, expected_grads):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    return seen


def test_min_cut_partitioner_saves_weights_not_their_transposes_and_recomputes_elementwise_work():
    """Saved activations cost a write in the forward and a read in the backward: on the
    chip, the "default" partitioner's forward wrote a transposed copy of every weight and
    every f32 norm intermediate (docs/explanation/performance.md). "min_cut" (the default)
    saves the weights themselves (inputs: no bytes) and recomputes elementwise work."""
    def saved_ops(outputs):
        return sorted(str(getattr(n, "target", "")) for n in outputs[1:] if getattr(n, "op", "") == "call_function")

    default = saved_ops(_forward_graph_outputs("default"))
    min_cut = saved_ops(_forward_graph_outputs("min_cut"))
    assert "aten.t.default" in default  # the transposed weights the backward reads
    assert "aten.t.default" not in min_cut
    assert len(min_cut) < len(default)


def test_an_unknown_partitioner_is_an_error_that_names_the_choices():
    from torch._dynamo.exc import BackendCompilerFailed

    with pytest.raises(BackendCompilerFailed, match="partitioner='fast' is not known; use 'min_cut'"):
        torch.compile(torch.nn.Linear(2, 2), backend="tpu", options={"partitioner": "fast"})(torch.ones(2))


def test_weights_saved_for_the_backward_are_not_results_of_the_forward_program(monkeypatch):
    """A program result that is one of its parameters is a copy in XLA: the weights the
    min-cut partitioner saves leave the forward program and are handed to the backward as
    they are (`backend/_saved_inputs.py`); the gradients still match eager's."""
    import torch_tpu.backend as tpu_backend

    compiled_outputs = []
    compile_graph = tpu_backend.compile_graph

    def spying(gm, example_inputs, name, **kwargs):
        if name.endswith("forward"):
            output = next(n for n in gm.graph.nodes if n.op == "output")
            compiled_outputs.extend(output.args[0])
        return compile_graph(gm, example_inputs, name=name, **kwargs)

    monkeypatch.setattr(tpu_backend, "compile_graph", spying)
    saved = _forward_graph_outputs("min_cut")[1:]
    assert any(getattr(n, "op", "") == "placeholder" for n in saved)  # min-cut saves the weights
    assert compiled_outputs and not any(getattr(n, "op", "") == "placeholder" for n in compiled_outputs)
