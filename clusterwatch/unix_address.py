"""gRPC's `unix:PATH` addresses (a Unix socket), read the same way by the CLI, the agent and the collector."""
from __future__ import annotations

UNIX_PREFIX = "unix:"
UNIX_PATH_MAX = 108  # sun_path on Linux, the NUL included


def unix_path(address: str) -> str | None:
    """The socket path of a `unix:PATH` address (as gRPC reads it: `unix:///abs` too), else None."""
    address = address.strip()
    if not address.startswith(UNIX_PREFIX):
        return None
    path = address[len(UNIX_PREFIX):]
    return "/" + path.lstrip("/") if path.startswith("//") else path
