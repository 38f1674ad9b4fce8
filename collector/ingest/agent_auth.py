"""Who is sending: the agents' shared token, a munge credential of root on the agent's host, or under
mutual TLS the node each certificate names (--agent-auth).

The token proves only that a stream comes from someone who holds it (every node holds the same
one); it says nothing of which node. Under mutual TLS the certificate does: a stream may speak
only for a node its certificate names (its CN or one of its DNS names), so one node cannot
send another's samples or end its jobs. Under munge (every Slurm node runs munged, nothing to set
up) a stream proves it comes from root on some host, and a node name is bound to the host that
first proved it. Queries are not agents' business: the token is asked of the Ingest service only
(collector/queries/auth.py identifies the users who query).

Without any of them the collector still runs (a laptop, the demo), says so in one line at start, and
its agents' streams are unauthenticated: their samples own no job and no action reaches their processes.
"""
from __future__ import annotations

import asyncio
import hmac
import ipaddress
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass

import grpc

from clusterwatch.unix_address import unix_path

INGEST_METHOD_PREFIX = "/clusterwatch.v1.Ingest/"
TOKEN_REFUSED = "missing or wrong clusterwatch token"
# An agent's credential is ~150 characters; gRPC's own metadata limit is 8 KiB.
MAX_CREDENTIAL_CHARS = 4096

log = logging.getLogger("clusterwatch.collector")


def has_token(metadata: Iterable[tuple[str, str | bytes]] | None, token: str) -> bool:
    """Whether the metadata carries `authorization: Bearer <token>` (compared in constant time)."""
    expected = f"Bearer {token}"
    return any(key == "authorization" and isinstance(value, str) and hmac.compare_digest(value, expected)
               for key, value in metadata or ())


class TokenInterceptor(grpc.aio.ServerInterceptor):
    """Refuse an agent's stream without the shared token before any servicer sees it.

    Args:
        token: the shared secret.
        on_refused: called once for each refused stream (the collector counts it).
    """

    def __init__(self, token: str, on_refused: Callable[[], None]) -> None:
        self.token = token
        self.on_refused = on_refused
        self._refuse = grpc.stream_stream_rpc_method_handler(_abort_unauthenticated)

    async def intercept_service(self, continuation, handler_call_details):
        method = handler_call_details.method or ""
        if not method.startswith(INGEST_METHOD_PREFIX) or has_token(handler_call_details.invocation_metadata,
                                                                    self.token):
            return await continuation(handler_call_details)
        self.on_refused()
        return self._refuse


async def _abort_unauthenticated(request_iterator, context):
    await context.abort(grpc.StatusCode.UNAUTHENTICATED, TOKEN_REFUSED)
    yield  # an async generator, as a stream-stream handler is; never reached


def certificate_node_names(auth_context: Mapping[str, list[bytes]]) -> frozenset[str] | None:
    """The node names a client certificate vouches for (its CN and DNS names), lower-cased.

    None when the peer showed no certificate (no mutual TLS): nothing to bind the node to.
    IP, URI and e-mail names are not node names and are left out.
    """
    if not auth_context or "x509_common_name" not in auth_context and "peer_dns" not in auth_context:
        return None
    names = [*auth_context.get("x509_common_name", ()), *auth_context.get("peer_dns", ())]
    return frozenset(n.decode(errors="replace").lower() for n in names)


def node_identity_error(node: str, names: frozenset[str] | None) -> str | None:
    """Why a stream whose certificate names `names` may not speak for `node`; None when it may.

    Host names compare without regard to case; a certificate names its node exactly, not by pattern.
    """
    if names is None or node.lower() in names:
        return None
    shown = ", ".join(sorted(names)) or "no name"
    return (f"this agent's certificate is for {shown}, not for node {node!r}: give each node a certificate "
            "whose CN or a DNS name is its node name (the agent's --node)")


