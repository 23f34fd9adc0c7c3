"""Shardy meshes and shardings as `torchtpu-insert-collectives` understands them.

jaxlib's `sdy` bindings give attributes no structured accessors, so the (small,
stable) textual forms are parsed here:

    sdy.mesh @mesh = <["x"=4, "y"=2]>                       (optional device_ids=[...])
    #sdy.sharding<@mesh, [{"x"}, {}]>                        (one {...} per dimension)

A dimension may be sharded on one mesh axis; `{?}` (open) and `{}` are unsharded.
Anything else (several axes on one dimension, sub-axes, unknown axes) is reported by
the pass, naming the value and the sharding.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from torch_tpu.core import attributes

_MESH_AXES = re.compile(r'"([^"]+)"\s*=\s*(\d+)')
_DEVICE_IDS = re.compile(r"device_ids\s*=\s*\[([^\]]*)\]")
_SHARDING = re.compile(r"^#sdy\.sharding<\s*@([\w.$-]+)\s*,\s*\[(.*)\]\s*(.*)>$", re.DOTALL)
_DIM = re.compile(r"\{([^{}]*)\}")

# Where `torchtpu-insert-collectives` leaves the meshes (module attribute
# `torchtpu.mesh.<name>`) and the argument/result shardings, for `torch_tpu.spmd`.
MESH_ATTR_PREFIX = attributes.MESH_PREFIX
SHARDING_ATTR = attributes.SHARDING


class ShardingError(ValueError):
    """A mesh or sharding the pass does not support; the message says which and why."""


@dataclass(frozen=True)
class Mesh:
    name: str
    axes: tuple[tuple[str, int], ...]
    device_ids: tuple[int, ...]

    @property
    def size(self) -> int:
        return math.prod(s for _, s in self.axes)

    def axis_size(self, axis: str) -> int:
        return dict(self.axes)[axis]

    def coordinates(self, position: int) -> dict[str, int]:
        coords: dict[str, int] = {}
        for axis, size in reversed(self.axes):
            coords[axis] = position % size
            position //= size
        return coords

    def axis_index_table(self, axis: str) -> list[int]:
        """table[rank] = the rank's coordinate along `axis`."""
        table = [0] * self.size
        for position, device in enumerate(self.device_ids):
            table[device] = self.coordinates(position)[axis]
        return table

    def groups(self, axis: str) -> list[list[int]]:
        """The replica groups of a collective along `axis`: the ranks that differ only
        in their `axis` coordinate, in coordinate order."""
        by_rest: dict[tuple, list[tuple[int, int]]] = {}
        for position, device in enumerate(self.device_ids):
            coords = self.coordinates(position)
            rest = tuple((a, c) for a, c in coords.items() if a != axis)
            by_rest.setdefault(rest, []).append((coords[axis], device))
        return [[d for _, d in sorted(members)] for _, members in sorted(by_rest.items())]


def parse_mesh(name: str, text: str) -> Mesh:
    """`text` is the printed mesh attribute, e.g. `#sdy.mesh<["x"=4], device_ids=[...]>`."""
    body = text.split("device_ids", 1)[0]
    axes = tuple((a, int(s)) for a, s in _MESH_AXES.findall(body))
    if not axes:
        raise ShardingError(f"mesh @{name} has no axes ({text}); give it at least one, e.g. <[\"x\"=4]>")
    size = math.prod(s for _, s in axes)
    match = _DEVICE_IDS.search(text)
    if match:
        ids = tuple(int(v) for v in match.group(1).replace(" ", "").split(",") if v)
        if sorted(ids) != list(range(size)):
            raise ShardingError(f"mesh @{name}: device_ids {list(ids)} must be a permutation of 0..{size - 1}")
    else:
        ids = tuple(range(size))
    return Mesh(name, axes, ids)


@dataclass(frozen=True)
class Shard:
    """A dimension split on mesh axis `axis`. With `major` > 1 the dimension is, in
    row-major order, `major` blocks each split on `axis` (what merging an unsharded
    dimension of size `major` in front of a sharded one makes: `[B, H] -> [B*H]`)."""

    axis: str
    major: int = 1

    def __str__(self) -> str:
        return f'"{self.axis}"' if self.major == 1 else f'"{self.axis}" in {self.major} blocks'


@dataclass(frozen=True)
class Layout:
    """How a value is distributed: `dims[d]` is the mesh axis dimension d is sharded on
    (None: whole on every rank); `partial` lists (axis, reduction) pairs along which the
    ranks hold partial results still to be combined ("sum", "max", "min")."""

    dims: tuple[Shard | None, ...]
    partial: tuple[tuple[str, str], ...] = field(default=())

    @classmethod
    def replicated(cls, rank: int) -> Layout:
        return cls((None,) * rank)

    @property
    def is_replicated(self) -> bool:
        return not self.partial and all(a is None for a in self.dims)

    def sdy_text(self, mesh: str) -> str:
        return sdy_sharding_text(mesh, [None if a is None else a.axis for a in self.dims])

    def global_shape(self, local: Sequence[int], mesh: Mesh) -> list[int]:
        """The single-device shape of a block of `local` shape laid out this way."""
        return [s * (mesh.axis_size(a.axis) if a is not None else 1) for s, a in zip(local, self.dims)]

    def axes(self) -> set[str]:
        return {a.axis for a in self.dims if a is not None}

    def describe(self) -> str:
        dims = ", ".join("{}" if a is None else "{" + str(a) + "}" for a in self.dims)
        text = f"[{dims}]"
        if self.partial:
            text += " partial " + ", ".join(f"{kind} over \"{axis}\"" for axis, kind in self.partial)
        return text


def sdy_sharding_text(mesh: str, axes: Sequence[str | None]) -> str:
    """`#sdy.sharding<@mesh, [...]>` with dimension d on mesh axis `axes[d]` (None: unsharded)."""
    dims = ", ".join("{}" if a is None else '{"' + a + '"}' for a in axes)
    return f"#sdy.sharding<@{mesh}, [{dims}]>"


def parse_sharding(text: str, meshes: dict[str, Mesh], rank: int) -> tuple[Mesh, Layout]:
    match = _SHARDING.match(text.strip())
    if match is None:
        raise ShardingError(f"cannot read the sharding {text}")
    mesh_name, dims_text, rest = match.groups()
    if mesh_name not in meshes:
        raise ShardingError(f"sharding {text} names mesh @{mesh_name}, which the module does not define")
    mesh = meshes[mesh_name]
    dims_specs = _DIM.findall(dims_text)
    if len(dims_specs) != rank:
        raise ShardingError(f"sharding {text} has {len(dims_specs)} dimensions for a rank-{rank} value")
    known = dict(mesh.axes)
    dims: list[Shard | None] = []
    for spec in dims_specs:
        axes = [a.strip() for a in spec.replace("?", "").split(",") if a.strip()]
        if len(axes) > 1:
            raise ShardingError(f"sharding {text}: a dimension sharded on several axes ({spec}) is not supported")
        if not axes:
            dims.append(None)
            continue
        axis = axes[0]
        if not (axis.startswith('"') and axis.endswith('"')):
            raise ShardingError(f"sharding {text}: sub-axis {axis} is not supported")
        name = axis.strip('"')
        if name not in known:
            raise ShardingError(f"sharding {text}: mesh @{mesh_name} has no axis \"{name}\"")
        dims.append(Shard(name))
    used = [a.axis for a in dims if a is not None]
    if len(set(used)) != len(used):
        raise ShardingError(f"sharding {text} uses an axis twice")
    del rest  # replicated={...} / unreduced={...} say nothing we need
    return mesh, Layout(tuple(dims))
