"""Process-group facts reach the compiler as data (issue #18): the frontend resolves the
groups a graph's collectives name (`torch_tpu.spmd.process_groups_of`), and the importer
lowers collectives from that data alone, without asking torch.distributed."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from spmd_helpers import fake_world
from torch.distributed.device_mesh import init_device_mesh
from torch.fx.experimental.proxy_tensor import make_fx
from torch_tpu.compiler.importer import import_graph
from torch_tpu.compiler.lowering import LoweringError
from torch_tpu.compiler.process_groups import GroupInfo, ProcessGroups
from torch_tpu.spmd import process_groups_of

c10d = torch.ops._c10d_functional


def _all_reduce_graph(group_name: str) -> torch.fx.GraphModule:
    # Fake tracing never resolves the group, so no torch.distributed world is needed.
    fn = lambda x: c10d.wait_tensor(c10d.all_reduce(x, "sum", group_name))  # noqa: E731
    return make_fx(fn, tracing_mode="fake")(torch.randn(4))


def test_collectives_lower_from_the_facts_alone() -> None:
    assert not (dist.is_available() and dist.is_initialized())
    facts = ProcessGroups({"g0": GroupInfo("g0", (0, 2), ((0, 2), (1, 3)), 4)})
    text = import_graph(_all_reduce_graph("g0"), process_groups=facts).text()
    assert "group_ranks = array<i64: 0, 2>" in text
    assert "replica_groups = dense<[[0, 2], [1, 3]]>" in text


def test_a_group_without_facts_is_an_error_saying_how_to_describe_it() -> None:
    with pytest.raises(LoweringError, match=r"all_reduce.*process group 'g0' was not described to the compiler.*process_groups_of"):
        import_graph(_all_reduce_graph("g0"))


def test_the_frontend_resolves_the_groups_a_graph_names() -> None:
    with fake_world(8):
        mesh = init_device_mesh("cpu", (2, 4), mesh_dim_names=("dp", "tp"))
        tp, dp = mesh.get_group("tp").group_name, mesh.get_group("dp").group_name
        lonely = dist.new_group([0, 1])

        def fn(x):
            x = c10d.wait_tensor(c10d.all_reduce(x, "sum", tp))
            x = c10d.wait_tensor(c10d.all_gather_into_tensor(x, 2, dp))
            return c10d.wait_tensor(c10d.all_reduce(x, "sum", lonely.group_name))

        facts = process_groups_of(make_fx(fn)(torch.randn(4)))
        assert facts.groups[tp] == GroupInfo(tp, (0, 1, 2, 3), ((0, 1, 2, 3), (4, 5, 6, 7)), 8)
        assert facts.groups[dp].partition == ((0, 4), (1, 5), (2, 6), (3, 7))
        # A subgroup whose siblings are unknown is kept with the reason, reported by the op.
        assert "declare_partition" in facts.unresolved[lonely.group_name]
        assert process_groups_of(make_fx(lambda x: x + 1)(torch.randn(2))) == ProcessGroups()
