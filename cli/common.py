"""Helpers every command shares: one-line errors, logging, the collector address, a quick exit."""
from __future__ import annotations

import os
import sys
from typing import NoReturn

import click

DEFAULT_COLLECTOR = "127.0.0.1:50051"
MUNGE_TIMEOUT_S = 5.0
# The payload of a query's munge credential; the collector takes no other (collector/queries/auth.py
# QUERY_PAYLOAD), so a credential made for something else is not a query's.
MUNGE_PAYLOAD = "clusterwatch-query-v1"


def fail(message: str, code: int = 2) -> NoReturn:
    """Print one line that says what is wrong and what to do, and exit."""
    click.echo(f"clusterwatch: {message}", err=True)
    sys.exit(code)


def setup_logging(verbose: int) -> None:
    # imported here: the quick commands (status, jobs) never log, and importing logging is a measurable
    # share of their start (bench/bench_cli.py)
    import logging

    level = logging.DEBUG if verbose > 1 else logging.INFO if verbose == 1 else logging.WARNING
    logging.basicConfig(level=level, format="%(asctime)s %(name)s %(levelname)s %(message)s", stream=sys.stderr)
    if verbose == 0:
        # the agent and collector say what they are doing at INFO; keep that, not library chatter
        logging.getLogger("clusterwatch").setLevel(logging.INFO)


# Set by a command whose process holds nothing that needs Python's orderly teardown (a query
# command: its channel is closed and its output flushed); main() then leaves with os._exit.
quick_exit = False


def exit_quickly_when_done() -> None:
    """Let the console script skip the interpreter's teardown after this command.

    Once grpc is loaded that teardown (module and gRPC core shutdown) is a large share of a query
    command's time (bench/bench_cli.py); only main() acts on it, so in-process callers (CliRunner) are
    unaffected.
    """
    global quick_exit
    quick_exit = True


def token_file_option(f):
    """--token-file PATH (CLUSTERWATCH_TOKEN_FILE, token_file in the config file) beside --token; the command
    takes `token_file` and passes it with `token` to resolve_token()."""
    return click.option("--token-file", envvar="CLUSTERWATCH_TOKEN_FILE", default=None, metavar="PATH",
                        help="Read the agents' shared token from this file (mode 0600, root's or this user's), "
                             "not from --token or the world-readable config file (CLUSTERWATCH_TOKEN_FILE).")(f)


def resolve_token(token: str | None, token_file: str | None) -> str | None:
    """The token of --token or --token-file; one line and exit 2 when both are given or the file is unfit."""
    if not token_file:
        return token or None
    if token:
        fail("the token is given twice: --token (CLUSTERWATCH_TOKEN, token) and --token-file "
             "(CLUSTERWATCH_TOKEN_FILE, token_file); keep the token file")
    from clusterwatch.config import read_token_file
    from clusterwatch.errors import ConfigError

    try:
        return read_token_file(token_file)
    except ConfigError as exc:
        fail(str(exc))


def collector_option(f):
    """--collector HOST:PORT[,HOST:PORT...], --collectors-before and --tls-ca for the query commands.

    The command takes `collector`, `collectors_before` and `tls_ca`; deployment() makes the first two the
    collectors list (clusterwatch/shards.py), query_channel takes an address and `tls_ca`.
    """
    # an operator's setting, from the config file: hidden from the users' --help
    f = click.option("--collectors-before", "collectors_before", envvar="CLUSTERWATCH_COLLECTORS_BEFORE",
                     default="", metavar="JOB=HOST:PORT,...", hidden=True,
                     help="After a change of the collectors list: the first job number of the current list, "
                          "and the list the older jobs still run on ([cli] or top-level collectors_before).")(f)
    f = click.option("--tls-ca", "tls_ca", envvar="CLUSTERWATCH_TLS_CA", type=click.Path(exists=True, dir_okay=False),
                     help="Talk TLS to the collector, trusting this CA (its --query-listen port, or its main "
                          "port when that does not require client certificates).")(f)
    return click.option(
        "--collector", envvar="CLUSTERWATCH_COLLECTOR", default=DEFAULT_COLLECTOR, show_default=True,
        metavar="HOST:PORT[,...]",
        help="Collector address; several, comma-separated, in the deployment's one order, when jobs are "
             "sharded over collectors (CLUSTERWATCH_COLLECTOR, or collectors = [...] in the config file).",
    )(f)


def deployment(collector: str, collectors_before: str = ""):
    """The collectors list of --collector / --collectors-before (shards.Collectors); one line and exit 2 if bad."""
    from clusterwatch.shards import Collectors, ShardError

    from .addresses import AddressError, check_collector_address

    try:
        found = Collectors.parse(collector, collectors_before or None)
    except ShardError as exc:
        fail(str(exc))
    for address in found.all:
        try:
            check_collector_address(address)
        except AddressError as exc:
            from .option_source import given_as

            said = given_as(click.get_current_context(silent=True), "collector")
            fail(f"{said} {exc} (the collector's --listen port, 50051 by default)")
    return found


def query_channel(address: str, tls_ca: str | None = None):
    """A channel to the collector's query service: TLS trusting `tls_ca` when given (--tls-ca)."""
    import grpc

    from clusterwatch.tls import channel_credentials

    creds = channel_credentials(tls_ca)
    return grpc.insecure_channel(address) if creds is None else grpc.secure_channel(address, creds)


class MungeCredential:
    """A munge credential for the collector (it proves our uid), made by `munge` in the background.

    The subprocess starts when this is built and is read by metadata(), so a command can start it
    before its slow imports (grpc, protobuf) and find it done when the request goes out. Without
    munge the request goes unauthenticated; a collector that requires munge then says so in one line.
    A credential is for one request: munged refuses a replayed one.
    """

    def __init__(self) -> None:
        # subprocess, not shutil.which: grpc imports subprocess anyway, shutil would be one more import
        import subprocess

        args = ["munge", "-s", MUNGE_PAYLOAD]
        socket = os.environ.get("CLUSTERWATCH_MUNGE_SOCKET")
        if socket:
            args.append(f"--socket={socket}")
        try:
            self._proc: subprocess.Popen | None = subprocess.Popen(
                args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        except OSError:  # no munge here
            self._proc = None

    def metadata(self) -> list[tuple[str, str]] | None:
        """The gRPC metadata that carries the credential, or None when munge gave none."""
        import subprocess

        proc, self._proc = self._proc, None
        if proc is None:
            return None
        try:
            out, _ = proc.communicate(timeout=MUNGE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            return None
        text = out.decode().strip()
        return [("x-clusterwatch-munge", text)] if proc.returncode == 0 and text else None


def query_metadata() -> list[tuple[str, str]] | None:
    """A fresh munge credential for the collector, when munge works here (see MungeCredential)."""
    return MungeCredential().metadata()
