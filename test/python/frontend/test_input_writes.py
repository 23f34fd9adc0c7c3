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

    def spying(gm, example_inputs, name, **kwargs):
        graphs.append(gm)
        return compile_graph(gm, example_inputs, name=name, **kwargs)

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


def _tpu():
    import torch_tpu.device  # noqa: F401 - registers the device where autoload is off


def _count_new_storages(monkeypatch) -> list:
    """Every tpu storage made from now on (an op's or a compiled graph's result)."""
    from torch_tpu.device._buffers import TABLE

    made = []
    new_storage = TABLE.new_storage

    def counting(entry, into=None):
        made.append(entry)
        return new_storage(entry, into=into)

    monkeypatch.setattr(TABLE, "new_storage", counting)
    return made


def _warm_cache_step():
    """A compiled `_cache_step` on a tpu cache and its eager reference, after the two
    calls that plan it (from the next one, the fast path)."""
    _tpu()
    torch._dynamo.reset()
    step = torch.compile(_cache_step, backend="tpu")
    cache, ref = torch.zeros(2, 8, 4, device="tpu"), torch.zeros(2, 8, 4)
    with torch.no_grad():
        for i in range(2):
            x = torch.randn(2, 1, 4)
            step(cache, torch.tensor([i], device="tpu"), x.to("tpu"))
            _cache_step(ref, torch.tensor([i]), x)
    return step, cache, ref


def test_on_tpu_tensors_the_call_writes_the_cache_itself_with_no_result_tensor_for_it(monkeypatch):
    """From the second call (the fast path), the cache's storage takes the program's
    result buffer in the call: one program, one new storage (the graph's own output), the
    cache's version counter moved by one as by eager's in-place write, and the output is a
    tensor of its own."""
    step, cache, ref = _warm_cache_step()
    with torch.no_grad():
        x = torch.randn(2, 1, 4)
        pos, x_tpu = torch.tensor([2], device="tpu"), x.to("tpu")
        version, eager_version = cache._version, ref._version
        made = _count_new_storages(monkeypatch)
        before = torch.tpu.transfer_stats()
        out = step(cache, pos, x_tpu)
        moved = torch.tpu.transfer_stats() - before
        monkeypatch.undo()
        expected = _cache_step(ref, torch.tensor([2]), x)
    assert moved.programs_executed == 1, moved
    assert len(made) == 1, made  # `out` only: the cache's new value is its own storage's buffer
    assert cache._version - version == ref._version - eager_version == 1
    assert out.untyped_storage().data_ptr() != cache.untyped_storage().data_ptr()
    torch.testing.assert_close(out.cpu(), expected)
    torch.testing.assert_close(cache.cpu(), ref)


def test_a_cache_that_does_not_pass_as_it_is_takes_the_per_argument_path_and_is_written():
    """Caches of the traced shape and strides Dynamo does not recompile for, but whose
    storage is not the tensor's buffer as it is (an offset, a larger storage): read and
    written through the views' programs, as before the fast path; nothing else changes."""
    _tpu()
    torch._dynamo.reset()
    step = torch.compile(_cache_step, backend="tpu")
    big, ref_big = torch.zeros(2, 2, 8, 4, device="tpu"), torch.zeros(2, 2, 8, 4)
    dense, ref_dense = torch.zeros(2, 8, 4, device="tpu"), torch.zeros(2, 8, 4)
    with torch.no_grad():
        for i, (cache, ref) in enumerate([(dense, ref_dense), (dense, ref_dense), (big[1], ref_big[1]),
                                          (big[0], ref_big[0]), (dense, ref_dense)]):
            x = torch.randn(2, 1, 4)
            out = step(cache, torch.tensor([i], device="tpu"), x.to("tpu"))
            torch.testing.assert_close(out.cpu(), _cache_step(ref, torch.tensor([i]), x))
    torch.testing.assert_close(big.cpu(), ref_big)
    torch.testing.assert_close(dense.cpu(), ref_dense)


def test_a_deleted_argument_buffer_is_reported_as_before_on_the_fast_path():
    from torch_tpu.device._buffers import entry_of
    from torch_tpu.runtime.errors import BufferDeletedError

    _tpu()
    torch._dynamo.reset()
    add = torch.compile(lambda a, b: a * 2 + b, backend="tpu")
    a, b = torch.ones(4, device="tpu"), torch.full((4,), 3.0, device="tpu")
    for _ in range(2):
        torch.testing.assert_close(add(a, b).cpu(), torch.full((4,), 5.0))
    entry_of(b).buffer.delete()
    with pytest.raises(BufferDeletedError, match="deleted"):
        add(a, b)


def test_an_output_that_is_also_a_written_value_stays_a_tensor_of_its_own():
    """`new` is both the graph's output and the cache's new value: the cache takes the
    value, the caller gets a separate tensor (an in-place op on it leaves the cache)."""
    _tpu()

    def fill(cache, x):
        new = cache * 0 + x
        cache.copy_(new)
        return new

    torch._dynamo.reset()
    step = torch.compile(fill, backend="tpu")
    cache = torch.zeros(3, 4, device="tpu")
    with torch.no_grad():
        for i in range(3):
            out = step(cache, torch.full((3, 4), float(i), device="tpu"))
            assert out is not cache
            out.add_(10)
            torch.testing.assert_close(cache.cpu(), torch.full((3, 4), float(i)))
            torch.testing.assert_close(out.cpu(), torch.full((3, 4), i + 10.0))


