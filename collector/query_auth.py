"""Who is asking: munge credentials on the query service, as Slurm's own commands prove a uid.

The CLI on a login node runs `munge -n` and sends the credential as gRPC metadata;
the collector decodes it with `unmunge` (the same munged key every Slurm node shares),
which yields the caller's uid. Users then see only their own jobs, as with Slurm's
PrivateData=jobs, unless the collector is told to show every job; root and the
configured admins always see everything.
"""
from __future__ import annotations

import asyncio
import shutil
from dataclasses import dataclass

from .bounded_exec import DEVNULL, run_bounded

METADATA_KEY = "x-clusterwatch-munge"
UNMUNGE_TIMEOUT_S = 5.0


@dataclass(frozen=True, slots=True)
class Caller:
    """An identified (or, without authentication, anonymous) caller."""

    uid: int | None
    user: str
    admin: bool

    def may_see(self, job_user: str) -> bool:
        return self.admin or (bool(self.user) and self.user == job_user)


class AuthError(Exception):
    """The caller could not be identified; the message says why and what to do."""


def parse_unmunge(text: str) -> tuple[int, str]:
    """(uid, user name) from `unmunge` output; raises AuthError unless STATUS is Success."""
    fields = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields[key.strip().upper()] = value.strip()
    status = fields.get("STATUS", "")
    if not status.startswith("Success"):
        raise AuthError(f"munge credential refused: {status or 'no status'}")
    uid_text = fields.get("UID", "")
    # "alice (1000)"
    try:
        name, _, rest = uid_text.partition("(")
        uid = int(rest.rstrip(")"))
    except ValueError:
        raise AuthError(f"munge credential without a uid: {uid_text!r}") from None
    return uid, name.strip()


class NoAuth:
    """Queries are not authenticated: everyone sees every job (a single-user machine, `run`, `demo`)."""

    name = "none"

    async def caller(self, metadata) -> Caller:
        return Caller(None, "", admin=True)


class MungeAuth:
    """Identify callers by munge credential.

    Args:
        admins: user names (or uids as text) that see every job; root always does.
        show_all: every identified user sees every job (PrivateData off).
        socket: munged's socket, when not the default.
        unmunge: the unmunge binary.
    """

    name = "munge"

    def __init__(self, admins: frozenset[str] = frozenset(), show_all: bool = False, socket: str | None = None,
                 unmunge: str = "unmunge") -> None:
        self.admins = admins
        self.show_all = show_all
        self.socket = socket
        self.unmunge = unmunge

    async def caller(self, metadata) -> Caller:
        cred = next((v for k, v in (metadata or ()) if k == METADATA_KEY), None)
        if not cred:
            raise AuthError("this collector shows jobs only to users it can identify, and the request carried no "
                            "munge credential: run clusterwatch where munge is installed and munged runs "
                            "(as on any Slurm node)")
        args = [self.unmunge] + ([f"--socket={self.socket}"] if self.socket else [])
        try:
            code, out, err = await run_bounded(args, UNMUNGE_TIMEOUT_S, input=cred.encode())
        except OSError as exc:
            raise AuthError(f"the collector cannot run {self.unmunge}: {exc.strerror}") from None
        except asyncio.TimeoutError:
            raise AuthError("munged on the collector did not answer in time") from None
        if code != 0:
            raise AuthError(f"munge credential refused: {err.decode(errors='replace').strip() or 'unmunge failed'}")
        uid, user = parse_unmunge(out.decode(errors="replace"))
        admin = uid == 0 or self.show_all or user in self.admins or str(uid) in self.admins
        return Caller(uid, user, admin)


async def munge_works(socket: str | None = None) -> bool:
    """Whether this host can encode and decode a munge credential (munged up, binaries present)."""
    if not (shutil.which("munge") and shutil.which("unmunge")):
        return False
    sock = [f"--socket={socket}"] if socket else []
    try:
        code, cred, _ = await run_bounded(["munge", "-n", *sock], UNMUNGE_TIMEOUT_S, stderr=DEVNULL)
        if code != 0:
            return False
        code, _, _ = await run_bounded(["unmunge", *sock], UNMUNGE_TIMEOUT_S, input=cred, stdout=DEVNULL,
                                       stderr=DEVNULL)
        return code == 0
    except (OSError, asyncio.TimeoutError):
        return False