def is_loopback_listen(listen: str) -> bool:
    """Whether a listen address (HOST:PORT, or a `unix:` socket) is reachable from this host only."""
    if unix_path(listen) is not None:
        return True
    host = listen.rpartition(":")[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name, or empty (every address)
        return False


# -- which agents are authenticated: --agent-auth ------------------------------------------------------

AGENT_AUTH_MODES = ("auto", "munge", "token", "tls", "none")
# What an agent puts in its stream's munge credential (agent/munge_credential.py sends the same): a
# credential made for a query, or for Slurm, is not an agent's.
AGENT_PAYLOAD = b"clusterwatch-agent-v1"
# ENCODE_HOST binds the node name; nothing the sender chooses is among these.
AGENT_MUNGE_KEYS = "STATUS,UID,ENCODE_HOST"
NO_AGENT_AUTH = ("agents are not authenticated (--agent-auth none, or auto with no --token, no mutual TLS and no "
                 "munge on this host): anyone who reaches {listen} can send samples as any node, so no action "
                 "reaches a process (no request, stop, checkpoint, stack dump, signal or drain) and agents' "
                 "samples name no job's owner; on a Slurm cluster run munged here, else set --token or mutual TLS")


class StreamRefused(Exception):
    """An agent's stream is refused: `code` (a grpc.StatusCode) and one line saying why and what to do."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True, slots=True)
class AgentProof:
    """What an agent's stream proved: `how` ("token", "tls", "munge"; "" for nothing) and, under munge,
    the host that made its credential (munged's ENCODE_HOST), the identity its node name is bound to."""

    how: str = ""
    host: str = ""

    @property
    def authenticated(self) -> bool:
        return bool(self.how)

    def identity(self, node: str) -> tuple[str, str] | None:
        """What a second stream for `node` must prove to take the first's place; None: nothing can.

        A certificate names its node and a munge credential its host, so an agent reconnecting before its
        old stream is noticed dead proves it is the same; the shared token says nothing of which node.
        """
        if self.how == "tls":
            return ("tls", node.lower())
        if self.how == "munge":
            return ("munge", self.host)
        return None


class AgentAuth:
    """How the collector authenticates agents' streams (--agent-auth, resolved).

    Args:
        mode: "token" (TokenInterceptor checked it before the servicer), "tls" (gRPC checked the client
            certificate), "munge" (a credential of root on the agent's host, made for an agent), or "none".
        munge_socket: munged's socket when not the default.
        works: whether munge works now; given while munge is installed but does not answer yet: streams
            are refused and munge tried again at most every `retry_s`.
    """

    def __init__(self, mode: str, munge_socket: str | None = None,
                 works: Callable[[], Awaitable[bool]] | None = None, retry_s: float = 5.0,
                 clock: Callable[[], float] = time.monotonic, unmunge: str = "unmunge") -> None:
        self.mode = mode
        self.munge_socket = munge_socket
        self.unmunge = unmunge
        self._works = works
        self._retry_s = retry_s
        self._clock = clock
        self._next_try = clock() + retry_s
        self._lock = asyncio.Lock()
        # node → the munge host it was first proved from (lower-cased names)
        self.bound: dict[str, str] = {}

    @property
    def authenticates(self) -> bool:
        return self.mode != "none"

    async def prove(self, metadata, auth_context) -> AgentProof:
        """What the stream with this metadata and TLS context proves; StreamRefused when it proves too little."""
        if self.mode == "none":
            return AgentProof()
        if self.mode == "tls":
            return AgentProof("tls")  # gRPC refused a stream without a certificate of the CA
        if self.mode == "token":
            return AgentProof("token")  # TokenInterceptor refused one without the token
        await self._munge_ready()
        return await self._munge_proof(metadata)

    async def _munge_ready(self) -> None:
        if self._works is None:
            return
        async with self._lock:
            if self._works is not None and self._clock() >= self._next_try:
                if await self._works():
                    self._works = None
                    log.info("munge works on this host now: agents' streams are authenticated by munge")
                    return
                self._next_try = self._clock() + self._retry_s
        if self._works is not None:
            raise StreamRefused(grpc.StatusCode.UNAVAILABLE, (
                "this collector authenticates agents with munge, and munge does not work on its host (munged not "
                "running?): streams are refused until it does; its operator should start munged"))

    async def _munge_proof(self, metadata) -> AgentProof:
        from ..queries.auth import METADATA_KEY, AuthError, decode_credential, parse_unmunge, unmunge_fields

        cred = next((v for k, v in (metadata or ()) if k == METADATA_KEY and isinstance(v, str)), None)
        if not cred:
            raise StreamRefused(grpc.StatusCode.UNAUTHENTICATED, (
                "this collector takes agents that prove they are root on their node with a munge credential, "
                "and the stream carried none: run the agent as root where munged runs (as on any Slurm node), "
                "or give both a token (--token)"))
        if len(cred) > MAX_CREDENTIAL_CHARS:
            raise StreamRefused(grpc.StatusCode.UNAUTHENTICATED,
                                f"the munge credential is {len(cred)} characters; an agent's is far shorter")
        try:
            text = await decode_credential(cred, AGENT_PAYLOAD, self.munge_socket, self.unmunge, AGENT_MUNGE_KEYS)
            uid, user = parse_unmunge(text)
            host = unmunge_fields(text).get("ENCODE_HOST", "")
        except AuthError as exc:
            raise StreamRefused(grpc.StatusCode.UNAUTHENTICATED, str(exc)) from None
        if uid != 0:
            raise StreamRefused(grpc.StatusCode.PERMISSION_DENIED, (
                f"the agent's munge credential is {user or 'uid'} ({uid})'s, not root's: only a node's root "
                "agent speaks for it; run the agent as root (as the prolog and the systemd unit do)"))
        if not host:
            raise StreamRefused(grpc.StatusCode.UNAUTHENTICATED, "the munge credential names no encoding host")
        return AgentProof("munge", host.lower())

    def bind(self, node: str, proof: AgentProof) -> str | None:
        """Bind `node` to the munge host that first proved it; why a stream may not speak for it, or None."""
        if proof.how != "munge":
            return None
        key = node.lower()
        bound = self.bound.setdefault(key, proof.host)
        if bound == proof.host:
            return None
        return (f"node {node!r} is bound to the host whose munge credential first spoke for it ({bound}), and "
                f"this stream's credential was made on {proof.host}: one host cannot send another node's samples; "
                "if the node moved, restart the collector")


async def agent_auth_from_config(mode: str, token: str | None, client_ca: str | None, munge_socket: str | None,
                                 listen: str) -> AgentAuth:
    """The agents' authentication for --agent-auth `mode`; ConfigError when it cannot be had.

    auto: mutual TLS or the token when configured, else munge where it is installed (while munged does not
    answer, streams are refused and munge tried again), else none, said in one warning line.
    """
    from clusterwatch.errors import ConfigError

    from ..queries.auth import MUNGE_RETRY_S, munge_installed, munge_works

    if mode == "token" and not token:
        raise ConfigError("--agent-auth token needs --token (CLUSTERWATCH_TOKEN): the secret agents must send")
    if mode == "tls" and not client_ca:
        raise ConfigError("--agent-auth tls needs --tls-client-ca (with --tls-cert and --tls-key): the CA that "
                          "signs the agents' certificates")
    if mode == "auto" and (client_ca or token):
        mode = "tls" if client_ca else "token"
    if mode in ("tls", "token"):
        return AgentAuth(mode)
    if mode == "munge" or (mode == "auto" and munge_installed()):
        if await munge_works(munge_socket):
            return AgentAuth("munge", munge_socket)
        if mode == "munge":
            raise ConfigError("--agent-auth munge, but munge does not work on this host (munge/unmunge missing "
                              "or munged not running); start munged, or pass --agent-auth token with --token")
        log.warning("munge is installed but does not work on this host (munged not running?): agents' streams "
                    "are refused until it does, tried again every %.0f s; start munged, or set --token, or pass "
                    "--agent-auth none", MUNGE_RETRY_S)
        return AgentAuth("munge", munge_socket, works=lambda: munge_works(munge_socket), retry_s=MUNGE_RETRY_S)
    log.warning(NO_AGENT_AUTH.format(listen=listen))
    return AgentAuth("none")
