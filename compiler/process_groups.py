"""Process-group facts, as data: what the compiler knows about torch.distributed.

A collective in an FX graph names one group (the one this rank is in); StableHLO needs
every subgroup that runs the same collective. The frontend (`torch_tpu.spmd.process_groups_of`)
asks torch.distributed for each group a graph names -- its ranks and the complete
partition of the world it belongs to -- and hands the answers to `import_graph` as a
`ProcessGroups`. The compiler itself never inspects torch.distributed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


class GroupResolutionError(ValueError):
    """The group does not exist or its partition cannot be derived; the message says why."""


@dataclass(frozen=True)
class GroupInfo:
    name: str
    ranks: tuple[int, ...]  # global ranks in group order
    partition: tuple[tuple[int, ...], ...]  # every subgroup, each in group order
    world_size: int


@dataclass(frozen=True)
class ProcessGroups:
    """The groups of one graph, by name. `unresolved` keeps, for a group the frontend
    could not resolve, the reason, so the collective that names it fails at its own
    source line with that reason."""

    groups: Mapping[str, GroupInfo] = field(default_factory=dict)
    unresolved: Mapping[str, str] = field(default_factory=dict)

    def lookup(self, name: str) -> GroupInfo:
        if name in self.groups:
            return self.groups[name]
        if name in self.unresolved:
            raise GroupResolutionError(self.unresolved[name])
        raise GroupResolutionError(
            f"process group '{name}' was not described to the compiler: build the graph's "
            "groups with torch_tpu.spmd.process_groups_of(gm) and pass them to "
            "import_graph(..., process_groups=...)"
        )


def padded_groups(partition: tuple[tuple[int, ...], ...]) -> list[list[int]]:
    """The partition as StableHLO's rectangular replica_groups (-1 pads uneven groups)."""
    width = max(len(g) for g in partition)
    return [list(g) + [-1] * (width - len(g)) for g in partition]
