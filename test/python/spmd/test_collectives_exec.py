"""Every collective kind and reduce op, imported from `_c10d_functional` graphs, lowered
with the complete replica-group partition and run on 4 and 8 virtual devices; results
are compared with values computed here from the other ranks' inputs."""

from __future__ import annotations

import functools
import operator

import pytest
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as fc
from spmd_helpers import fake_world, trace
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch_tpu.spmd import (
    SpmdCompileError,
    clear_declared_partitions,
    compile_spmd,
    declare_partition,
    process_groups_of,
)

c10d = torch.ops._c10d_functional


def _rank_input(r: int, dtype: torch.dtype, shape=(4, 3)) -> torch.Tensor:
    base = torch.arange(shape[0] * shape[1]).reshape(shape)
    if dtype is torch.bool:
        return ((base + r) % 3 == 0)
    if dtype.is_floating_point:
        return (base * 0.5 + r * 1.25 - 2).to(dtype)
    return ((base + 3 * r) % 7 + 1).to(dtype)


def _groups_of(partition, n):
    return {r: g for g in partition for r in g}


def _reduce(op: str, values: list[torch.Tensor]) -> torch.Tensor:
    if op == "sum":
        return functools.reduce(torch.logical_or if values[0].dtype is torch.bool else operator.add, values)
    if op == "avg":
        return functools.reduce(operator.add, values) / len(values) if values[0].is_floating_point() else \
            torch.div(functools.reduce(operator.add, values), len(values), rounding_mode="trunc")
    if op == "product":
        return functools.reduce(operator.mul, values)
    if op == "min":
        return functools.reduce(torch.minimum, values)
    if op == "max":
        return functools.reduce(torch.maximum, values)
    return functools.reduce({"band": operator.and_, "bor": operator.or_, "bxor": operator.xor}[op], values)


def _all_reduce_fn(op: str, name: str):
    return lambda x: c10d.wait_tensor(c10d.all_reduce(x, op, name))


def _run(module, inputs, client, thin=True):
    program = compile_spmd(module, len(inputs), client=client, thin=thin)
    return program([[x] for x in inputs])


REDUCE_CASES = [
    ("sum", torch.float32), ("avg", torch.float32), ("product", torch.float32), ("min", torch.float32),
    ("max", torch.float32), ("sum", torch.int32), ("avg", torch.int32), ("product", torch.int64),
    ("min", torch.int32), ("max", torch.int8), ("band", torch.int32), ("bor", torch.int64),
    ("bxor", torch.int32), ("band", torch.bool), ("bor", torch.bool), ("bxor", torch.bool),
    ("sum", torch.bool), ("max", torch.bfloat16), ("sum", torch.float64), ("min", torch.uint8),
    ("sum", torch.complex64), ("avg", torch.float16), ("product", torch.int16),
]


