"""From a PyTorch process-group name to the complete replica-group partition.

A collective in an FX graph names one group (the one this rank is in). StableHLO needs
every subgroup that runs the same collective, so the partition is derived, in order:

1. from a live `DeviceMesh` that owns the group as one of its dimensions: the groups of
   that dimension are the mesh's rows along it (this holds for meshes whose device order is
   any permutation, e.g. `[[4,0,1,3],[5,2,6,7]]`);
2. from the groups PyTorch created (`new_group`): the group together with the other
   registered groups disjoint from it, when they cover the world exactly;
3. the whole world when the group is the world.

Anything else (a group whose siblings PyTorch never created, with no mesh) cannot be
completed without guessing, and is an error that says how to create the group.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass

import torch


class GroupResolutionError(ValueError):
    """The group does not exist or its partition cannot be derived; the message says why."""


@dataclass(frozen=True)
class GroupInfo:
    name: str
    ranks: tuple[int, ...]  # global ranks in group order
    partition: tuple[tuple[int, ...], ...]  # every subgroup, each in group order
    world_size: int


def _dist():
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        raise GroupResolutionError(
            "torch.distributed is not initialized; call torch.distributed.init_process_group "
            "(for tracing without devices: backend 'fake' with FakeStore) before compiling collectives"
        )
    return dist


def _mesh_partition(name: str) -> tuple[tuple[int, ...], ...] | None:
    from torch.distributed.device_mesh import DeviceMesh

    for obj in gc.get_objects():
        if not isinstance(obj, DeviceMesh):
            continue
        names = getattr(obj, "_dim_group_names", None) or []
        for dim, group_name in enumerate(names):
            if group_name == name:
                mesh = obj.mesh
                rows = mesh.movedim(dim, -1).reshape(-1, mesh.shape[dim])
                return tuple(tuple(int(r) for r in row) for row in rows.tolist())
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
    partition = _mesh_partition(name)
    if partition is None and sorted(ranks) == list(range(world)):
        partition = (ranks,)
    if partition is None:
        partition = _registered_partition(ranks, world)
    if partition is None:
        raise GroupResolutionError(
            f"process group '{name}' (ranks {list(ranks)}) is a subgroup whose sibling groups "
            f"PyTorch never created, so the partition of the {world} ranks it belongs to is "
            "unknown; create the groups with a DeviceMesh (init_device_mesh) or create every "
            "subgroup of the partition with torch.distributed.new_group"
        )
    return GroupInfo(name, ranks, partition, world)


def padded_groups(partition: tuple[tuple[int, ...], ...]) -> list[list[int]]:
    """The partition as StableHLO's rectangular replica_groups (-1 pads uneven groups)."""
    width = max(len(g) for g in partition)
    return [list(g) + [-1] * (width - len(g)) for g in partition]

