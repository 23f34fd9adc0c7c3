"""Compiled graphs with collectives in real `torchrun` jobs (2 processes, XLA:CPU): the
graph compiles whole, its collectives as thin stages of its program or embedded under
`torch_tpu.spmd_safe` (workers/compiled_collectives.py); under the `first_call`
handshake, a rank that skips a collective that ran before makes every rank raise; a job
launched as two torchrun "nodes" on this machine."""

from __future__ import annotations

import subprocess
import sys

from free_ports import free_port_pair
from test_tpu_dist import WORKERS, _env, _expect_phases, torchrun


def test_compiled_graph_collectives_are_stages_of_one_program_and_first_call_catches_a_skip():
    # --skip-first-call goes last: it leaves rank 0 with an unpaired all_reduce and ends the job
    # (the compiled DDP step runs in test_tpu_dist.py's two-rank job, with these checks too)
    out = torchrun(2, "--compiled-collectives", "--compiled-embedded", "--compiled-divergence", "--skip-first-call",
                   timeout=300)
    _expect_phases(out, range(2), ["compiled collectives", "spmd_safe compiled collectives",
                                   "compiled subgroup collectives", "compiled divergence", "skip under first_call"])
    # the waiting rank's finding, raised on both ranks; the blocked one adds what it ran
    assert out.count("on rank 1: rank(s) [0] did not reach it within 5 s") == 2, out[-6000:]
    assert "Rank 0 was running all_reduce(4 x float32, reduce_op=sum)" in out, out[-6000:]


def test_two_nodes_on_one_machine():
    """`--nnodes 2 --node_rank k`, one process per node, two torchrun launches with a
    static rendezvous at 127.0.0.1: the processes find each other and all_reduce across
    "nodes"."""
    port = free_port_pair()
    launches = [
        subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", f"--node_rank={node}",
             "--nproc_per_node=1", "--rdzv-backend=static", "--master_addr=127.0.0.1", f"--master_port={port}",
             str(WORKERS / "job.py"), "--nodes"],
            env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        for node in range(2)
    ]
    outputs = []
    try:
        for proc in launches:
            outputs.append(proc.communicate(timeout=180)[0])
    finally:
        for proc in launches:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    for node, (proc, out) in enumerate(zip(launches, outputs)):
        assert proc.returncode == 0, f"node {node}:\n{out[-6000:]}"
        assert f"rank {node}: nodes OK (node {node}, local rank 0, nodes [0.0, 1.0])" in out, out[-6000:]
        assert f"rank {node}: JOB OK" in out, out[-6000:]


def test_processes_on_other_hosts_get_a_reachable_address():
    """gloo (XLA:CPU's cross-process collectives) listens at the address each process
    advertises: loopback only when the coordinator is on this machine; towards another
    host, this host's own interface (a fixed 127.0.0.1 sent every other host to itself)."""
    import socket

    import pytest

    from torch_tpu.runtime.distributed import local_address

    assert local_address("127.0.0.1:29500") == "127.0.0.1"
    assert local_address("localhost:29500") == "127.0.0.1"
    remote = local_address("203.0.113.7:29500")  # TEST-NET-3: another host
    if remote == "127.0.0.1":
        pytest.skip("this machine has no route off the host")
    assert not remote.startswith("127.")
    with socket.socket() as s:  # an address of this host: it can be listened on
        s.bind((remote, 0))


def test_compiled_graph_with_a_dynamic_dim_keeps_its_collectives_in_its_program():
    """torch_tpu.mark_dynamic on a 2-rank job's input: one compile serves three sizes, the
    collectives are stages of its program, a dim-0 all-gather runs in eager with its
    reason, and ranks passing different sizes raise (workers/compiled_collectives.py)."""
    out = torchrun(2, "--compiled-dynamic", timeout=300)
    _expect_phases(out, range(2), ["compiled dynamic collectives", "compiled dynamic dim-0 gather in eager",
                                   "compiled dynamic size divergence", "JOB"])


def test_four_process_device_mesh_compiled_graph_collectives_on_each_dimension():
    """A 2 x 2 DeviceMesh: one compiled graph with collectives over the mesh's rows, its
    columns and the world compiles whole and matches hand-computed values on every rank."""
    out = torchrun(4, "--compiled-mesh", timeout=420)
    _expect_phases(out, range(4), ["compiled mesh collectives", "JOB"])
