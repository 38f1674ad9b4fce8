"""HOST:PORT addresses as users type them (--listen, --metrics-listen, --collector): checked, one line each.

gRPC takes almost anything and does something else with it: `127.0.0.1` alone dials port 443,
`127.0.0.1:99999` listens on a random port, and a name that does not resolve reads as "does not answer".
"""
from __future__ import annotations

import socket

import click


class AddressError(ValueError):
    """What is wrong with an address, in words a user can act on."""


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
    """For the collector's listen options: a bad address is a usage error, before anything starts.

    None, and "none" where an option allows it (--metrics-listen none), pass through.
    """
    if value is None or value == "none":
        return value
    try:
        host, port = split_host_port(value, port_zero=True)
        check_resolves(host, port, passive=True)
    except AddressError as exc:
        raise click.BadParameter(str(exc)) from None
    return value
