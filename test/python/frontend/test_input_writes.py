"""An inference graph's writes into its inputs are results the compiled graph writes back
(`backend/_input_writes.py`), with no aot_autograd epilogue."""

import pytest
import torch

import torch_tpu.backend as tpu_backend


def _cache_step(cache, pos, x):
    cache.index_copy_(1, pos, x)
    return cache.sum(1) * 2


@pytest.mark.parametrize("device", ["cpu", "tpu"])
def test_a_kv_cache_written_in_place_matches_eager_and_every_later_read_sees_it(device):
    torch._dynamo.reset()
    step = torch.compile(_cache_step, backend="tpu")
    cache, ref = torch.zeros(2, 8, 4, device=device), torch.zeros(2, 8, 4)
    for i in range(5):
        x = torch.randn(2, 1, 4)
        out = step(cache, torch.tensor([i], device=device), x.to(device))
        expected = _cache_step(ref, torch.tensor([i]), x)
        torch.testing.assert_close(out.cpu(), expected)
        torch.testing.assert_close(cache.cpu(), ref)


def test_the_written_input_is_a_result_of_the_graph_and_the_copy_node_is_gone():
    graphs = []
    compile_graph = tpu_backend.compile_graph

    def spying(gm, example_inputs, name):
        graphs.append(gm)
        return compile_graph(gm, example_inputs, name=name)

    tpu_backend.compile_graph = spying
    try:
        torch._dynamo.reset()
        cache = torch.zeros(2, 8, 4)
        torch.compile(_cache_step, backend="tpu")(cache, torch.tensor([3]), torch.ones(2, 1, 4))
    finally:
        tpu_backend.compile_graph = compile_graph
        torch._dynamo.reset()
    (gm,) = graphs
    assert not [n for n in gm.graph.nodes if n.target is torch.ops.aten.copy_.default]
    outputs = next(n for n in gm.graph.nodes if n.op == "output").args[0]
    assert len(outputs) == 2  # the graph's result, then the cache's new value
    assert cache[:, 3].eq(1).all() and cache[:, :3].eq(0).all()


def test_a_read_after_the_write_sees_the_new_value():
    """Nodes that read a written input after its copy_ read the new value."""
    from torch_tpu.backend._input_writes import take_input_writes

    graph = torch.fx.Graph()
    a, b = graph.placeholder("a"), graph.placeholder("b")
    new = graph.call_function(torch.ops.aten.add.Tensor, (b, 1))
    graph.call_function(torch.ops.aten.copy_.default, (a, new))
    after = graph.call_function(torch.ops.aten.mul.Tensor, (a, 2))
    graph.output((after,))
    gm = torch.fx.GraphModule(torch.nn.Module(), graph)
    assert take_input_writes(gm) == [0]
    torch.testing.assert_close(gm(torch.zeros(3), torch.ones(3)), (torch.full((3,), 4.0), torch.full((3,), 2.0)))


def test_a_training_forward_writes_batch_norm_running_statistics_as_eager_does(monkeypatch):
    """In a training graph aot_autograd keeps the writes into inputs that need no gradient
    (BatchNorm's running statistics) in the forward graph: written back the same way, with
    no node left to run in eager (STRICT)."""
    monkeypatch.setenv("TORCH_TPU_STRICT", "1")
    torch.manual_seed(0)
    ours, ref = torch.nn.BatchNorm1d(6), torch.nn.BatchNorm1d(6)
    compiled = torch.compile(ours, backend="tpu")
    torch._dynamo.reset()
    for step in range(3):
        x = torch.randn(8, 6) * (step + 1)
        compiled(x).square().sum().backward()
        ref(x).square().sum().backward()
        torch.testing.assert_close(ours.running_mean, ref.running_mean)
        torch.testing.assert_close(ours.running_var, ref.running_var)
        torch.testing.assert_close(ours.weight.grad, ref.weight.grad, rtol=1e-5, atol=1e-5)
    assert ours.num_batches_tracked.item() == 3