@pytest.mark.parametrize("n", [4, 8])
def test_all_reduce_every_op_and_dtype_on_mesh_dims(cpu8, n):
    with fake_world(n):
        mesh = init_device_mesh("cpu", (2, n // 2), mesh_dim_names=("dp", "tp"))
        rows = mesh.mesh.tolist()
        partitions = {"tp": rows, "dp": [list(c) for c in zip(*rows)]}
        for dim in ("tp", "dp"):
            group = mesh.get_group(dim)
            for op, dtype in REDUCE_CASES:
                module = trace(_all_reduce_fn(op, group.group_name), _rank_input(0, dtype))
                inputs = [_rank_input(r, dtype) for r in range(n)]
                outs = _run(module, inputs, cpu8, thin=(dim == "tp"))
                owner = _groups_of(partitions[dim], n)
                for r in range(n):
                    expected = _reduce(op, [inputs[g] for g in owner[r]]).to(dtype)
                    torch.testing.assert_close(outs[r][0], expected, rtol=1e-2 if dtype in (torch.bfloat16, torch.float16) else 1e-6,
                                               atol=0, msg=f"{op} {dtype} on {dim}, rank {r}")


@pytest.mark.parametrize("n", [4, 8])
def test_gather_scatter_all_to_all_broadcast(cpu8, n):
    with fake_world(n):
        mesh = init_device_mesh("cpu", (2, n // 2), mesh_dim_names=("dp", "tp"))
        tp = mesh.get_group("tp")
        dp = mesh.get_group("dp")
        k = n // 2

        def fn(x):
            gathered = c10d.wait_tensor(c10d.all_gather_into_tensor(x, k, tp.group_name))
            scattered = c10d.wait_tensor(c10d.reduce_scatter_tensor(x, "sum", k, tp.group_name))
            averaged = c10d.wait_tensor(c10d.reduce_scatter_tensor(x, "avg", 2, dp.group_name))
            exchanged = c10d.wait_tensor(c10d.all_to_all_single(x, [2] * k, [2] * k, tp.group_name))
            sent = c10d.wait_tensor(c10d.broadcast(x, 1, tp.group_name))
            return gathered, scattered, averaged, exchanged, sent

        rows_per_rank = k * 2
        inputs = [_rank_input(r, torch.float32, (rows_per_rank, 3)) for r in range(n)]
        module = trace(fn, inputs[0])
        for thin in (True, False):
            outs = _run(module, inputs, cpu8, thin=thin)
            for r in range(n):
                row, col = divmod(r, k)
                tp_group = [row * k + j for j in range(k)]
                dp_group = [col, k + col]
                gathered, scattered, averaged, exchanged, sent = outs[r]
                torch.testing.assert_close(gathered, torch.cat([inputs[g] for g in tp_group]))
                chunk = rows_per_rank // k
                total = sum(inputs[g] for g in tp_group)
                torch.testing.assert_close(scattered, total[col * chunk:(col + 1) * chunk])
                mean = (inputs[dp_group[0]] + inputs[dp_group[1]]) / 2
                half = rows_per_rank // 2
                torch.testing.assert_close(averaged, mean[row * half:(row + 1) * half])
                # all_to_all: chunk j of rank i goes to rank j, placed at position i.
                expected = torch.cat([inputs[g][col * chunk:(col + 1) * chunk] for g in tp_group])
                torch.testing.assert_close(exchanged, expected)
                torch.testing.assert_close(sent, inputs[tp_group[1]])


def test_permuted_mesh_keeps_group_order(cpu8):
    """A mesh whose device order is not iota: dimension 1's groups are {4,0,1,3} and
    {5,2,6,7}. PyTorch orders a group's ranks ascending, and all_gather follows the
    group order, on every subgroup."""
    with fake_world(8):
        mesh = DeviceMesh("cpu", torch.tensor([[4, 0, 1, 3], [5, 2, 6, 7]]))
        group = mesh.get_group(1)
        ranks = dist.get_process_group_ranks(group)
        assert sorted(ranks) == [0, 1, 3, 4]
        module = trace(lambda x: c10d.wait_tensor(c10d.all_gather_into_tensor(x, 4, group.group_name)), torch.zeros(1, 2))
        other = [2, 5, 6, 7] if ranks == sorted(ranks) else [5, 2, 6, 7]
        assert f"[{ranks}, {other}]".replace("(", "[") in str(module)
        inputs = [torch.full((1, 2), float(r)) for r in range(8)]
        outs = _run(module, inputs, cpu8)
        for r in range(8):
            order = ranks if r in ranks else other
            torch.testing.assert_close(outs[r][0], torch.tensor([[float(g)] * 2 for g in order]))


def test_uneven_subgroups(cpu8):
    """Groups of different sizes from new_group: all_reduce sum and avg (the divisor is
    each rank's own group size)."""
    with fake_world(4):
        big = dist.new_group([0, 2, 3])
        dist.new_group([1])
        # Rank 0 is not in [1], so PyTorch does not record that group here: declare it.
        declare_partition([[0, 2, 3], [1]])
        try:
            _check_uneven(cpu8, big)
        finally:
            clear_declared_partitions()


def _check_uneven(cpu8, big):
    if True:

        def fn(x):
            total = c10d.wait_tensor(c10d.all_reduce(x, "sum", big.group_name))
            mean = c10d.wait_tensor(c10d.all_reduce(x, "avg", big.group_name))
            return total, mean

        inputs = [torch.full((3,), float(2 ** r)) for r in range(4)]
        module = trace(fn, inputs[0])
        outs = _run(module, inputs, cpu8)
        for r in range(4):
            group = [1] if r == 1 else [0, 2, 3]
            total = sum(2.0 ** g for g in group)
            torch.testing.assert_close(outs[r][0], torch.full((3,), total))
            torch.testing.assert_close(outs[r][1], torch.full((3,), total / len(group)))
        # An all-gather over groups of different sizes has no single shape: an error.
        gather = trace(lambda x: c10d.wait_tensor(c10d.all_gather_into_tensor(x, 3, big.group_name)), inputs[0])
        with pytest.raises(SpmdCompileError, match="all_gather over groups of different sizes"):
            compile_spmd(gather, 4, client=cpu8)


def test_functional_collectives_api_and_errors(cpu8):
    """What torch.distributed._functional_collectives produces imports as-is; bad
    requests are errors that name the op."""
    with fake_world(4):
        mesh = init_device_mesh("cpu", (4,))

        def fn(x):
            return fc.all_reduce(x, "max", mesh) + 1

        inputs = [torch.tensor([float(r), -float(r)]) for r in range(4)]
        outs = _run(trace(fn, inputs[0]), inputs, cpu8)
        for r in range(4):
            torch.testing.assert_close(outs[r][0], torch.tensor([4.0, 1.0]))
        group = mesh.get_group()
        float_and = trace(lambda x: c10d.wait_tensor(c10d.all_reduce(x, "band", group.group_name)), inputs[0])
        with pytest.raises(SpmdCompileError, match="'band' is not defined for float elements"):
            compile_spmd(float_and, 4, client=cpu8)
        lonely = dist.new_group([0, 1])
        from torch_tpu.compiler.lowering import LoweringError

        with pytest.raises(LoweringError, match="declare the partition with torch_tpu.spmd.declare_partition"):
            trace(lambda x: c10d.wait_tensor(c10d.all_reduce(x, "sum", lonely.group_name)), inputs[0])
        declare_partition([[0, 1], [2, 3]])
        try:
            assert "[[0, 1], [2, 3]]" in str(trace(lambda x: c10d.wait_tensor(c10d.all_reduce(x, "sum", lonely.group_name)), inputs[0]))
        finally:
            clear_declared_partitions()


def test_dynamo_backend_leaves_collectives_to_torch_distributed():
    """In a one-device torch.compile graph, a collective runs through torch.distributed
    (here the fake backend, which returns its input) and the rest through torch_tpu."""
    import torch._dynamo

    with fake_world(4):
        mesh = init_device_mesh("cpu", (4,))

        def fn(x):
            return fc.all_reduce(x * 2, "sum", mesh).wait() + 1

        torch._dynamo.reset()
        x = torch.arange(4.0)
        torch.testing.assert_close(torch.compile(fn, backend="tpu")(x), fn(x))
        torch._dynamo.reset()


def _aot_forward_graph(fn, *examples):
    """The ATen forward graph torch.compile + aot_autograd make of `fn` (as the `tpu`
    backend receives it), without the unused process-group placeholders."""
    import torch._dynamo
    from torch._functorch.aot_autograd import aot_module_simplified

    graphs = []

    def backend(gm, example_inputs):
        def forward(g, _):
            graphs.append(g)
            return g.forward

        return aot_module_simplified(gm, example_inputs, fw_compiler=forward)

    torch._dynamo.reset()
    torch.compile(fn, backend=backend, fullgraph=True)(*examples)
    torch._dynamo.reset()
    gm = graphs[0]
    for node in list(gm.graph.nodes):
        if node.op == "placeholder" and not node.users and not isinstance(node.meta.get("val"), torch.Tensor):
            gm.graph.erase_node(node)
    gm.recompile()
    return gm


def test_dtensor_under_torch_compile(cpu8):
    """DTensor redistributions compiled by torch.compile become _c10d_functional ops that
    import, lower and run: Shard(0) -> Replicate is an all-gather; a column- then
    row-parallel matmul's Partial -> Replicate is an all-reduce."""
    from torch.distributed.tensor import DTensor, Replicate, Shard
    from torch_tpu.compiler.importer.fx_importer import import_graph

    with fake_world(4):
        mesh = init_device_mesh("cpu", (4,))

        def gather(x_local):
            x = DTensor.from_local(x_local, mesh, [Shard(0)], run_check=False)
            return (x * 2).redistribute(mesh, [Replicate()]).to_local() + 1

        def tensor_parallel(x, w1_local, w2_local):
            xd = DTensor.from_local(x, mesh, [Replicate()], run_check=False)
            w1 = DTensor.from_local(w1_local, mesh, [Shard(1)], run_check=False)
            w2 = DTensor.from_local(w2_local, mesh, [Shard(0)], run_check=False)
            return torch.relu(xd @ w1) @ w2

        g = torch.Generator().manual_seed(0)
        xs = [torch.randn(2, 3, generator=g) for _ in range(4)]
        gm = _aot_forward_graph(gather, xs[0])
        program = compile_spmd(import_graph(gm, process_groups=process_groups_of(gm)).module, 4, client=cpu8)
        for out in program([[x] for x in xs]):
            torch.testing.assert_close(out[0], torch.cat(xs) * 2 + 1)

        x, w1, w2 = torch.randn(5, 8, generator=g), torch.randn(8, 16, generator=g), torch.randn(16, 8, generator=g)
        w1s, w2s = w1.chunk(4, dim=1), w2.chunk(4, dim=0)

        def replicated(x, w1_local, w2_local):
            return tensor_parallel(x, w1_local, w2_local).redistribute(mesh, [Replicate()]).to_local()

        gm = _aot_forward_graph(replicated, x, w1s[0].contiguous(), w2s[0].contiguous())
        assert any("all_reduce" in str(n.target) for n in gm.graph.nodes)
        program = compile_spmd(import_graph(gm, process_groups=process_groups_of(gm)).module, 4, client=cpu8)
        outs = program([[x, w1s[r].contiguous(), w2s[r].contiguous()] for r in range(4)])
        for out in outs:
            torch.testing.assert_close(out[0], torch.relu(x @ w1) @ w2, rtol=1e-5, atol=1e-5)


def test_reduce_scatter_every_op_and_permute(cpu8):
    """reduce_scatter with each reduce op (one program, several outputs), and the
    permute kind (a ring shift) written as a torchtpu.collective."""
    with fake_world(4):
        mesh = init_device_mesh("cpu", (4,))
        name = mesh.get_group().group_name
        ops = ["sum", "avg", "product", "min", "max"]

        def fn(x, i):
            outs = [c10d.wait_tensor(c10d.reduce_scatter_tensor(x, op, 4, name)) for op in ops]
            outs += [c10d.wait_tensor(c10d.reduce_scatter_tensor(i, op, 4, name)) for op in ("band", "bor", "bxor")]
            return outs

        xs = [_rank_input(r, torch.float32, (8, 3)) for r in range(4)]
        ints = [_rank_input(r, torch.int32, (8, 3)) for r in range(4)]
        module = trace(fn, xs[0], ints[0])
        outs = compile_spmd(module, 4, client=cpu8)([[xs[r], ints[r]] for r in range(4)])
        for r in range(4):
            for k, op in enumerate(ops):
                torch.testing.assert_close(outs[r][k], _reduce(op, xs)[2 * r:2 * r + 2], rtol=1e-6, atol=0)
            for k, op in enumerate(("band", "bor", "bxor")):
                torch.testing.assert_close(outs[r][5 + k], _reduce(op, ints)[2 * r:2 * r + 2])
    ring = """func.func @main(%x: tensor<3xf32>) -> tensor<3xf32> {
      %0 = "torchtpu.collective"(%x) {kind = "permute", source_target_pairs = dense<[[0, 1], [1, 2], [2, 3], [3, 0]]> : tensor<4x2xi64>} : (tensor<3xf32>) -> tensor<3xf32>
      return %0 : tensor<3xf32>
    }"""
    outs = compile_spmd(ring, 4, client=cpu8)([[torch.full((3,), float(r))] for r in range(4)])
    for r in range(4):
        torch.testing.assert_close(outs[r][0], torch.full((3,), float((r - 1) % 4)))
