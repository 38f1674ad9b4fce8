"""Addresses as users type them (--listen, --metrics-listen, --collector): checked, one line each.

gRPC takes almost anything and does something else with it: `127.0.0.1` alone dials port 443,
`127.0.0.1:99999` listens on a random port, and a name that does not resolve reads as "does not answer".
Besides HOST:PORT, gRPC's `unix:PATH` (a Unix socket: only users who may enter its folder reach it)
is taken for --listen and --collector; /metrics is plain HTTP on TCP only.
"""
from __future__ import annotations

import os
import socket

import click

from clusterwatch.unix_address import UNIX_PATH_MAX, unix_path


class AddressError(ValueError):
    """What is wrong with an address, in words a user can act on."""


def check_unix_path(text: str, path: str) -> None:
    """AddressError when `path` cannot be a Unix socket's: empty, too long, or its folder missing."""
    if not path:
        raise AddressError(f"{text!r} has no path: give unix:/PATH/TO/SOCKET")
    if len(os.fsencode(path)) >= UNIX_PATH_MAX:
        raise AddressError(f"{text!r}: a Unix socket's path has at most {UNIX_PATH_MAX - 1} bytes; "
                           "use a shorter one")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise AddressError(f"{text!r}: the folder {folder} does not exist; make it (mode 0700 to keep "
                           "the socket to yourself) or give another path")


def check_collector_address(text: str) -> None:
    """AddressError for a --collector gRPC would misread: HOST:PORT (no port 0) or unix:PATH."""
    path = unix_path(text)
    if path is not None:
        if not path:
            raise AddressError(f"{text!r} has no path: give unix:/PATH/TO/SOCKET")
        return
    split_host_port(text)


def split_host_port(text: str, port_zero: bool = False) -> tuple[str, int]:
    """(host, port) of `HOST:PORT` or `[IPv6]:PORT`; AddressError says what is wrong.

    Args:
        text: the address as typed.
        port_zero: whether port 0 (any free port, for tests and the embedded stack) is allowed.
    """
    text = text.strip()
    if text.startswith("["):
        host, sep, rest = text[1:].partition("]")
        if not sep or not rest.startswith(":"):
            raise AddressError(f"{text!r} is not [IPv6]:PORT")
        port_text = rest[1:]
    else:
        host, sep, port_text = text.rpartition(":")
        if not sep:
            raise AddressError(f"{text!r} has no port: give HOST:PORT")
        if ":" in host:
            raise AddressError(f"{text!r}: write an IPv6 address in brackets, [ADDRESS]:PORT")
    if not host:
        raise AddressError(f"{text!r} has no host: give HOST:PORT")
    if not port_text.isdigit():
        raise AddressError(f"{text!r}: the port {port_text!r} is not a number")
    port = int(port_text)
    low = 0 if port_zero else 1
    if not low <= port <= 65535:
        raise AddressError(f"{text!r}: the port {port} is out of range ({low}-65535"
                           + (", 0 for any free port)" if port_zero else ")"))
    return host, port


def check_resolves(host: str, port: int, passive: bool = False) -> None:
    """AddressError when `host` does not resolve (a typo, DNS down)."""
    try:
        socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE if passive else 0)
    except (socket.gaierror, UnicodeError) as exc:
        raise AddressError(f"cannot resolve the host {host!r}: {getattr(exc, 'strerror', None) or exc}") from None


def listen_option_callback(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """For the collector's gRPC listen options: a bad address is a usage error, before anything starts.

    None, and "none" where an option allows it (--metrics-listen none), pass through; `unix:PATH` is
    taken where its folder exists.
    """
    if value is None or value == "none":
        return value
    path = unix_path(value)
    try:
        if path is not None:
            check_unix_path(value, path)
            return value
        host, port = split_host_port(value, port_zero=True)
        check_resolves(host, port, passive=True)
    except AddressError as exc:
        raise click.BadParameter(str(exc)) from None
    return value


def tcp_listen_option_callback(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """For --metrics-listen: HOST:PORT only (plain HTTP; Prometheus scrapes it over TCP)."""
    if value is not None and unix_path(value) is not None:
        raise click.BadParameter(f"{value!r}: /metrics is served on TCP only; give HOST:PORT or 'none'")
    return listen_option_callback(ctx, param, value)
