"""Is a listen address free? Asked before gRPC binds it, so a taken port is one clear line.

With SO_REUSEPORT (gRPC's default) a second collector could bind a running one's port and take
half its agents, the kernel spreading connections between the two; the servers bind with
grpc.so_reuseport 0, and this check turns "address in use" into a sentence instead of gRPC's
RuntimeError and its C-core log line. A Unix socket (`unix:PATH`) is in use when something
answers on it; a socket file nobody answers on (a collector that was killed) is removed.
"""
from __future__ import annotations

import errno
import os
import socket
import stat

from clusterwatch.errors import ConfigError
from clusterwatch.unix_address import unix_path


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
    path = unix_path(listen)
    if path is not None:
        return _unix_taken_error(listen, path, flag)
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


def _unix_taken_error(listen: str, path: str, flag: str) -> str | None:
    """Why the Unix socket `path` cannot be listened on, or None (a stale socket file is removed)."""
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        return f"cannot listen on {listen} ({flag}): the folder {folder} does not exist"
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"cannot listen on {listen} ({flag}): {exc.strerror}"
    if not stat.S_ISSOCK(mode):
        return f"cannot listen on {listen} ({flag}): {path} exists and is not a socket; give another path"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        try:
            s.connect(path)
        except (ConnectionRefusedError, FileNotFoundError):
            pass  # nobody listens: left behind by a collector that did not stop
        except OSError as exc:
            return f"cannot listen on {listen} ({flag}): {exc.strerror}"
        else:
            return (f"cannot listen on {listen}: another process (a collector?) answers on it; stop it or "
                    f"give another {flag}")
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        return f"cannot listen on {listen} ({flag}): the stale socket {path} cannot be removed: {exc.strerror}"
    return None


# SO_REUSEPORT (gRPC's default) would let a second collector bind a running one's port: one collector a port.
NO_REUSEPORT = ("grpc.so_reuseport", 0)


def bind(server, listen: str, flag: str, creds=None) -> int:
    """Add the port `listen` to a grpc server; the port bound (1 for a Unix socket), or ConfigError in one line."""
    try:
        port = server.add_insecure_port(listen) if creds is None else server.add_secure_port(listen, creds)
    except RuntimeError:  # taken in between, or an address gRPC cannot use
        port = 0
    if not port:
        raise ConfigError(f"cannot listen on {listen} ({flag}); is another collector using the port?")
    return port
