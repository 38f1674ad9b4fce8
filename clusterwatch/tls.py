"""TLS credentials for the agent's stream, the collector's ports and the CLI's queries: the one place they are built.

Every file is read here, so a missing or unreadable certificate is one ConfigError line naming the
flag and the path, never a traceback from deep inside gRPC.
"""
from __future__ import annotations

from .errors import ConfigError


def read_pem(path: str, what: str) -> bytes:
    """The bytes of the PEM file `path`; `what` names it for people (e.g. "--tls-ca")."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise ConfigError(f"cannot read {what} {path}: {exc.strerror or exc}; "
                          "check the path and that this user may read it") from None
    if not data.strip():
        raise ConfigError(f"{what} {path} is empty; it must hold a PEM certificate or key")
    return data


def check_client_pair(cert: str | None, key: str | None, ca: str | None) -> None:
    """ConfigError unless a client certificate comes with its key and with the CA to trust the server by."""
    if bool(cert) != bool(key):
        raise ConfigError("--tls-cert and --tls-key go together")
    if cert and not ca:
        raise ConfigError("--tls-cert needs --tls-ca (the CA that signed the collector's certificate)")


def channel_credentials(ca: str | None, cert: str | None = None, key: str | None = None):
    """Credentials for a channel trusting `ca`, presenting `cert`/`key` for mutual TLS; None for plaintext.

    The flag names in errors are the agent's and the CLI's: --tls-ca, --tls-cert, --tls-key.
    """
    check_client_pair(cert, key, ca)
    if not ca:
        return None
    root = read_pem(ca, "--tls-ca")
    chain = read_pem(cert, "--tls-cert") if cert else None
    private = read_pem(key, "--tls-key") if key else None
    import grpc

    return grpc.ssl_channel_credentials(root_certificates=root, private_key=private, certificate_chain=chain)


def server_credentials(cert: str | None, key: str | None, client_ca: str | None = None):
    """Credentials for a port serving `cert`/`key`, requiring client certificates signed by `client_ca` when
    given; None for plaintext (no `cert`).

    The flag names in errors are the collector's: --tls-cert, --tls-key, --tls-client-ca.
    """
    if not cert and not key:
        if client_ca:
            raise ConfigError("--tls-client-ca needs --tls-cert and --tls-key (the collector's own certificate)")
        return None
    if not cert or not key:
        raise ConfigError("--tls-cert and --tls-key go together")
    chain = read_pem(cert, "--tls-cert")
    private = read_pem(key, "--tls-key")
    ca = read_pem(client_ca, "--tls-client-ca") if client_ca else None
    import grpc

    return grpc.ssl_server_credentials([(private, chain)], root_certificates=ca, require_client_auth=ca is not None)
