"""One torchrun job that runs many checks (a job's start-up costs more than its checks).
Launched by test/python/distributed/test_tpu_dist.py; prints "rank R: <phase> OK" lines.

argv: --dtypes float32,int32,bfloat16   collectives x these dtypes
      --ddp                              DDP 5 steps == single-process full batch
      --compiled-ddp                     the same with torch.compile(backend="tpu")
      --sync-bn                          DDP with nn.SyncBatchNorm, unequal batches == single process
      --fsdp                             FSDP2 tiny GPT 5 steps == single process
      --compiled-collectives             compiled graphs with _c10d_functional collectives: one program
      --compiled-embedded                the same under torch_tpu.spmd_safe (embedded); subgroup collectives
      --compiled-divergence              compiled graphs exchanging different shapes -> error on every rank
      --compiled-dynamic                 a compiled graph with a dynamic dim: its collectives in its program
      --compiled-mesh                    4 processes: a 2 x 2 DeviceMesh, one compiled graph with collectives
                                         on each mesh dimension and the world
      --tp                               TP MLP (Colwise/Rowwise) 5 steps == single process
      --handshake                        divergence -> DistributedError on every rank
      --die                              the last rank exits; the others raise naming it
      --nodes                            all_reduce across the ranks of a --nnodes job (one launch per node)
      --skip-first-call                  first_call: rank 1 skips an all_reduce that ran before -> every
                                         rank raises (last: the job ends with it)
"""

import argparse
import datetime
import os
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(__file__))
from collectives import check_collectives  # noqa: E402
from compiled_collectives import (  # noqa: E402
    check_compiled_collectives, check_compiled_divergence, check_compiled_embedded_and_subgroups,
    check_compiled_dynamic, check_compiled_mesh,
)
from ddp import check_ddp, check_sync_batch_norm  # noqa: E402
from fsdp import check_fsdp  # noqa: E402
from tp import check_tp  # noqa: E402


def expect_error(name, fn, *needles):
    start = time.monotonic()
    try:
        fn()
    except Exception as err:  # noqa: BLE001
        text = f"{type(err).__name__}: {err}"
        missing = [n for n in needles if n not in text]
        if missing:
            raise AssertionError(f"{name}: error lacks {missing}: {text}") from None
        print(f"rank {dist.get_rank()}: {name} raised after {time.monotonic() - start:.1f}s:\n{text}", flush=True)
        return
    raise AssertionError(f"{name}: no error")


def check_handshake():
    r, n = dist.get_rank(), dist.get_world_size()
    lines = {}

    def diverge():
        if r == 0:
            dist.all_reduce(torch.ones(3, device="tpu"))  # rank 0 line
        else:
            dist.all_reduce(torch.ones(5, device="tpu"))  # other ranks' line

    here = diverge.__code__.co_firstlineno
    lines[0], lines[1] = here + 2, here + 4
    expect_error(
        "divergence", diverge, "DistributedError", "diverged", "rank 0: all_reduce(3 x float32",
        "rank 1: all_reduce(5 x float32", f"job.py:{lines[0]}", f"job.py:{lines[1]}",
    )
    # every_call: a rank skipping a collective it ran before (no new program) is caught
    os.environ["TORCH_TPU_SPMD_HANDSHAKE_STAGE"] = "every_call"
    x = torch.ones(4, device="tpu")
    dist.all_reduce(x)

    def skip():
        if r != 1:
            dist.all_reduce(x)
        dist.all_gather_into_tensor(torch.zeros(4 * n, device="tpu"), x)

    expect_error("skip", skip, "DistributedError", "rank 0: all_reduce(4 x float32", "rank 1: all_gather(4 x float32")
    os.environ["TORCH_TPU_SPMD_HANDSHAKE_STAGE"] = "first_call"
    # the ranks are in step again: nothing ran
    y = torch.full((2,), float(r), device="tpu")
    dist.all_reduce(y)
    assert y.cpu().tolist() == [float(sum(range(n)))] * 2, y
    print(f"rank {r}: handshake OK", flush=True)


def check_die():
    r, n = dist.get_rank(), dist.get_world_size()
    group = dist.new_group(list(range(n)), timeout=datetime.timedelta(seconds=5))
    dist.barrier()
    if r == n - 1:
        print(f"rank {r}: exiting without a word", flush=True)
        os._exit(0)
    expect_error(
        "dead rank", lambda: dist.all_reduce(torch.ones(9, device="tpu"), group=group),
        "DistributedError", f"rank(s) [{n - 1}] did not reach it within 5 s",
    )
    print(f"rank {r}: die OK", flush=True)
    # Rank 0 serves the coordination service: the survivors leave together, rank 0 last
    # (its exit makes the service's clients abort), with no shutdown barrier with the dead.
    store = dist.distributed_c10d._get_default_store()
    store.set(f"die-done-{r}", "1")
    store.wait([f"die-done-{k}" for k in range(n - 1)], datetime.timedelta(seconds=30))
    if r == 0:
        time.sleep(1.0)
    os._exit(0)


