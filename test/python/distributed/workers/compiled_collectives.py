"""torch.compile(backend="tpu") graphs with `_c10d_functional` collectives on tpu tensors
(run by job.py): the graph compiles whole -- compute stages and thin collective stages of
one program (`torch_tpu._dist_graph`), or one program with the collectives embedded under
`torch_tpu.spmd_safe` -- and its results equal eager's."""

import contextlib
import time

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

import torch_tpu
from torch_tpu import _compile, _dist_graph


@contextlib.contextmanager
def _recording():
    """Records what runs from now on: the group's own (eager) collective programs, the
    compiled-graph programs run as the group's collectives, the distributed graphs
    compiled and the graphs split into compiled and eager parts."""
    group = _dist_graph.world_group()
    seen = {"eager": [], "compiled_runs": [], "programs": [], "partitioned": 0}
    run_collective, run_program = group._collective, group.run_program
    compile_graph, partition = _dist_graph.compile_distributed_graph, _compile._compile_partitioned

    def collective(kind, *args, **kwargs):
        seen["eager"].append(kind)
        return run_collective(kind, *args, **kwargs)

    def program(p, buffers):
        seen["compiled_runs"].append(p.description)
        return run_program(p, buffers)

    def compiling(gm, name):
        compiled = compile_graph(gm, name)
        seen["programs"].append(compiled.executable)
        return compiled

    def partitioned(*args, **kwargs):
        seen["partitioned"] += 1
        return partition(*args, **kwargs)

    group._collective, group.run_program = collective, program
    _dist_graph.compile_distributed_graph, _compile._compile_partitioned = compiling, partitioned
    try:
        yield seen
    finally:
        del group._collective, group.run_program
        _dist_graph.compile_distributed_graph, _compile._compile_partitioned = compile_graph, partition


def _step(group, n):
    def step(x, w):
        y = funcol.all_reduce(x * 2 + 1, "sum", group)  # a compute piece, then the collective
        g = funcol.all_gather_tensor((y @ w).sin(), 0, group)
        s = funcol.reduce_scatter_tensor(g.repeat(n, 1), "sum", 0, group)
        return y, g, s.cos()

    return step


def _check(r, n, results, eager):
    y, g, s = (t.cpu() for t in results)
    x = torch.arange(6.0).reshape(2, 3)
    w = torch.linspace(-1, 1, 9).reshape(3, 3)
    # hand-computed: every rank's x is arange + 10 r
    expect_y = sum(x * 2 + 1 + 20 * k for k in range(n))
    expect_g = torch.cat([(expect_y @ w).sin()] * n)
    torch.testing.assert_close(y, expect_y)
    torch.testing.assert_close(g, expect_g)
    torch.testing.assert_close(s, (n * expect_g).cos())  # rank r's block of n copies of g, summed
    for got, want in zip((y, g, s), eager):
        torch.testing.assert_close(got, want.cpu())


def _inputs_and_eager_results():
    """(rank, world size, group, x, w, eager results of `_step`) of every compiled check."""
    r, n = dist.get_rank(), dist.get_world_size()
    group = dist.group.WORLD
    x = (torch.arange(6.0).reshape(2, 3) + 10 * r).to("tpu")
    w = torch.linspace(-1, 1, 9).reshape(3, 3).to("tpu")
    return r, n, group, x, w, _step(group, n)(x, w)


def check_compiled_collectives():
    r, n, group, x, w, eager = _inputs_and_eager_results()

    # thin: one program of compute and collective stages, no eager collective
    torch._dynamo.reset()
    compiled = torch.compile(_step(group, n), backend="tpu", fullgraph=True)
    with _recording() as seen:
        _check(r, n, compiled(x, w), eager)
        _check(r, n, compiled(x, w), eager)  # the second call reuses the program (no handshake)
    if seen["eager"] or seen["partitioned"] or len(seen["programs"]) != 1:
        raise AssertionError(f"the compiled graph was split or ran eager collectives: {seen}")
    program = seen["programs"][0]
    kinds = program.stage_kinds
    if kinds.count("collective") != 3 or kinds[1::2] != ["collective"] * 3 or not program.thin:
        raise AssertionError(f"expected compute and thin collective stages, got {kinds}")
    if [d.split("(")[0] for d in seen["compiled_runs"]] != ["all_reduce", "all_gather", "reduce_scatter"] * 2:
        raise AssertionError(f"compiled collective stages ran as {seen['compiled_runs']}")
    if "compiled_collectives.py:" not in seen["compiled_runs"][0]:
        raise AssertionError(f"the stage's description lacks the user's line: {seen['compiled_runs'][0]}")
    print(f"rank {r}: compiled collectives OK", flush=True)


