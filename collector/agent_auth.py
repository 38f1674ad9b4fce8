"""Who is sending: the agents' shared token, and under mutual TLS the node each certificate names.

The token proves only that a stream comes from someone who holds it (every node holds the same
one); it says nothing of which node. Under mutual TLS the certificate does: a stream may speak
only for a node its certificate names (its CN or one of its DNS names), so one node cannot
send another's samples or end its jobs. Queries are not agents' business: the token is asked
of the Ingest service only (collector/query_auth.py identifies the users who query).
"""
from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Callable, Iterable, Mapping

import grpc

from clusterwatch.unix_address import unix_path

INGEST_METHOD_PREFIX = "/clusterwatch.v1.Ingest/"
TOKEN_REFUSED = "missing or wrong clusterwatch token"


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


def open_ingest_warning(listen: str, token: str | None, client_ca: str | None) -> str | None:
    """The one line to say at start when agents' streams are taken from beyond loopback unauthenticated."""
    if token or client_ca or is_loopback_listen(listen):
        return None
    return (f"agents are not authenticated: the collector listens on {listen} beyond loopback with neither "
            "--token nor mutual TLS (--tls-client-ca), so anyone who reaches the port can send samples as any "
            "node and end its jobs; set a token (CLUSTERWATCH_TOKEN) or mutual TLS")
