"""From a PyTorch process-group name to the complete replica-group partition: the
process-group facts the frontend hands to the compiler (`process_groups_of`, data of
`torch_tpu.compiler.process_groups`).

A collective in an FX graph names one group (the one this rank is in). StableHLO needs
every subgroup that runs the same collective, so the partition is derived, in order:

1. from a partition declared with `declare_partition` (torch_tpu.spmd) that has the
   group's ranks as one of its groups -- for groups made with `new_group`, whose sibling
   groups PyTorch does not record on ranks outside them;
2. from a live `DeviceMesh` that owns the group as one of its dimensions: the groups of
   that dimension are the mesh's rows along it (also for meshes whose device order is a
   permutation, e.g. `[[4,0,1,3],[5,2,6,7]]`);
3. from the groups PyTorch recorded (`new_group`): the group together with the other
   recorded groups disjoint from it, when they cover the world exactly;
4. the whole world when the group is the world.

Anything else cannot be completed without guessing, and is an error that says how to
declare the partition.

Members of each group are listed in PyTorch's group-rank order (which all-gather and
all-to-all follow): `get_process_group_ranks` for the group itself; PyTorch sorts the
ranks of the groups it creates, so mesh rows are sorted when the group's own order is.
"""

from __future__ import annotations

import gc

import torch

from torch_tpu.compiler.process_groups import GroupInfo, GroupResolutionError, ProcessGroups


def _dist():
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        raise GroupResolutionError(
            "torch.distributed is not initialized; call torch.distributed.init_process_group "
            "(for tracing without devices: backend 'fake' with FakeStore) before compiling collectives"
        )
    return dist


_DECLARED: list[tuple[tuple[int, ...], ...]] = []


def declare_partition(groups) -> None:
    """Declares a partition of the ranks into groups (e.g. `[[0, 2, 3], [1]]`): a
    collective over any of these groups runs on all of them. Needed for groups created
    with `new_group` outside a DeviceMesh, whose siblings PyTorch does not record."""
    partition = tuple(tuple(int(r) for r in g) for g in groups)
    flat = [r for g in partition for r in g]
    if not partition or any(not g for g in partition) or len(set(flat)) != len(flat) or min(flat) < 0:
        raise ValueError(f"declare_partition: {groups!r} is not a partition of ranks into non-empty disjoint groups")
    _DECLARED.insert(0, partition)


def clear_declared_partitions() -> None:
    _DECLARED.clear()


def _declared_partition(ranks: tuple[int, ...], world: int) -> tuple[tuple[int, ...], ...] | None:
    for partition in _DECLARED:
        if sorted(r for g in partition for r in g) != list(range(world)):
            continue
        for g in partition:
            if sorted(g) == sorted(ranks):
                return tuple(ranks if sorted(h) == sorted(ranks) else tuple(sorted(h)) for h in partition)
    return None


def _mesh_partition(name: str, ranks: tuple[int, ...], world: int) -> tuple[tuple[int, ...], ...] | None:
    from torch.distributed.device_mesh import DeviceMesh

    for obj in gc.get_objects():
        # `type(obj)`, not isinstance: isinstance dereferences weak proxies, and a dead
        # one raises ReferenceError.
        if not issubclass(type(obj), DeviceMesh):
            continue
        names = getattr(obj, "_dim_group_names", None) or []
        for dim, group_name in enumerate(names):
            if group_name != name:
                continue
            mesh = obj.mesh
            rows = [tuple(int(r) for r in row) for row in mesh.movedim(dim, -1).reshape(-1, mesh.shape[dim]).tolist()]
            # A submesh holds only this rank's slice; the root mesh covers the world.
            if sorted(r for row in rows for r in row) != list(range(world)):
                continue
            if not any(sorted(row) == sorted(ranks) for row in rows):
                continue
            if list(ranks) == sorted(ranks):
                rows = [tuple(sorted(row)) for row in rows]
            return tuple(ranks if sorted(row) == sorted(ranks) else row for row in rows)
    return None


def _registered_partition(ranks: tuple[int, ...], world: int) -> tuple[tuple[int, ...], ...] | None:
    from torch.distributed.distributed_c10d import _world

    covered = set(ranks)
    groups = [ranks]
    for pg, members in _world.pg_group_ranks.items():
        if isinstance(pg, int):
            continue
        members_in_order = tuple(g for g, _ in sorted(members.items(), key=lambda kv: kv[1]))
        if covered.isdisjoint(members_in_order):
            groups.append(members_in_order)
            covered |= set(members_in_order)
    if covered == set(range(world)):
        return tuple(groups)
    return None


def resolve_group(name: str) -> GroupInfo:
    """The ranks and the complete partition of the group called `name`."""
    dist = _dist()
    from torch.distributed.distributed_c10d import _resolve_process_group

    try:
        group = _resolve_process_group(name)
    except (ValueError, RuntimeError, KeyError) as err:
        raise GroupResolutionError(f"unknown process group '{name}': {err}") from None
    ranks = tuple(int(r) for r in dist.get_process_group_ranks(group))
    world = dist.get_world_size()
    partition = _declared_partition(ranks, world)
    if partition is None:
        partition = _mesh_partition(name, ranks, world)
    if partition is None and sorted(ranks) == list(range(world)):
        partition = (ranks,)
    if partition is None:
        partition = _registered_partition(ranks, world)
    if partition is None:
        raise GroupResolutionError(
            f"process group '{name}' (ranks {list(ranks)}) is a subgroup whose sibling groups "
            f"this rank does not know, so the partition of the {world} ranks it belongs to is "
            "unknown; create the groups with a DeviceMesh (init_device_mesh) or declare the "
            "partition with torch_tpu.spmd.declare_partition([[...], [...]])"
        )
    return GroupInfo(name, ranks, partition, world)


def _group_names(gm: torch.fx.GraphModule) -> list[str]:
    """The process groups named by the graph's functional collectives (the argument its
    schema calls `group_name`), in first-use order."""
    names: dict[str, None] = {}
    for node in gm.graph.nodes:
        target = node.target
        if node.op != "call_function" or getattr(target, "namespace", None) != "_c10d_functional":
            continue
        for index, argument in enumerate(target._schema.arguments):
            if argument.name != "group_name":
                continue
            value = node.args[index] if index < len(node.args) else node.kwargs.get("group_name")
            if value is not None:
                names[str(value)] = None
    return list(names)


def process_groups_of(gm: torch.fx.GraphModule) -> ProcessGroups:
    """The process-group facts of the groups `gm`'s collectives name, resolved now, while
    torch.distributed can be asked: the data `import_graph(..., process_groups=...)`
    lowers collectives with. A group that cannot be resolved is recorded with the reason,
    which the collective that names it reports."""
    groups: dict[str, GroupInfo] = {}
    unresolved: dict[str, str] = {}
    for name in _group_names(gm):
        try:
            groups[name] = resolve_group(name)
        except GroupResolutionError as err:
            unresolved[name] = str(err)
    return ProcessGroups(groups, unresolved)
