"""Serve the pages from a daemon thread, on the /metrics endpoint's bounded server (collector/exporter.py)."""
from __future__ import annotations

import socket
import threading
from wsgiref.simple_server import make_server

from ..exporter import MAX_CONNECTIONS, REQUEST_TIMEOUT_S, _QuietHandler, _Server
from .peer import PEER_KEY


class _PeerHandler(_QuietHandler):
    """Says both ends of the connection (PEER_KEY: client, server address), for access.py to ask the kernel who
    the client is (peer.py); a key no header can write (headers come as HTTP_*)."""

    def get_environ(self):
        env = super().get_environ()
        env[PEER_KEY] = (self.client_address[:2], self.connection.getsockname()[:2])
        return env


def serve_web(app, host: str, port: int):
    """Serve `app` on host:port (port 0: any free one; server_port says which); shutdown() and
    server_close() stop it."""
    family, _, _, _, sockaddr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]

    class Server(_Server):
        address_family = family

    Server.max_connections, Server.request_timeout_s = MAX_CONNECTIONS, REQUEST_TIMEOUT_S
    httpd = make_server(sockaddr[0], port, app, Server, handler_class=_PeerHandler)
    threading.Thread(target=httpd.serve_forever, name="web-http", daemon=True).start()
    return httpd
