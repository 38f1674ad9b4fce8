"""Bounds on what a connection to the collector's gRPC ports may hold, whoever opens it.

A connection costs a file descriptor before anyone is authenticated, so without bounds a few
hundred TCP connections that never speak (no TLS hello, no HTTP/2 preface) would hold every
descriptor: agents could not connect, /metrics and the store could not open a file. Here each
connection has a deadline to finish its handshake, one that no call uses is closed, the
connections together stay below the open-file limit (with room kept for the rest of the
collector), and a stream must say its Hello soon after it opens (ingest_service.HELLO_TIMEOUT_S).
"""
from __future__ import annotations

import resource

# A TLS handshake takes milliseconds even on a loaded collector; one not done by then never will be.
HANDSHAKE_TIMEOUT_MS = 10_000
# A connection no call has used for this long is closed (agents hold a stream; `status` is brief).
IDLE_TIMEOUT_MS = 30_000
# Server pings to find agents that vanished without closing (a node powered off).
KEEPALIVE_MS = 60_000
KEEPALIVE_TIMEOUT_MS = 20_000
# An agent needs one stream a connection, the CLI a few calls at most.
MAX_STREAMS_PER_CONNECTION = 32
# Descriptors kept for everything but gRPC connections: the store, /metrics and its scrapes,
# scontrol, unmunge and ssh children, logs.
FD_RESERVE = 128
# The soft open-file limit is raised to the hard one up to this (children inherit it, and some
# programs close every descriptor up to their limit when they start).
FD_SOFT_CEILING = 65_536
MIN_CONNECTIONS = 16


def raise_open_file_limit() -> int:
    """Raise the soft RLIMIT_NOFILE towards the hard limit (as Go programs do); returns the soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = min(hard if hard != resource.RLIM_INFINITY else FD_SOFT_CEILING, FD_SOFT_CEILING)
    if target > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    return soft


def connection_caps(fd_limit: int, query_port: bool) -> tuple[int, int]:
    """(main port, query port) connection limits that leave FD_RESERVE descriptors free.

    The query-only port (login nodes' `status`) gets a quarter when there is one, so a flood there
    cannot take the agents' connections.
    """
    budget = max(2 * MIN_CONNECTIONS, fd_limit - FD_RESERVE)
    if not query_port:
        return budget, 0
    query = max(MIN_CONNECTIONS, budget // 4)
    return max(MIN_CONNECTIONS, budget - query), query


def server_options(max_connections: int) -> list[tuple[str, int]]:
    """The grpc server arguments that bound each connection and their number."""
    return [
        ("grpc.server_handshake_timeout_ms", HANDSHAKE_TIMEOUT_MS),
        ("grpc.max_connection_idle_ms", IDLE_TIMEOUT_MS),
        ("grpc.keepalive_time_ms", KEEPALIVE_MS),
        ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
        ("grpc.max_concurrent_streams", MAX_STREAMS_PER_CONNECTION),
        ("grpc.max_allowed_incoming_connections", max_connections),
    ]
