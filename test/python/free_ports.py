"""Free local ports for the tests that launch multi-process jobs (importable from every
suite: test/python is on sys.path through its conftest.py).

The ports come from below the kernel's ephemeral range: a port the kernel hands out by
itself (`bind(0)`, every outgoing connection's local port) is in that range, so a port
taken from it can be free when checked and taken seconds later by a connection of another
test's job, before our job's coordination service binds it (a CI failure: "MASTER_PORT + 1
is in use"). Below the range only explicit binds take ports: other tests of this run,
which draw from a band of their own (one per pytest-xdist worker)."""

from __future__ import annotations

import os
import random
import socket

_FALLBACK_EPHEMERAL_START = 32768  # Linux's default when /proc does not say
_LOWEST = 10000  # below it: well-known and registered services
_RANDOM = random.SystemRandom()  # not the global generator: tests seed that one


def _ephemeral_start() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return _FALLBACK_EPHEMERAL_START


def _band() -> range:
    """This test process's ports: [_LOWEST, ephemeral start) split between xdist workers."""
    top = max(_ephemeral_start(), _LOWEST + 2000)
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
    index = int(worker[2:]) if worker.startswith("gw") and worker[2:].isdigit() else 0
    width = (top - _LOWEST) // max(count, 1)
    start = _LOWEST + (index % max(count, 1)) * width
    return range(start, start + width - 1)  # P + 1 stays in the band


def _bindable(port: int) -> bool:
    try:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))
        return True
    except OSError:
        return False


def free_port_pair() -> int:
    """A port P with P and P + 1 free (torch's TCPStore, then the coordination service),
    outside the kernel's ephemeral range."""
    band = _band()
    for _ in range(200):
        port = _RANDOM.choice(band)
        if _bindable(port) and _bindable(port + 1):
            return port
    raise RuntimeError(f"no free pair of ports in {band.start}-{band.stop} after 200 tries")
