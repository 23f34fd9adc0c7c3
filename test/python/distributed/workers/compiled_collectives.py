"""torch.compile(backend="tpu") graphs with `_c10d_functional` collectives on tpu tensors
(run by job.py): the graph compiles whole -- compute stages and thin collective stages of
one program (`torch_tpu.backend._dist_graph`), or one program with the collectives embedded under
`torch_tpu.spmd_safe` -- and its results equal eager's."""

import contextlib
import time

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

import torch_tpu
from torch_tpu.backend import _compile, _dist_graph
from torch_tpu.distributed import _process_group


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

    def program(p, buffers, sizes=""):
        # what the handshake compares: a bounded program's description at this call's sizes
        seen["compiled_runs"].append(_process_group._with_sizes(p, sizes).description if sizes else p.description)
        return run_program(p, buffers, sizes)

    def compiling(gm, name, *bounds):
        compiled = compile_graph(gm, name, *bounds)
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


def check_compiled_mesh():
    """A 2 x 2 DeviceMesh (4 processes): one compiled graph with collectives on each mesh
    dimension (the rows' and the columns' subgroups, whose sibling groups PyTorch records
    only in the mesh) and on the world. Every rank's value is hand-computed from the mesh
    coordinates; the graph compiles whole (no eager collective)."""
    from torch.distributed.device_mesh import init_device_mesh

    r, n = dist.get_rank(), dist.get_world_size()
    assert n == 4, "the mesh check needs 4 processes"
    mesh = init_device_mesh("tpu", (2, 2), mesh_dim_names=("dp", "tp"))
    dp, tp = mesh.get_group("dp"), mesh.get_group("tp")  # rank r: dp [r % 2, r % 2 + 2], tp [r // 2 * 2, ...+1]
    torch._dynamo.reset()

    def step(x):
        across_dp = funcol.all_reduce(x * 2, "sum", dp)  # sum over the column
        gathered_tp = funcol.all_gather_tensor(across_dp + 1, 0, tp)  # rows stacked by tp rank
        scattered_dp = funcol.reduce_scatter_tensor(gathered_tp.sin(), "max", 0, dp)
        whole = funcol.all_reduce(scattered_dp, "sum", dist.group.WORLD)
        return across_dp, gathered_tp, scattered_dp, whole

    x = (torch.arange(4.0).reshape(2, 2) + 100 * r).to("tpu")
    eager = step(x)
    with _recording() as seen:
        compiled = torch.compile(step, backend="tpu", fullgraph=True)
        results = [t.cpu() for t in compiled(x)]
    if seen["eager"] or seen["partitioned"] or len(seen["programs"]) != 1:
        raise AssertionError(f"the mesh graph was split or ran eager collectives: {seen}")
    if seen["programs"][0].stage_kinds.count("collective") != 4:
        raise AssertionError(f"expected 4 collective stages, got {seen['programs'][0].stage_kinds}")

    base = torch.arange(4.0).reshape(2, 2)

    def value(rank):
        return base + 100 * rank

    column = [k for k in range(n) if k % 2 == r % 2]  # dp group of this rank
    row = [k for k in range(n) if k // 2 == r // 2]  # tp group of this rank

    def across(rank):
        return sum(value(k) * 2 for k in range(n) if k % 2 == rank % 2)

    def gathered(rank):
        return torch.cat([across(k) + 1 for k in range(n) if k // 2 == rank // 2])

    position = column.index(r)
    scattered = torch.stack([gathered(k).sin() for k in column]).amax(0).chunk(2)[position]
    whole = sum(
        torch.stack([gathered(k).sin() for k in range(n) if k % 2 == j % 2]).amax(0).chunk(2)[
            [k for k in range(n) if k % 2 == j % 2].index(j)]
        for j in range(n)
    )
    for got, want, from_eager in zip(results, (across(r), gathered(r), scattered, whole), eager):
        torch.testing.assert_close(got, want)
        torch.testing.assert_close(got, from_eager.cpu())
    assert row == dist.get_process_group_ranks(tp) and column == dist.get_process_group_ranks(dp)
    print(f"rank {r}: compiled mesh collectives OK", flush=True)


def check_compiled_dynamic():
    """A compiled graph whose input has a dynamic dim (torch_tpu.mark_dynamic): its
    collectives compile into its program at the bound like a static graph's (one compile
    for every size up to the bound), padding kept out of the results; an all-gather along
    the dynamic dim 0 runs in eager (with the reason); ranks passing different sizes to a
    collective raise on every rank, naming the sizes."""
    import logging

    from torch_tpu.runtime.distributed import DistributedError

    r, n = dist.get_rank(), dist.get_world_size()
    group = dist.group.WORLD
    torch._dynamo.reset()

    def step(x):
        y = funcol.all_reduce(x * 2 + 1, "sum", group)  # padded along dim 1: elementwise over ranks
        g = funcol.all_gather_tensor(y.sin(), 0, group)  # stacks dim 0 (static)
        s = funcol.reduce_scatter_tensor(g, "sum", 0, group)
        return y, g, s, y.sum(1)  # the row sum reads only the logical elements

    def expected(length):
        x = torch.arange(2.0 * length).reshape(2, length)
        y = sum(x * 2 + 1 + 20 * k for k in range(n))
        g = torch.cat([y.sin()] * n)
        return y, g, n * y.sin(), y.sum(1)

    compiled = torch.compile(step, backend="tpu", fullgraph=True)
    with _recording() as seen:
        for length in (5, 7, 3):
            x = (torch.arange(2.0 * length).reshape(2, length) + 10 * r).to("tpu")
            torch_tpu.mark_dynamic(x, 1, max=16)
            for got, want in zip(compiled(x), expected(length)):
                torch.testing.assert_close(got.cpu(), want)
    if seen["eager"] or seen["partitioned"] or len(seen["programs"]) != 1:
        raise AssertionError(f"the dynamic graph was split, recompiled or ran eager collectives: {seen}")
    program = seen["programs"][0]
    # one program with the collectives embedded (thin stages would exchange dynamically
    # shaped buffers), exchanging the dynamic size
    missing = [op for op in ("stablehlo.all_reduce", "stablehlo.all_gather", "stablehlo.reduce_scatter")
               if op not in program.module_text]
    if program.stage_kinds != ["collective"] or missing or not program.exchanged_sizes:
        raise AssertionError(f"expected one program embedding the collectives (lacks {missing}): {program.stage_kinds}")
    runs = seen["compiled_runs"]
    if len(runs) != 3 or not all(" at sizes " in d for d in runs) or "=7" not in runs[1]:
        raise AssertionError(f"the program's handshakes lack the run-time sizes: {runs}")
    print(f"rank {r}: compiled dynamic collectives OK", flush=True)

    # dim 0 dynamic: the all-gather cannot stack padded blocks; it runs in eager, logged
    torch._dynamo.reset()

    def gather_rows(x):
        return funcol.all_gather_tensor(x * 3, 0, group)

    gather_line = gather_rows.__code__.co_firstlineno + 1

    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logging.getLogger("torch_tpu").addHandler(handler)
    try:
        with _recording() as seen:
            compiled = torch.compile(gather_rows, backend="tpu", fullgraph=True)
            x = torch.full((3, 2), float(r), device="tpu")
            torch_tpu.mark_dynamic(x, 0, max=16)
            got = compiled(x).cpu()
    finally:
        logging.getLogger("torch_tpu").removeHandler(handler)
    torch.testing.assert_close(got, torch.cat([torch.full((3, 2), 3.0 * k) for k in range(n)]))
    reasons = " ".join(rec.getMessage() for rec in records)
    located = f"all_gather_into_tensor at {__file__}:{gather_line} along a dynamic (padded) dimension 0"
    if seen["eager"] != ["all_gather"] or located not in reasons:
        raise AssertionError(f"expected the all-gather in eager with its reason: {seen}, {reasons}")
    print(f"rank {r}: compiled dynamic dim-0 gather in eager OK", flush=True)

    # ranks exchanging different sizes: a divergence on every rank, naming both sizes
    torch._dynamo.reset()
    compiled = torch.compile(step, backend="tpu", fullgraph=True)
    warm = torch.ones(2, 4, device="tpu")
    torch_tpu.mark_dynamic(warm, 1, max=16)
    compiled(warm)  # compiled and checked at size 4 on both ranks
    # sizes no rank ran before (first_call checks each (program, sizes) once; the program
    # is the one of the first check, cached by its text)
    x = torch.ones(2, 9 + r, device="tpu")
    torch_tpu.mark_dynamic(x, 1, max=16)
    try:
        compiled(x)
    except DistributedError as err:
        text = str(err)
        if "diverged at collective" not in text or "=9 at " not in text or "=10 at " not in text:
            raise AssertionError(f"the divergence does not name both ranks' sizes: {text}") from None
        print(f"rank {r}: compiled dynamic size divergence raised:\n{text}", flush=True)
    else:
        raise AssertionError("ranks exchanged different sizes and no error was raised")
    y = torch.full((2,), float(r), device="tpu")
    dist.all_reduce(y)  # in step again
    assert y.cpu().tolist() == [float(sum(range(n)))] * 2, y
    print(f"rank {r}: compiled dynamic size divergence OK", flush=True)
