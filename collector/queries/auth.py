"""Who is asking: munge credentials on the query service, as Slurm's own commands prove a uid.

The CLI on a login node runs `munge -s clusterwatch-query-v1` and sends the credential as
gRPC metadata; the collector decodes it with `unmunge` (the same munged key every Slurm node
shares), which yields the caller's uid. Users then see only their own jobs, as with Slurm's
PrivateData=jobs, unless the collector is told to show every job; root and the configured
admins always see everything.

The payload is the sender's to choose, so it never reaches the parser of unmunge's metadata:
unmunge writes it to a file of its own (`--output`), and a credential is taken only when its
payload is the CLI's fixed one (a credential made for anything else, Slurm's included, is not a
query's). Were unmunge's whole output read, a payload of "x\nUID: root (0)" would make anyone root.

Where munge is installed but does not work yet (munged not started, or started after the
collector), `--query-auth auto` refuses queries and tries munge again (AwaitingMunge): it never
falls back to showing every job to everyone.
"""
from __future__ import annotations

import asyncio
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from clusterwatch.errors import ConfigError

from ..serving.bounded_exec import DEVNULL, run_bounded

METADATA_KEY = "x-clusterwatch-munge"
UNMUNGE_TIMEOUT_S = 5.0
# What the CLI puts in its credential (cli/common.py sends the same): nothing else is a query's.
QUERY_PAYLOAD = b"clusterwatch-query-v1"
# A query's credential with that payload is ~150 characters; gRPC's own metadata limit is 8 KiB.
MAX_CREDENTIAL_CHARS = 4096
# The metadata unmunge is asked for: nothing the sender chooses is among them.
UNMUNGE_KEYS = "STATUS,UID"
# While munge does not work, a query tries it again at most this often (two short children each time).
MUNGE_RETRY_S = 5.0

log = logging.getLogger("clusterwatch.collector")


@dataclass(frozen=True, slots=True)
class Caller:
    """An identified (or, without authentication, anonymous) caller.

    `admin` sees every job (an operator, or every user under --show-all-jobs); `operator` (root, a
    --query-admin) also acts on every job: seeing is not acting (collector/queries/action_rights.py).
    """

    uid: int | None
    user: str
    admin: bool
    operator: bool = False

    def may_see(self, job_user: str) -> bool:
        return self.admin or (bool(self.user) and self.user == job_user)

    def may_act(self, job_user: str) -> bool:
        return self.operator or (bool(self.user) and self.user == job_user)


class AuthError(Exception):
    """The caller could not be identified; the message says why and what to do."""


def parse_unmunge(text: str) -> tuple[int, str]:
    """(uid, user name) from `unmunge`'s metadata; raises AuthError unless STATUS is Success.

    Only the metadata block is read (it ends at the first empty line, where unmunge would start the
    payload), and a key given twice is refused: neither can come from munged, only from a payload.
    """
    fields = unmunge_fields(text)
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


def unmunge_fields(text: str) -> dict[str, str]:
    """`unmunge`'s metadata block as {KEY: value}; AuthError for a line that is not metadata or a key twice."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            break
        key, sep, value = line.partition(":")
        if not sep:
            raise AuthError(f"unmunge printed a line that is not metadata: {line[:60]!r}")
        key = key.strip().upper()
        if key in fields:
            raise AuthError(f"unmunge's metadata gives {key} twice; the credential is refused")
        fields[key] = value.strip()
    return fields


def check_payload(payload: bytes, expected: bytes = QUERY_PAYLOAD) -> None:
    """Raises AuthError unless `payload` is `expected`: what the clusterwatch CLI puts in a query's credential,
    or (collector/ingest/agent_auth.py) an agent in its stream's."""
    if payload != expected:
        what = "a clusterwatch query" if expected == QUERY_PAYLOAD else "a clusterwatch agent"
        raise AuthError(f"the munge credential was not made for {what} (its payload is not "
                        f"{expected.decode()!r}): use clusterwatch of this version")


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
        if len(cred) > MAX_CREDENTIAL_CHARS:
            raise AuthError(f"the munge credential is {len(cred)} characters; a query's is far shorter")
        uid, user = await self._unmunge(cred)
        operator = uid == 0 or user in self.admins or str(uid) in self.admins
        return Caller(uid, user, operator or self.show_all, operator)

    async def _unmunge(self, cred: str) -> tuple[int, str]:
        """Decode `cred` with unmunge: (uid, user name) when its payload is a query's."""
        return parse_unmunge(await decode_credential(cred, QUERY_PAYLOAD, self.socket, self.unmunge))


