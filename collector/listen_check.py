"""Is a listen address free? Asked before gRPC binds it, so a taken port is one clear line.

gRPC sets SO_REUSEPORT by default, which let a second collector bind the first one's port and
take half its agents (the kernel spreads connections between the two); the servers now bind
with grpc.so_reuseport 0, and this check turns "address in use" into a sentence instead of
gRPC's RuntimeError and its C-core log line.
"""
from __future__ import annotations

import errno
import socket


def split_listen(listen: str) -> tuple[str, int]:
    """HOST:PORT (IPv6 in brackets) → (host, port); raises ValueError for anything else."""
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"{listen!r} is not HOST:PORT")
    return host.strip("[]"), int(port)


def taken_error(listen: str, flag: str) -> str | None:
    """Why `listen` cannot be bound (in use, not an address of this host), or None when it can.

    Port 0 (any free port) is always free. `flag` names the option, for the message.
    """
    try:
        host, port = split_listen(listen)
    except ValueError as exc:
        return f"{flag} {exc}"
    if port == 0:
        return None
    try:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        return f"{flag} {listen}: {exc.strerror}"
    for family, kind, proto, _, address in infos:
        with socket.socket(family, kind, proto) as s:
            # as gRPC binds (SO_REUSEADDR, no SO_REUSEPORT): a port in TIME_WAIT is free, a listening one is not
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(address)
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    return (f"cannot listen on {listen}: the port is in use (another collector?); stop it or "
                            f"give another {flag}")
                return f"cannot listen on {listen} ({flag}): {exc.strerror}"
    return None
