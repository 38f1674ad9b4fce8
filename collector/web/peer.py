"""Which local user opened a loopback TCP connection: the kernel's socket table (/proc/net/tcp, tcp6) says.

A page on loopback is reachable by every user of the host, while `clusterwatch run`'s collector is meant to
be its user's alone (its gRPC socket sits in a folder only they may enter). A browser proves nothing, but a
loopback connection's other end is a socket on this host, and the kernel lists it with its owner's uid:
the row whose local end is the connection's client address and whose remote end is the server's. Another
user's process cannot make a socket that is listed as ours (only root can act as us). The table is read
per request (a few hundred rows on a login node); parsing is pure (find_uid) and tested on real rows.
"""
from __future__ import annotations

import ipaddress
import struct

TABLES = ("/proc/self/net/tcp", "/proc/self/net/tcp6")
PEER_KEY = "clusterwatch.peer"  # the WSGI environ's (client, server) addresses (server.py)
ESTABLISHED = "01"


def _address(hex_text: str) -> tuple[str, int]:
    """("127.0.0.1", 5000) of "0100007F:1388": the address in the kernel's words of host byte order."""
    addr, _, port = hex_text.partition(":")
    words = [int(addr[i:i + 8], 16) for i in range(0, len(addr), 8)]
    packed = struct.pack(f"={len(words)}I", *words)
    ip = ipaddress.ip_address(packed)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return str(ip), int(port, 16)


def _normal(host: str) -> str:
    ip = ipaddress.ip_address(host.split("%")[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return str(ip)


def find_uid(table: str, client: tuple[str, int], server: tuple[str, int]) -> int | None:
    """The uid of the established socket in `table` (a /proc/net/tcp text) from `client` to `server`."""
    want = ((_normal(client[0]), client[1]), (_normal(server[0]), server[1]))
    for line in table.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 8 or fields[3] != ESTABLISHED:
            continue
        try:
            if (_address(fields[1]), _address(fields[2])) == want:
                return int(fields[7])
        except ValueError:
            continue
    return None


def peer_uid(client: tuple[str, int], server: tuple[str, int], tables=TABLES) -> int | None:
    """The uid of the local process's socket at the client end of a loopback connection; None when the
    tables do not list it (not a local peer) or cannot be read."""
    for path in tables:
        try:
            with open(path) as f:
                uid = find_uid(f.read(), client, server)
        except (OSError, ValueError):
            continue
        if uid is not None:
            return uid
    return None
