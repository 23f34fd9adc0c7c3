"""From torchrun's environment to the multi-process runtime.

torchrun (and `init_process_group(init_method="env://")`) sets MASTER_ADDR, MASTER_PORT,
RANK and WORLD_SIZE. The runtime's coordination service is served by rank 0 at
MASTER_ADDR on port MASTER_PORT + 1 (MASTER_PORT itself is torch's TCPStore), so a plain
`torchrun --nproc_per_node=N script.py` needs nothing else.
"""

from __future__ import annotations

import datetime
import os

COORDINATOR_PORT_OFFSET = 1
_NEEDED = ("MASTER_ADDR", "MASTER_PORT")


class LaunchError(RuntimeError):
    """The process was started without what a tpu_dist job needs."""


def _tcp_store_endpoint(store) -> tuple[str, int] | None:
    """(host, port) of the TCPStore under `store` (PrefixStores wrap it), if it is one."""
    import torch.distributed as dist

    while isinstance(store, dist.PrefixStore):
        store = store.underlying_store
    if isinstance(store, dist.TCPStore):
        return store.host, int(store.port)
    return None


def coordinator_address(store=None) -> str:
    """MASTER_ADDR:MASTER_PORT+1, or next to the TCPStore of `tcp://` initialisation."""
    missing = [name for name in _NEEDED if not os.environ.get(name)]
    endpoint = _tcp_store_endpoint(store) if missing and store is not None else None
    if endpoint is not None:
        return f"{endpoint[0]}:{endpoint[1] + COORDINATOR_PORT_OFFSET}"
    if missing:
        raise LaunchError(
            f"tpu_dist: {', '.join(missing)} not set, and the process group's store is not a "
            "TCPStore to take the address from. Launch with `torchrun --nproc_per_node=N "
            "script.py` (it sets MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE), or set them "
            "yourself before torch.distributed.init_process_group('tpu_dist')"
        )
    port_text = os.environ["MASTER_PORT"]
    try:
        port = int(port_text)
    except ValueError:
        raise LaunchError(f"tpu_dist: MASTER_PORT={port_text!r} is not a port number") from None
    if not 0 < port + COORDINATOR_PORT_OFFSET < 65536:
        raise LaunchError(f"tpu_dist: MASTER_PORT={port} leaves no room for the coordination port {port + 1}")
    return f"{os.environ['MASTER_ADDR']}:{port + COORDINATOR_PORT_OFFSET}"


def start_runtime(rank: int, world_size: int, timeout: datetime.timedelta | float | None, store=None):
    """Joins (or returns) this process's multi-process runtime."""
    from torch_tpu.runtime import distributed

    env_world = os.environ.get("WORLD_SIZE")
    if env_world is not None and env_world.isdigit() and int(env_world) != world_size:
        raise LaunchError(
            f"tpu_dist: WORLD_SIZE={env_world} but the process group has {world_size} ranks; "
            "launch every rank with the same world size"
        )
    seconds = timeout.total_seconds() if isinstance(timeout, datetime.timedelta) else float(timeout or 300)
    local = os.environ.get("LOCAL_RANK", "")
    return distributed.initialize(rank, world_size, coordinator_address(store), timeout_s=seconds,
                                  local_device=int(local) if local.isdigit() else None)
