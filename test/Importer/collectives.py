# RUN: %PYTHON %s | FileCheck %s
# FX importer: torch.ops._c10d_functional collectives (compiler/lowering/collectives.py)
# become torchtpu.collective ops carrying the group's ranks, the reduce op and the
# complete partition, derived from a DeviceMesh of a fake 8-rank world.

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.fx.experimental.proxy_tensor import make_fx
from torch.testing._internal.distributed.fake_pg import FakeStore
from torch_tpu.compiler.importer import import_graph
from torch_tpu.spmd import process_groups_of

c10d = torch.ops._c10d_functional
dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=8)
mesh = init_device_mesh("cpu", (2, 4), mesh_dim_names=("dp", "tp"))
TP = mesh.get_group("tp").group_name
DP = mesh.get_group("dp").group_name


def run(name, fn, *args):
    print(name)
    gm = make_fx(fn)(*args)
    print(import_graph(gm, process_groups=process_groups_of(gm)).text())


X = torch.randn(8, 3)

# The tp dimension: groups are the mesh rows, the rank's own first.
# CHECK-LABEL: test_all_reduce_tp
# CHECK: "torchtpu.collective"(%arg0) {group_name = "{{.*}}", group_ranks = array<i64: 0, 1, 2, 3>, kind = "all_reduce", reduce_op = "avg", replica_groups = dense<{{\[\[}}0, 1, 2, 3], [4, 5, 6, 7]]> : tensor<2x4xi64>}
# CHECK-NOT: wait_tensor
run("test_all_reduce_tp", lambda x: c10d.wait_tensor(c10d.all_reduce(x, "avg", TP)), X)

# The dp dimension: the mesh columns.
# CHECK-LABEL: test_all_gather_dp
# CHECK: kind = "all_gather"
# CHECK-SAME: replica_groups = dense<{{\[\[}}0, 4], [1, 5], [2, 6], [3, 7]]> : tensor<4x2xi64>
# CHECK-SAME: -> tensor<16x3xf32>
run("test_all_gather_dp", lambda x: c10d.wait_tensor(c10d.all_gather_into_tensor(x, 2, DP)), X)

# reduce_scatter keeps the reduce op; all_to_all the split dimension; broadcast the
# source's position in the group.
# CHECK-LABEL: test_scatter_all_to_all_broadcast
# CHECK: kind = "reduce_scatter", reduce_op = "max"{{.*}} -> tensor<2x3xf32>
# CHECK: dim = 0 : i64{{.*}}kind = "all_to_all"
# CHECK: kind = "broadcast"{{.*}}src = 2 : i64
run(
    "test_scatter_all_to_all_broadcast",
    lambda x: (
        c10d.wait_tensor(c10d.reduce_scatter_tensor(x, "max", 4, TP)),
        c10d.wait_tensor(c10d.all_to_all_single(x, [2, 2, 2, 2], [2, 2, 2, 2], TP)),
        c10d.wait_tensor(c10d.broadcast(x, 2, TP)),
    ),
    X,
)

dist.destroy_process_group()