def check_compiled_embedded_and_subgroups():
    r, n, group, x, w, eager = _inputs_and_eager_results()

    # spmd_safe: one program, the collectives embedded in it
    torch._dynamo.reset()
    with torch_tpu.spmd_safe(), _recording() as seen:
        compiled = torch.compile(_step(group, n), backend="tpu", fullgraph=True)
        _check(r, n, compiled(x, w), eager)
    if seen["eager"] or seen["partitioned"] or len(seen["programs"]) != 1:
        raise AssertionError(f"the spmd_safe graph was split or ran eager collectives: {seen}")
    program = seen["programs"][0]
    text = program.module_text
    missing = [op for op in ("stablehlo.all_reduce", "stablehlo.all_gather", "stablehlo.reduce_scatter",
                             "stablehlo.dot_general") if op not in text]
    if program.thin or program.stage_kinds != ["collective"] or missing or "torchtpu.outlined" in text:
        raise AssertionError(f"expected one program with the collectives embedded; lacks {missing}: {text}")
    print(f"rank {r}: spmd_safe compiled collectives OK", flush=True)

    # subgroups: each rank's own one-rank group (the partition [[0], [1], ...], declared:
    # PyTorch records no sibling groups of `new_group` on ranks outside them) and the world
    singles = [dist.new_group([k]) for k in range(n)]
    torch_tpu.spmd.declare_partition([[k] for k in range(n)])
    torch._dynamo.reset()

    def mixed(v):
        return funcol.all_reduce(v, "sum", singles[r]) * 10 + funcol.all_reduce(v, "max", group)

    with _recording() as seen:
        out = torch.compile(mixed, backend="tpu", fullgraph=True)(x).cpu()
    torch.testing.assert_close(out, x.cpu() * 10 + (torch.arange(6.0).reshape(2, 3) + 10 * (n - 1)))
    if seen["eager"] or len(seen["programs"]) != 1 or seen["programs"][0].stage_kinds.count("collective") != 2:
        raise AssertionError(f"the subgroup graph was split or ran eager collectives: {seen}")
    print(f"rank {r}: compiled subgroup collectives OK", flush=True)


def check_compiled_divergence():
    """A compiled graph's collective stage goes through the handshake on its first run:
    ranks whose graphs exchange different shapes raise, each naming both ranks' collective
    and source line, and nothing ran (the ranks stay in step)."""
    from torch_tpu.runtime.distributed import DistributedError

    r, n = dist.get_rank(), dist.get_world_size()
    group = dist.group.WORLD
    torch._dynamo.reset()

    def reduce(x):
        return funcol.all_reduce(x * 2, "sum", group)

    line = reduce.__code__.co_firstlineno + 1
    compiled = torch.compile(reduce, backend="tpu", fullgraph=True)
    start = time.monotonic()
    try:
        compiled(torch.ones(2 + r, device="tpu"))
    except DistributedError as err:
        text = str(err)
        needles = ["diverged at collective", f"compiled_collectives.py:{line}",
                   "rank 0: all_reduce(tensor<2xf32>) [compiled from ",
                   "rank 1: all_reduce(tensor<3xf32>) [compiled from "]
        missing = [s for s in needles if s not in text]
        if missing:
            raise AssertionError(f"the divergence error lacks {missing}: {text}") from None
        print(f"rank {r}: compiled divergence raised after {time.monotonic() - start:.1f}s:\n{text}", flush=True)
    else:
        raise AssertionError("ranks compiled different collectives and no error was raised")
    y = torch.full((2,), float(r), device="tpu")
    dist.all_reduce(y)  # in step again
    assert y.cpu().tolist() == [float(sum(range(n)))] * 2, y
    print(f"rank {r}: compiled divergence OK", flush=True)
