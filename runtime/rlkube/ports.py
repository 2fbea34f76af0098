"""Local ports for servers a process starts for itself (a rendezvous, a local run's
services, a benchmark's weight server)."""

import socket


def free_port() -> int:
    """A port the kernel just handed out and no one holds. Asking the kernel rather than
    picking a number matters: a fixed port in the ephemeral range (32768-60999 on Linux) can be
    held at any moment by some connection's local end, and the bind then fails."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