def test_in_fused_mode_the_writes_are_copies_recorded_in_the_trace():
    from torch_tpu.device import EagerMode, set_eager_mode

    _tpu()
    torch._dynamo.reset()
    step = torch.compile(_cache_step, backend="tpu")
    cache, ref = torch.zeros(2, 8, 4, device="tpu"), torch.zeros(2, 8, 4)
    with torch.no_grad(), set_eager_mode(EagerMode.FUSED):
        for i in range(4):
            x = torch.randn(2, 1, 4)
            out = step(cache, torch.tensor([i], device="tpu"), x.to("tpu"))
            expected = _cache_step(ref, torch.tensor([i]), x)
        torch.testing.assert_close(out.cpu(), expected)
        torch.testing.assert_close(cache.cpu(), ref)


def test_the_program_writes_the_cache_in_its_own_buffer_unless_another_storage_shares_it(copies):
    """The program donates the written cache (`donated_writes`): from the second call the
    cache's buffer goes in as it is, with no device copy, and a view taken before the call
    reads the new value, as in eager. A buffer another storage shares (`other.copy_(cache)`
    gives `other` the same buffer) is copied first: `other` keeps its value."""
    step, cache, ref = _warm_cache_step()
    with torch.no_grad():
        row = cache[:, 2]
        copies.clear()
        x = torch.randn(2, 1, 4)
        step(cache, torch.tensor([2], device="tpu"), x.to("tpu"))
        _cache_step(ref, torch.tensor([2]), x)
        assert copies == []
        torch.testing.assert_close(row.cpu(), ref[:, 2])

        other = torch.empty(2, 8, 4, device="tpu")
        other.copy_(cache)
        snapshot = ref.clone()
        x = torch.randn(2, 1, 4)
        step(cache, torch.tensor([3], device="tpu"), x.to("tpu"))
        _cache_step(ref, torch.tensor([3]), x)
    assert copies == [(2, 8, 4)]
    torch.testing.assert_close(other.cpu(), snapshot)
    torch.testing.assert_close(cache.cpu(), ref)


def test_only_inputs_written_with_their_own_shape_and_dtype_on_tpu_tensors_are_donated():
    from torch_tpu.backend._compile import donated_writes
    from torch_tpu.backend._input_writes import take_input_writes

    def traced(fn, *args):
        gm = torch.fx.experimental.proxy_tensor.make_fx(fn)(*args)
        written = take_input_writes(gm)
        for node, arg in zip([n for n in gm.graph.nodes if n.op == "placeholder"], args):
            node.meta["val"] = arg
        return gm, written

    def write(cache, x):
        cache.copy_(x)
        return (x.sum(),)

    cpu = torch.zeros(4)
    gm, written = traced(write, cpu, torch.ones(4))
    assert written == [0]
    assert donated_writes(gm, written) == ()  # host tensors: the caller's memory is never consumed
    _tpu()
    on_tpu = torch.zeros(4, device="tpu")
    for node in gm.graph.nodes:
        if node.op == "placeholder" and node.name.startswith("cache"):
            node.meta["val"] = on_tpu
        elif node.op != "output" and isinstance(node.meta.get("val"), torch.Tensor):
            node.meta["val"] = node.meta["val"].to("tpu")
    assert donated_writes(gm, written) == (0,)
    new_value = next(n for n in reversed(gm.graph.nodes) if n.op == "output").args[0][-1]
    new_value.meta["val"] = torch.zeros(2, 2, device="tpu")  # another shape: not in place
    assert donated_writes(gm, written) == ()


def test_a_failed_call_that_had_taken_a_written_input_says_its_value_is_lost():
    """A launch that fails after consuming a donated input's buffer (the program had
    started) re-raises its error with a note naming the lost input, rather than taking
    the per-argument path, which would report a deleted buffer it did not delete."""
    from torch_tpu.device import _graph_io
    from torch_tpu.device._buffers import entry_of

    _tpu()
    cache = torch.zeros(4, device="tpu")
    x = torch.ones(4, device="tpu")
    taken = []

    def failing(buffers):
        taken.append(buffers[0])
        buffers[0].delete()  # as a program that consumed it, then failed
        raise RuntimeError("RESOURCE_EXHAUSTED: out of memory while running the program")

    entry = entry_of(cache)
    call = _graph_io.graph_caller([((4,), torch.float32, entry.buffer._row)] * 2, [((4,), torch.float32)],
                                  entry.buffer.device, 0, failing, writes={0: 0}, donated=(0,))
    with pytest.raises(RuntimeError, match="RESOURCE_EXHAUSTED") as info:
        call([cache, x])
    assert any("argument positions [0]" in note and "lost" in note for note in info.value.__notes__)
    assert taken[0].is_deleted
