"""POST a JSON body to a webhook within a deadline for the whole call.

urllib's `timeout` bounds each socket operation, not the call: an endpoint that drips its answer a
byte a second kept a 3 s webhook busy for 40 s. Here every connection the call opens (redirects
included) is shut down when the deadline passes, wherever the call is (sending, waiting for the
status line, reading headers or the body), and the call fails with a TimeoutError. urllib still
does the rest: proxies from the environment, redirects, TLS.

Not bounded by the deadline: the name lookup (getaddrinfo cannot be interrupted) and a TLS
handshake (each of its reads is, by the socket timeout, set to the time left).
"""
from __future__ import annotations

import http.client
import socket
import threading
import time
import urllib.request

MAX_RESPONSE_BYTES = 64 * 1024  # of the body, read and thrown away: an answer is its status


class _Watched:
    """The sockets of one call, shut down together when its deadline passes."""

    def __init__(self, deadline: float) -> None:
        self.deadline = deadline
        self.expired = False
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()

    def left(self) -> float:
        return max(0.001, self.deadline - time.monotonic())

    def add(self, sock: socket.socket) -> None:
        with self._lock:
            self._sockets.append(sock)
            expired = self.expired
        if expired:
            _shut(sock)

    def expire(self) -> None:
        with self._lock:
            self.expired = True
            sockets = list(self._sockets)
        for sock in sockets:
            _shut(sock)


def _shut(sock: socket.socket) -> None:
    # socket.socket.shutdown even for an SSLSocket: its own shutdown() drops the TLS state under
    # the thread that is reading. A shut socket's blocked read returns at once; a socket already
    # closed has no descriptor left (EBADF), never another file's.
    try:
        socket.socket.shutdown(sock, socket.SHUT_RDWR)
    except OSError:
        pass


class _HTTPConnection(http.client.HTTPConnection):
    def __init__(self, *args, watched: _Watched, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._watched = watched

    def connect(self) -> None:
        self.timeout = self._watched.left()
        super().connect()
        self._watched.add(self.sock)


class _HTTPSConnection(http.client.HTTPSConnection):
    def __init__(self, *args, watched: _Watched, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._watched = watched

    def connect(self) -> None:
        # HTTPSConnection.connect, with the raw socket watched from its creation
        self.timeout = self._watched.left()
        http.client.HTTPConnection.connect(self)
        self._watched.add(self.sock)
        server_hostname = self._tunnel_host or self.host
        self.sock = self._context.wrap_socket(self.sock, server_hostname=server_hostname)
        self._watched.add(self.sock)


class _HTTPHandler(urllib.request.HTTPHandler):
    def __init__(self, watched: _Watched) -> None:
        super().__init__()
        self._watched = watched

    def http_open(self, req):
        return self.do_open(lambda *a, **kw: _HTTPConnection(*a, watched=self._watched, **kw), req)


class _HTTPSHandler(urllib.request.HTTPSHandler):
    def __init__(self, watched: _Watched) -> None:
        super().__init__()
        self._watched = watched

    def https_open(self, req):
        return self.do_open(lambda *a, **kw: _HTTPSConnection(*a, watched=self._watched, **kw), req,
                            context=self._context)


def post_json(url: str, body: bytes, timeout_s: float) -> int:
    """POST `body` as JSON to `url`; the whole call, answer included, ends within `timeout_s`.

    Args:
        url: an http:// or https:// URL (from the rules file).
        body: the JSON document.
        timeout_s: the deadline for the whole call, in seconds.

    Returns:
        The HTTP status (2xx or 3xx: urllib raises for the others).

    Raises:
        TimeoutError: the call passed its deadline.
        OSError: the call failed otherwise (urllib.error.URLError and HTTPError are OSErrors).
    """
    watched = _Watched(time.monotonic() + timeout_s)
    timer = threading.Timer(timeout_s, watched.expire)
    timer.daemon = True
    opener = urllib.request.build_opener(_HTTPHandler(watched), _HTTPSHandler(watched))
    req = urllib.request.Request(url, data=body, method="POST", headers={"Content-Type": "application/json"})
    timer.start()
    try:
        with opener.open(req, timeout=timeout_s) as resp:  # noqa: S310 - URL from the rules file
            resp.read(MAX_RESPONSE_BYTES)
            status = resp.status
    except (OSError, http.client.HTTPException) as exc:
        if watched.expired:
            raise TimeoutError(f"no complete answer within {timeout_s:g} s") from None
        if isinstance(exc, OSError):
            raise
        raise OSError(f"bad HTTP answer: {exc!r}") from None
    finally:
        timer.cancel()
    return status
