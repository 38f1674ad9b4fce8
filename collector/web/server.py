"""Serve the pages from a daemon thread, on the /metrics endpoint's bounded server (collector/exporter.py)."""
from __future__ import annotations

import socket
import threading
from wsgiref.simple_server import make_server

from ..exporter import MAX_CONNECTIONS, REQUEST_TIMEOUT_S, _QuietHandler, _Server


def serve_web(app, host: str, port: int):
    """Serve `app` on host:port (port 0: any free one; server_port says which); shutdown() and
    server_close() stop it."""
    family, _, _, _, sockaddr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]

    class Server(_Server):
        address_family = family

    Server.max_connections, Server.request_timeout_s = MAX_CONNECTIONS, REQUEST_TIMEOUT_S
    httpd = make_server(sockaddr[0], port, app, Server, handler_class=_QuietHandler)
    threading.Thread(target=httpd.serve_forever, name="web-http", daemon=True).start()
    return httpd