async def decode_credential(cred: str, payload: bytes, socket: str | None, unmunge: str = "unmunge",
                            keys: str = UNMUNGE_KEYS) -> str:
    """unmunge's metadata text for `cred` (asked for `keys`) when its payload is exactly `payload`.

    The metadata comes on stdout, the payload in a private file, so the sender's text never reaches
    the metadata's parser (parse_unmunge). AuthError when unmunge refuses it or cannot run.
    """
    fd, payload_path = tempfile.mkstemp(prefix="cw-unmunge-")  # mode 0600, only ours
    os.close(fd)
    args = [unmunge, f"--output={payload_path}", f"--keys={keys}"]
    if socket:
        args.append(f"--socket={socket}")
    try:
        try:
            code, out, err = await run_bounded(args, UNMUNGE_TIMEOUT_S, input=cred.encode())
        except OSError as exc:
            raise AuthError(f"the collector cannot run {unmunge}: {exc.strerror}") from None
        except asyncio.TimeoutError:
            raise AuthError("munged on the collector did not answer in time") from None
        if code != 0:
            reason = err.decode(errors="replace").strip() or "unmunge failed"
            raise AuthError(f"munge credential refused: {reason}")
        with open(payload_path, "rb") as f:
            check_payload(f.read(len(payload) + 1), payload)
        return out.decode(errors="replace")
    finally:
        os.unlink(payload_path)


class AwaitingMunge:
    """Munge is installed here but does not work yet: refuse every query, and try munge again.

    A query tries munge again when MUNGE_RETRY_S have passed since the last try; once munge works
    (munged came up), callers are identified by `munge` from then on. Nobody is ever let in
    unidentified: a collector that started before munged would otherwise show every job to everyone.

    Args:
        munge: the authentication to hand over to once munge works.
        works: whether munge works now (munge_works on the collector's socket).
        retry_s: the shortest time between two tries.
        clock: monotonic seconds.
    """

    name = "munge"

    def __init__(self, munge: MungeAuth, works: Callable[[], Awaitable[bool]], retry_s: float = MUNGE_RETRY_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.munge = munge
        self.works = works
        self.retry_s = retry_s
        self.clock = clock
        self.ready = False
        self._next_try = clock() + retry_s  # the start-up check just failed
        self._lock = asyncio.Lock()  # one try at a time, however many queries wait

    async def caller(self, metadata) -> Caller:
        if not self.ready:
            async with self._lock:
                if not self.ready and self.clock() >= self._next_try:
                    self.ready = await self.works()
                    self._next_try = self.clock() + self.retry_s
                    if self.ready:
                        log.info("munge works on this host now: queries are identified by munge from here on")
        if not self.ready:
            raise AuthError("this collector identifies callers with munge, and munge does not work on its host "
                            "(munged not running?): queries are refused until it does; its operator should "
                            "start munged")
        return await self.munge.caller(metadata)


def munge_installed() -> bool:
    """Whether munge and unmunge are on PATH (whether munged answers is munge_works's question)."""
    return bool(shutil.which("munge") and shutil.which("unmunge"))


async def munge_works(socket: str | None = None) -> bool:
    """Whether this host can encode and decode a munge credential (munged up, binaries present)."""
    if not munge_installed():
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



async def auth_from_config(mode: str, admins: frozenset[str], show_all_jobs: bool, munge_socket: str | None,
                           listen: str):
    """The query service's authentication for --query-auth `mode` (auto: munge where it is installed).

    ConfigError when munge is required and does not work. `listen` names the address in the warnings.
    """
    if mode == "none":
        return NoAuth()
    munge = MungeAuth(admins, show_all_jobs, munge_socket)
    if await munge_works(munge_socket):
        return munge
    if mode == "munge":
        raise ConfigError("--query-auth munge, but munge does not work on this host (munge/unmunge "
                          "missing or munged not running); start munged or pass --query-auth none")
    if munge_installed():
        # installed but not answering: munged is down or not up yet. Never open every job to everyone
        # meanwhile; a query tries again, and munged coming up is picked up.
        log.warning("munge is installed but does not work on this host (munged not running?): queries are "
                    "refused until it does, tried again every %.0f s; start munged, or pass --query-auth "
                    "none to show every job to anyone who reaches %s", MUNGE_RETRY_S, listen)
        return AwaitingMunge(munge, lambda: munge_works(munge_socket))
    log.warning("queries are not authenticated (munge is not installed on this host): anyone who reaches "
                "%s sees every job; install and run munged, or keep the collector on loopback", listen)
    return NoAuth()
