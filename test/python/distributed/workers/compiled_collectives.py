"""torch.compile(backend="tpu") graphs with `_c10d_functional` collectives on tpu tensors
(run by job.py): the compute around them runs compiled, each collective runs between the
compiled pieces as a tpu_dist collective program of the group (not gloo, not the CPU)."""

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol


def _recording_kinds(group):
    """The kinds of the tpu_dist collective programs the group runs from now on."""
    # PyTorch hands back a Python process group as is: WORLD is the ProcessGroupTPU
    backend = group if hasattr(group, "_collective") else group._get_backend(torch.device("tpu"))
    kinds, run = [], backend._collective

    def recording(kind, *args, **kwargs):
        kinds.append(kind)
        return run(kind, *args, **kwargs)

    backend._collective = recording
    return kinds, lambda: delattr(backend, "_collective")


def check_compiled_collectives():
    r, n = dist.get_rank(), dist.get_world_size()
    group = dist.group.WORLD
    torch._dynamo.reset()

    def step(x):
        y = funcol.all_reduce(x * 2 + 1, "sum", group)  # a compute piece, then the collective
        g = funcol.all_gather_tensor(y.sin(), 0, group)
        s = funcol.reduce_scatter_tensor(g.repeat(n, 1), "sum", 0, group)
        return y, g, s

    compiled = torch.compile(step, backend="tpu", fullgraph=True)
    x = torch.arange(6.0).reshape(2, 3) + 10 * r
    kinds, stop = _recording_kinds(group)
    try:
        y, g, s = (t.cpu() for t in compiled(x.to("tpu")))
    finally:
        stop()
    # hand-computed: every rank's x is arange + 10 r
    expect_y = sum(torch.arange(6.0).reshape(2, 3) * 2 + 1 + 20 * k for k in range(n))
    expect_g = torch.cat([expect_y.sin()] * n)
    torch.testing.assert_close(y, expect_y)
    torch.testing.assert_close(g, expect_g)
    torch.testing.assert_close(s, n * expect_g)  # rank r's block of n copies of g, summed
    if kinds != ["all_reduce", "all_gather", "reduce_scatter"]:
        raise AssertionError(f"the compiled graph's collectives ran as tpu_dist programs {kinds}")
    print(f"rank {r}: compiled collectives OK", flush=True)