def check_skip_first_call():
    """first_call: rank 1 skips an all_reduce it ran before through the same line (a
    helper): the same identity, not checked again (one the ranks reach from different
    lines is caught at once: test_collective_pairing.py). Only rank 1's next collective
    (a new program) is checked; rank 0 runs its all_reduce unchecked, which finds no
    partner. Rank 1 raises after the group's timeout, naming its collective and rank 0's
    last checked one; when it leaves, rank 0's all_reduce fails and raises the same finding
    with what it was running (docs/explanation/distributed.md)."""
    r, n = dist.get_rank(), dist.get_world_size()
    os.environ["TORCH_TPU_SPMD_HANDSHAKE_STAGE"] = "first_call"
    group = dist.new_group(list(range(n)), timeout=datetime.timedelta(seconds=5))
    x = torch.ones(4, device="tpu")

    def reduce(t):
        dist.all_reduce(t, group=group)  # every all_reduce below runs from this line

    reduce(x)  # checked: its first run
    reduce(x)  # the same identity: not checked again

    def skip():
        if r != 1:
            reduce(x)  # rank 0 only
        out = torch.zeros(4 * n, device="tpu")
        dist.all_gather_into_tensor(out, x, group=group)  # rank 1 line: a new program

    here = skip.__code__.co_firstlineno
    start = time.monotonic()
    needles = ["DistributedError", "collective #3 of group", "all_gather(4 x float32) over ranks [0, 1] at ",
               f"job.py:{here + 4}", "on rank 1: rank(s) [0] did not reach it within 5 s",
               "rank 0: still in the job; its last checked collective was #1 (all_reduce(4 x float32, reduce_op=sum)"]
    if r == 0:
        needles += ["Rank 0 was running all_reduce(4 x float32, reduce_op=sum) over ranks [0, 1] at ",
                    "(called as all_reduce of [4]), which found no partner"]
    expect_error("skip under first_call", skip, *needles)
    assert time.monotonic() - start < 20, "not within the group's timeout"
    print(f"rank {r}: skip under first_call OK", flush=True)
    # Rank 1 leaves (as a failed script does), which is what lets rank 0's all_reduce fail.
    # Neither waits for the shutdown barrier; rank 0 serves the coordination service.
    os._exit(0)


def check_nodes():
    """A job launched as several torchrun "nodes" (--nnodes/--node_rank): each node's
    process has LOCAL_RANK 0 and its own tpu:0; the global ranks still reduce together."""
    r, n = dist.get_rank(), dist.get_world_size()
    node, local = int(os.environ["GROUP_RANK"]), int(os.environ["LOCAL_RANK"])
    x = torch.full((3,), float(r + 1), device="tpu")
    dist.all_reduce(x)
    expect = float(n * (n + 1) // 2)
    assert x.cpu().tolist() == [expect] * 3, (x, expect)
    g = torch.zeros(n, device="tpu")
    dist.all_gather_into_tensor(g, torch.tensor([float(node)], device="tpu"))
    print(f"rank {r}: nodes OK (node {node}, local rank {local}, nodes {g.cpu().tolist()})", flush=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--dtypes", default="")
    parser.add_argument("--ddp", action="store_true")
    parser.add_argument("--compiled-ddp", action="store_true")
    parser.add_argument("--sync-bn", action="store_true")
    parser.add_argument("--fsdp", action="store_true")
    parser.add_argument("--compiled-collectives", action="store_true")
    parser.add_argument("--compiled-embedded", action="store_true")
    parser.add_argument("--compiled-divergence", action="store_true")
    parser.add_argument("--compiled-dynamic", action="store_true")
    parser.add_argument("--compiled-mesh", action="store_true")
    parser.add_argument("--tp", action="store_true")
    parser.add_argument("--handshake", action="store_true")
    parser.add_argument("--die", action="store_true")
    parser.add_argument("--nodes", action="store_true")
    parser.add_argument("--skip-first-call", action="store_true")
    args = parser.parse_args()
    dist.init_process_group("tpu_dist", timeout=datetime.timedelta(seconds=60))
    assert dist.get_backend() == "tpu_dist"
    if args.dtypes:
        check_collectives([getattr(torch, name) for name in args.dtypes.split(",")])
    if args.ddp:
        check_ddp()
    if args.compiled_ddp:
        check_ddp(compiled=True)
    if args.sync_bn:
        check_sync_batch_norm()
    if args.fsdp:
        check_fsdp()
    if args.compiled_collectives:
        check_compiled_collectives()
    if args.compiled_embedded:
        check_compiled_embedded_and_subgroups()
    if args.compiled_divergence:
        check_compiled_divergence()
    if args.compiled_dynamic:
        check_compiled_dynamic()
    if args.compiled_mesh:
        check_compiled_mesh()
    if args.tp:
        check_tp()
    if args.handshake:
        check_handshake()
    if args.die:
        check_die()
    if args.nodes:
        check_nodes()
    if args.skip_first_call:
        check_skip_first_call()
    dist.destroy_process_group()
    print(f"rank {dist.get_rank() if dist.is_initialized() else os.environ['RANK']}: JOB OK", flush=True)


if __name__ == "__main__":
    main()
