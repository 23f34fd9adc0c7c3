"""tpu_dist end to end: real `torchrun` jobs on this machine (XLA:CPU, gloo over TCP).

Start-up dominates (each rank imports torch and compiles its collectives), so each job
runs many checks (workers/job.py) and prints one "rank R: <phase> OK" line per phase.
Every launch has a subprocess timeout and every group a short timeout: nothing can hang.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from free_ports import free_port_pair

pytest.importorskip("torch.distributed")
import torch.distributed as dist  # noqa: E402

if not dist.is_available():  # pragma: no cover
    pytest.skip("torch.distributed is not available", allow_module_level=True)

WORKERS = Path(__file__).parent / "workers"
REPO = Path(__file__).resolve().parents[3]


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")}
    env.update(PYTHONPATH=os.pathsep.join([str(REPO / "python"), env.get("PYTHONPATH", "")]),
               TORCH_TPU_SPMD_HANDSHAKE_STAGE="first_call", PYTHONUNBUFFERED="1", **extra)
    return env


def torchrun(nproc: int, *args: str, timeout: float = 480) -> str:
    cmd = [
        sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}",
        "--master_addr=127.0.0.1", f"--master_port={free_port_pair()}", str(WORKERS / "job.py"), *args,
    ]
    proc = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=timeout)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-6000:]
    return output


def _expect_phases(output: str, ranks, phases) -> None:
    for r in ranks:
        for phase in phases:
            assert f"rank {r}: {phase} OK" in output, f"rank {r} did not finish {phase}:\n{output[-6000:]}"


def test_two_ranks_collectives_ddp_fsdp_tp_handshake():
    out = torchrun(2, "--dtypes", "float32,int32,bfloat16", "--ddp", "--compiled-ddp", "--sync-bn", "--fsdp",
                   "--compiled-collectives", "--tp", "--handshake")
    _expect_phases(out, range(2), ["collectives", "DDP", "compiled DDP", "SyncBatchNorm", "FSDP2",
                                   "compiled collectives", "TP", "handshake", "JOB"])
    # the divergence names both ranks' lines on each rank
    assert out.count("diverged at collective") == 4  # two scenarios x two ranks


def test_four_ranks_collectives_subgroups_and_a_dead_rank():
    out = torchrun(4, "--dtypes", "float32", "--die")
    _expect_phases(out, range(3), ["collectives", "die"])
    assert "rank 3: collectives OK" in out and "rank 3: exiting without a word" in out
    for r in range(3):
        assert f"on rank {r}: rank(s) [3] did not reach it within 5 s" in out, out[-6000:]


def _launch_error(scenario: str, **env: str) -> str:
    proc = subprocess.run(
        [sys.executable, str(WORKERS / "launch_errors.py"), scenario],
        env=_env(**env), capture_output=True, text=True, timeout=90,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def test_launch_errors_are_clear():
    out = _launch_error("config_errors", WORLD_SIZE="2", MASTER_PORT=str(free_port_pair()))
    missing_env, hash_store, world_mismatch = out.split("== ")[1:]
    # no torchrun, no variables: PyTorch's env:// rendezvous names the missing one
    assert "ERROR ValueError" in missing_env and "RANK" in missing_env
    assert "ERROR LaunchError: tpu_dist: MASTER_ADDR, MASTER_PORT not set" in hash_store and "torchrun" in hash_store
    assert "ERROR LaunchError: tpu_dist: WORLD_SIZE=2 but the process group has 1 ranks" in world_mismatch
    port = free_port_pair()
    out = _launch_error("busy_port", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1")
    assert f"ERROR DistributedError: tpu_dist: rank 0 cannot serve the coordination service at 127.0.0.1:{port + 1}" in out
    assert "pick another MASTER_PORT" in out and "in use" in out
    # tcp:// initialisation without MASTER_*: the coordinator sits next to the TCPStore
    assert "INIT OK [1.0, 1.0, 1.0]" in _launch_error("tcp_init", TCP_PORT=str(free_port_pair()))


@pytest.mark.parametrize("failing", [1, 0])
def test_a_rank_whose_client_fails_stops_every_rank_with_an_error_naming_it(failing):
    """Creating the client is collective (topologies go through the coordination service):
    a rank whose creation failed used to leave the others blocked in jaxlib until its
    missed heartbeat made jaxlib abort them, with no Python error. Now every rank raises,
    the peers naming the failing rank and its cause, well within the group's timeout (20 s);
    rank 0 failing (it serves the service) too."""
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_addr=127.0.0.1",
        f"--master_port={free_port_pair()}", str(WORKERS / "client_failure.py"), str(failing),
    ]
    proc = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=120)
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0, output[-6000:]
    cause = "the multi-process CPU client failed to start: gloo cannot listen on this host (forced by the test)"
    assert (f"rank {failing}: PlatformError: tpu_dist" in output
            and f"rank {failing} of 2 could not create its client: {cause}. The other ranks stop" in output), output[-6000:]
    peer = 1 - failing
    assert (f"rank {peer}: DistributedError: tpu_dist" in output
            and f"rank {peer} of 2 cannot start: rank {failing} could not create its client: {cause}. Fix the "
                f"cause on rank {failing}" in output), output[-6000:]
    for abort in ("Terminating process", "FATAL", "Aborted", "SIGABRT", "Check failure"):
        assert abort not in output, output[-6000:]
    failed_at = float(output.split(f"rank {failing}: its client fails at ")[1].split()[0])
    raised_at = float(output.split(f"rank {peer}: raised at ")[1].split(",")[0])
    assert raised_at - failed_at < 5, output[-6000:]  # measured 0.05-0.07 s (2-core machine, load 7-9)


@pytest.mark.parametrize("how, own_error, cause", [
    ("tensor_first", "PlatformError: tpu_dist: rank 0 of 2 could not create its client: the cpu runtime client "
     "already exists in this process", "could not create its client: the cpu runtime client already exists"),
    ("interrupt", "KeyboardInterrupt", "was interrupted during start-up (KeyboardInterrupt)"),
])
def test_a_rank_that_fails_outside_the_client_creation_stops_every_rank_with_an_error_naming_it(
        how, own_error, cause):
    """A rank with a tpu tensor made before init_process_group (its client exists already) used
    to fail after declaring itself ready, and a rank interrupted by Ctrl-C during start-up told
    no one: both left the peer blocked in jaxlib, which aborted both processes (exit 134)."""
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_addr=127.0.0.1",
        f"--master_port={free_port_pair()}", str(WORKERS / "client_failure.py"), "0", how,
    ]
    proc = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=120)
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0, output[-6000:]
    assert f"rank 0: {own_error}" in output, output[-6000:]
    assert f"rank 1: DistributedError: tpu_dist: rank 1 of 2 cannot start: rank 0 {cause}" in output, output[-6000:]
    for abort in ("Terminating process", "FATAL", "Aborted", "SIGABRT", "Check failure"):
        assert abort not in output, output[-6000:]
    failed_at = float(output.split("rank 0: its client fails at ")[1].split()[0])
    raised_at = float(output.split("rank 1: raised at ")[1].split(",")[0])
    assert raised_at - failed_at < 5, output[-6000:]


def test_a_group_made_again_under_its_old_name_does_not_meet_the_old_groups_records():
    """init_process_group after destroy_process_group gives the world group and the first
    new_group their old names again; rank 0 compared its new collective #1 with rank 1's
    record of the old group's #1 and raised a divergence naming a line that had run
    before ("rank 1: all_reduce(4 x float32 ...) at reinit.py:20")."""
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_addr=127.0.0.1",
        f"--master_port={free_port_pair()}", str(WORKERS / "reinit.py"),
    ]
    proc = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=240)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-6000:]
    for rank in range(2):
        assert f"rank {rank}: first [4.0, 4.0, 4.0, 4.0]" in output
        assert f"rank {rank}: again {[6.0] * 8}" in output, output[-6000:]
