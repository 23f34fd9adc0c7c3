"""Free local ports for the tests that launch multi-process jobs (importable from every
suite: test/python is on sys.path through its conftest.py)."""

from __future__ import annotations

import socket


def free_port_pair() -> int:
    """A port P with P and P + 1 free (torch's TCPStore, then the coordination service)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port >= 65535:
            continue
        try:
            with socket.socket() as s:
                s.bind(("127.0.0.1", port + 1))
            return port
        except OSError:
            continue
    raise RuntimeError("no free pair of ports")
