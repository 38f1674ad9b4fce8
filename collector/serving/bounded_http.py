"""The collector's HTTP server: prometheus_client's threading WSGI server, bounded in connections and time.

/metrics (collector/export/http.py) and the web pages (collector/web/server.py) both serve on it. Each
connection has a thread, and wsgiref waits for a request for ever: without a bound, connections that never
send one hold as many threads and descriptors, and at the descriptor limit the endpoint stops answering.
"""
from __future__ import annotations

import socket
import sys
import threading
import time
from collections.abc import Callable
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client.exposition import ThreadingWSGIServer

MAX_CONNECTIONS = 64       # connections served at once; past it the oldest one still sending its request goes
REQUEST_TIMEOUT_S = 10.0   # for the request: each read, and (checked as connections come) the whole request
RESPONSE_TIMEOUT_S = 60.0  # for the response: 9 MB of exposition to a slow scraper


class BoundedServer(ThreadingWSGIServer):
    """prometheus_client's server (wsgiref's, a daemon thread per connection), at most `max_connections`
    connections at once, each given `request_timeout_s` for its request (the library's has no bound).

    A connection counts from its accept to its close. When a new one would pass the limit, the one
    that has waited longest for its request goes (shut down, so its thread ends at once), or, when
    every connection is past its request (writing a response), the new one is closed unserved
    (`refused`). A scraper sends its request as soon as it connects, so idle or dripping connections
    can never keep a scrape out. A connection still sending its request after `request_timeout_s`
    goes too, the next time one comes. Its handler must be a QuietHandler, which says when the
    request is in.
    """

    request_queue_size = 128  # the listen backlog: socketserver's 5 drops the SYNs of a burst (1 s retries)
    max_connections = MAX_CONNECTIONS
    request_timeout_s = REQUEST_TIMEOUT_S

    def server_activate(self) -> None:
        super().server_activate()
        self._conn_lock = threading.Lock()
        self._reading: dict[socket.socket, float] = {}  # connection -> accept time, until its request is read
        self._open: set[socket.socket] = set()
        self.evicted = self.refused = 0

    def process_request(self, request, client_address) -> None:
        now = time.monotonic()
        with self._conn_lock:
            for conn, since in list(self._reading.items()):
                if now - since > self.request_timeout_s:
                    self._evict(conn)
            if len(self._open) >= self.max_connections:
                if not self._reading:
                    self.refused += 1
                    self.close_request(request)
                    return
                self._evict(min(self._reading, key=self._reading.__getitem__))
            self._open.add(request)
            self._reading[request] = now
        super().process_request(request, client_address)

    def _evict(self, conn: socket.socket) -> None:
        # shutdown, not close: the connection's thread still owns the descriptor, and its read
        # returns at once (an empty request line, which wsgiref ends quietly)
        self._reading.pop(conn, None)
        self._open.discard(conn)
        self.evicted += 1
        try:
            conn.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def request_read(self, conn: socket.socket) -> None:
        """The connection's request is in: it is answered now, and no longer evicted."""
        with self._conn_lock:
            self._reading.pop(conn, None)

    def shutdown_request(self, request) -> None:
        with self._conn_lock:
            self._reading.pop(request, None)
            self._open.discard(request)
        super().shutdown_request(request)

    def handle_error(self, request, client_address) -> None:
        # a client that timed out, hung up or was evicted is no error of ours: no traceback
        if isinstance(sys.exc_info()[1], OSError):
            return
        super().handle_error(request, client_address)


class QuietHandler(WSGIRequestHandler):
    """wsgiref's handler for a BoundedServer: `timeout` for each read of the request, RESPONSE_TIMEOUT_S for
    the response once the request is in, and no access log."""

    timeout = REQUEST_TIMEOUT_S  # StreamRequestHandler sets it on the socket: each read of the request

    def parse_request(self) -> bool:
        ok = super().parse_request()
        if ok:  # the request line and headers are in (wsgiref reads no body for GET)
            self.server.request_read(self.connection)
            self.connection.settimeout(RESPONSE_TIMEOUT_S)
        return ok

    def log_message(self, format, *args):  # noqa: A002 - the base class's signature
        """No access log (a scrape every 15 s)."""


def serve_bounded(app: Callable, host: str, port: int, thread_name: str, max_connections: int = MAX_CONNECTIONS,
                  request_timeout_s: float = REQUEST_TIMEOUT_S,
                  handler_class: type[QuietHandler] = QuietHandler) -> WSGIServer:
    """Serve the WSGI `app` on host:port (IPv4 or IPv6) from a daemon thread; shutdown() and server_close() stop it.

    Args:
        app: the WSGI application.
        host: the address to listen on.
        port: the port (0: any free one; the server's server_port says which).
        thread_name: the serving thread's name.
        max_connections: connections served at once (see BoundedServer).
        request_timeout_s: how long a connection may take to send its request.
        handler_class: a QuietHandler; it is given `request_timeout_s` for each read.
    """
    family, _, _, _, sockaddr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]

    class Server(BoundedServer):
        address_family = family

    Server.max_connections, Server.request_timeout_s = max_connections, request_timeout_s

    class Handler(handler_class):
        timeout = request_timeout_s

    httpd = make_server(sockaddr[0], port, app, Server, handler_class=Handler)
    threading.Thread(target=httpd.serve_forever, name=thread_name, daemon=True).start()
    return httpd
