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


collector_option = click.option(
    "--collector", envvar="CLUSTERWATCH_COLLECTOR", default=DEFAULT_COLLECTOR, show_default=True,
    metavar="HOST:PORT", help="Collector address (CLUSTERWATCH_COLLECTOR, or [cli] collector in the config file).",
)


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
