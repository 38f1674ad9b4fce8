"""Helpers every command shares: one-line errors, logging, the collector address."""
from __future__ import annotations

import logging
import sys
from typing import NoReturn

import click

DEFAULT_COLLECTOR = "127.0.0.1:50051"


def fail(message: str, code: int = 2) -> NoReturn:
    """Print one line that says what is wrong and what to do, and exit."""
    click.echo(f"clusterwatch: {message}", err=True)
    sys.exit(code)


def setup_logging(verbose: int) -> None:
    level = logging.DEBUG if verbose > 1 else logging.INFO if verbose == 1 else logging.WARNING
    logging.basicConfig(level=level, format="%(asctime)s %(name)s %(levelname)s %(message)s", stream=sys.stderr)
    if verbose == 0:
        # the agent and collector say what they are doing at INFO; keep that, not library chatter
        logging.getLogger("clusterwatch").setLevel(logging.INFO)


def _remember_tls_ca(ctx: click.Context, param, value: str | None) -> None:
    # the query channel is opened in helpers that take only an address; they read it from here
    if value:
        import os

        os.environ["CLUSTERWATCH_TLS_CA"] = value


def collector_option(f):
    """--collector HOST:PORT and --tls-ca for the commands that query the collector."""
    f = click.option("--tls-ca", envvar="CLUSTERWATCH_TLS_CA", type=click.Path(exists=True, dir_okay=False),
                     expose_value=False, callback=_remember_tls_ca, is_eager=True,
                     help="Talk TLS to the collector, trusting this CA (its --query-listen port, or its main "
                          "port when that does not require client certificates).")(f)
    return click.option(
        "--collector", envvar="CLUSTERWATCH_COLLECTOR", default=DEFAULT_COLLECTOR, show_default=True,
        metavar="HOST:PORT", help="Collector address (CLUSTERWATCH_COLLECTOR, or [cli] collector in the config file).",
    )(f)


def query_channel(address: str):
    """A channel to the collector's query service: TLS when a CA is given (--tls-ca, CLUSTERWATCH_TLS_CA)."""
    import os

    import grpc

    ca = os.environ.get("CLUSTERWATCH_TLS_CA")
    if not ca:
        return grpc.insecure_channel(address)
    with open(ca, "rb") as f:
        return grpc.secure_channel(address, grpc.ssl_channel_credentials(root_certificates=f.read()))


def query_metadata() -> list[tuple[str, str]] | None:
    """A fresh munge credential for the collector, when munge works here (it proves our uid).

    Without munge the request goes unauthenticated; a collector that requires munge then
    says so in one line.
    """
    import os
    import shutil
    import subprocess

    if not shutil.which("munge"):
        return None
    args = ["munge", "-n"]
    socket = os.environ.get("CLUSTERWATCH_MUNGE_SOCKET")
    if socket:
        args.append(f"--socket={socket}")
    try:
        out = subprocess.run(args, capture_output=True, timeout=5, check=True).stdout.decode().strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return [("x-clusterwatch-munge", out)] if out else None
