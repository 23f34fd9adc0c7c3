"""Every tpu_dist collective x dtypes, checked against values computed by hand from
each rank's known input (run by job.py)."""

import torch
import torch.distributed as dist

def value(rank, n=6, dtype=torch.float32, shift=0):
    """Rank `rank`'s input: small integers, exact in every dtype used here."""
    return (torch.arange(n) % 5 + rank * 2 + 1 + shift).to(dtype)


def check(name, got, want):
    got = got.cpu() if isinstance(got, torch.Tensor) else got
    if not torch.equal(got, want):
        raise AssertionError(f"{name}: got {got} want {want}")


def check_collectives(dtypes):
    r, n = dist.get_rank(), dist.get_world_size()
    ranks = range(n)
    dev = "tpu"
    for dt in dtypes:
        tag = str(dt).removeprefix("torch.")
        inputs = [value(k, dtype=dt) for k in ranks]
        # all_reduce: every op PyTorch defines for the dtype
        ops = {
            dist.ReduceOp.SUM: lambda xs: sum(xs[1:], xs[0]),
            dist.ReduceOp.PRODUCT: lambda xs: torch.stack(xs).prod(0).to(dt),
            dist.ReduceOp.MIN: lambda xs: torch.stack(xs).min(0).values,
            dist.ReduceOp.MAX: lambda xs: torch.stack(xs).max(0).values,
        }
        if dt.is_floating_point:
            ops[dist.ReduceOp.AVG] = lambda xs: (sum(xs[1:], xs[0]) / len(xs)).to(dt)
        else:
            ops[dist.ReduceOp.BAND] = lambda xs: torch.stack(xs).bitwise_and.reduce if False else _fold(xs, torch.bitwise_and)
            ops[dist.ReduceOp.BOR] = lambda xs: _fold(xs, torch.bitwise_or)
            ops[dist.ReduceOp.BXOR] = lambda xs: _fold(xs, torch.bitwise_xor)
        for op, ref in ops.items():
            x = value(r, dtype=dt).to(dev)
            dist.all_reduce(x, op=op)
            check(f"all_reduce {op} {tag}", x, ref(inputs))
        # a non-contiguous view is reduced in place, its base sees it
        base = torch.zeros(4, 6, dtype=dt)
        base[:, 2] = value(r, 4, dt)
        b = base.to(dev)
        dist.all_reduce(b[:, 2])
        want = torch.zeros(4, 6, dtype=dt)
        want[:, 2] = sum((value(k, 4, dt) for k in ranks), torch.zeros(4, dtype=dt))
        check(f"all_reduce view {tag}", b, want)
        # broadcast from the last rank
        x = value(r, dtype=dt).to(dev)
        dist.broadcast(x, src=n - 1)
        check(f"broadcast {tag}", x, inputs[n - 1])
        # all_gather (list) and all_gather_into_tensor
        outs = [torch.zeros(6, dtype=dt, device=dev) for _ in ranks]
        dist.all_gather(outs, value(r, dtype=dt).to(dev))
        for k in ranks:
            check(f"all_gather[{k}] {tag}", outs[k], inputs[k])
        out = torch.zeros(n, 3, 2, dtype=dt, device=dev)
        dist.all_gather_into_tensor(out, value(r, dtype=dt).reshape(3, 2).to(dev))
        check(f"all_gather_into_tensor {tag}", out, torch.stack(inputs).reshape(n, 3, 2))
        # reduce_scatter (list) and reduce_scatter_tensor
        full = [value(k, 4 * n, dt) for k in ranks]
        total = sum(full[1:], full[0])
        o = torch.zeros(4, dtype=dt, device=dev)
        dist.reduce_scatter(o, [c.to(dev) for c in value(r, 4 * n, dt).chunk(n)])
        check(f"reduce_scatter {tag}", o, total.chunk(n)[r])
        o = torch.zeros(2, 2, dtype=dt, device=dev)
        dist.reduce_scatter_tensor(o, value(r, 4 * n, dt).reshape(2 * n, 2).to(dev))
        check(f"reduce_scatter_tensor {tag}", o, total.reshape(2 * n, 2).chunk(n)[r])
        # reduce to rank 0: others keep their input
        x = value(r, dtype=dt).to(dev)
        dist.reduce(x, dst=0, op=dist.ReduceOp.MAX)
        check(f"reduce {tag}", x, torch.stack(inputs).max(0).values if r == 0 else inputs[r])
        # gather to the last rank, scatter from rank 0
        g = [torch.zeros(6, dtype=dt, device=dev) for _ in ranks] if r == n - 1 else None
        dist.gather(value(r, dtype=dt).to(dev), g, dst=n - 1)
        if r == n - 1:
            for k in ranks:
                check(f"gather[{k}] {tag}", g[k], inputs[k])
        s = torch.zeros(6, dtype=dt, device=dev)
        pieces = [value(k, dtype=dt, shift=10).to(dev) for k in ranks] if r == 0 else None
        dist.scatter(s, pieces, src=0)
        check(f"scatter {tag}", s, value(r, dtype=dt, shift=10))
        # all_to_all_single, equal splits: chunk j of rank k goes to rank j
        mine = value(r, 2 * n, dt)
        out = torch.zeros(2 * n, dtype=dt, device=dev)
        dist.all_to_all_single(out, mine.to(dev))
        check(f"all_to_all_single {tag}", out, torch.cat([value(k, 2 * n, dt).chunk(n)[r] for k in ranks]))
        # uneven splits: rank k sends k + j + 1 rows to rank j
        splits = lambda k: [k + j + 1 for j in ranks]  # noqa: E731
        rows = lambda k: torch.stack([value(k, 3, dt, shift=i) for i in range(sum(splits(k)))])  # noqa: E731
        inp = rows(r).to(dev)
        out_splits = [k + r + 1 for k in ranks]
        out = torch.zeros(sum(out_splits), 3, dtype=dt, device=dev)
        dist.all_to_all_single(out, inp, out_splits, splits(r))
        want = torch.cat([rows(k).split(splits(k))[r] for k in ranks])
        check(f"all_to_all_single uneven {tag}", out, want)
        # all_to_all (list)
        outs = [torch.zeros(r + 1, dtype=dt, device=dev) for _ in ranks]
        ins = [value(r, j + 1, dt).to(dev) for j in ranks]
        dist.all_to_all(outs, ins)
        for k in ranks:
            check(f"all_to_all[{k}] {tag}", outs[k], value(k, r + 1, dt))
        # send/recv around a ring
        t = value(r, dtype=dt).to(dev)
        got = torch.zeros(6, dtype=dt, device=dev)
        if r % 2 == 0:
            dist.send(t, (r + 1) % n)
            dist.recv(got, (r - 1) % n)
        else:
            dist.recv(got, (r - 1) % n)
            dist.send(t, (r + 1) % n)
        check(f"send/recv {tag}", got, inputs[(r - 1) % n])
    # bool: SUM is or, PRODUCT is and
    flags = torch.tensor([r == 0, True, False, r == n - 1])
    x = flags.to(dev)
    dist.all_reduce(x)
    check("all_reduce bool or", x, torch.tensor([True, True, False, True]))
    x = flags.to(dev)
    dist.all_reduce(x, op=dist.ReduceOp.PRODUCT)
    check("all_reduce bool and", x, torch.tensor([n == 1, True, False, n == 1]))
    # float BAND is PyTorch's error too
    try:
        dist.all_reduce(torch.ones(2, device=dev), op=dist.ReduceOp.BAND)
    except ValueError as err:
        assert "band" in str(err) and "float" in str(err), err
    else:
        raise AssertionError("BAND of floats did not raise")
    # async_op: the Work waits and returns the tensors
    x = value(r).to(dev)
    work = dist.all_reduce(x, async_op=True)
    work.wait()
    check("async all_reduce", x, sum(value(k) for k in ranks))
    fut = dist.all_reduce(x, async_op=True).get_future()
    check("async future", fut.wait()[0], sum(value(k) for k in ranks) * n)
    # async_op: an error is raised by wait()
    work = dist.all_reduce(torch.ones(2, device=dev), op=dist.ReduceOp.BXOR, async_op=True)
    try:
        work.wait()
    except ValueError as err:
        assert "bxor" in str(err), err
    else:
        raise AssertionError("wait() did not raise the collective's error")
    # subgroups: even ranks and odd ranks (new_group is collective over all ranks)
    evens = dist.new_group([k for k in ranks if k % 2 == 0])
    odds = dist.new_group([k for k in ranks if k % 2 == 1])
    mine = evens if r % 2 == 0 else odds
    members = [k for k in ranks if k % 2 == r % 2]
    x = value(r).to(dev)
    dist.all_reduce(x, group=mine)
    check("subgroup all_reduce", x, sum((value(k) for k in members), torch.zeros(6)))
    out = torch.zeros(len(members) * 6, device=dev)
    dist.all_gather_into_tensor(out, value(r).to(dev), group=mine)
    check("subgroup all_gather", out, torch.cat([value(k) for k in members]))
    x = value(r).to(dev)
    dist.broadcast(x, src=members[-1], group=mine)
    check("subgroup broadcast", x, value(members[-1]))
    # an in-place op on a collective's output whose buffer something else still holds
    # copies it on the device first (the output was once an N-device array PjRT would
    # not copy: "CopyArrays only supports destination device list of the same size")
    from torch_tpu.device import _storage

    x = value(r).to(dev)
    dist.all_reduce(x)
    held = _storage.entry_of(x).buffer  # noqa: F841 - the second holder
    x.add_(1)
    check("in-place op on an all_reduce output still held", x, sum(value(k) for k in ranks) + 1)
    check("the held output keeps its value", _as_cpu(held, x), sum(value(k) for k in ranks))
    # CPU tensors go to gloo through the same group
    c = value(r)
    dist.all_reduce(c)
    check("cpu all_reduce (gloo)", c, sum(value(k) for k in ranks))
    dist.barrier()
    print(f"rank {r}: collectives OK", flush=True)


def _fold(xs, fn):
    acc = xs[0]
    for x in xs[1:]:
        acc = fn(acc, x)
    return acc




def _as_cpu(buffer, like):
    from torch_tpu.distributed._process_group import _as_tensor

    return _as_tensor(buffer, like.shape, like.dtype).cpu()
