"""/metrics over HTTP: prometheus_client's WSGI app with our writer, on the collector's bounded server."""
from __future__ import annotations

import gzip
from collections.abc import Callable
from urllib.parse import parse_qs
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder, gzip_accepted, make_wsgi_app

from ..serving.bounded_http import MAX_CONNECTIONS, REQUEST_TIMEOUT_S, serve_bounded
from .collector import Exposition

# zlib level 1: a scrape of megabytes must not hold a thread for long; level 9 (gzip's default, and
# prometheus_client's) takes about ten times longer for some 13 % less (bench/bench_metrics.py)
GZIP_LEVEL = 1


def metrics_app(exposition: Exposition) -> Callable:
    """A WSGI app serving the exposition on any path: prometheus_client's app, with our writer for GETs.

    prometheus_client's `make_wsgi_app` answers OPTIONS, other methods (405) and /favicon.ico; a GET
    (or HEAD) takes its format from the library's `choose_encoder` and its compression from
    `gzip_accepted`, and is written by `render()` instead of the library's `generate_latest`.
    """
    library_app = make_wsgi_app(CollectorRegistry(auto_describe=False))

    def app(environ, start_response):
        method = environ["REQUEST_METHOD"]
        if method not in ("GET", "HEAD") or environ.get("PATH_INFO") == "/favicon.ico":
            return library_app(environ, start_response)
        params = parse_qs(environ.get("QUERY_STRING", ""))
        _, content_type = choose_encoder(environ.get("HTTP_ACCEPT"))
        om = content_type.startswith("application/openmetrics-text")
        body = exposition.scrape(om, set(params["name[]"]) if "name[]" in params else None)
        headers = [("Content-Type", content_type)]
        if gzip_accepted(environ.get("HTTP_ACCEPT_ENCODING")):
            # not the library's gzip (level 9): see GZIP_LEVEL
            body = gzip.compress(body, compresslevel=GZIP_LEVEL)
            headers.append(("Content-Encoding", "gzip"))
        headers.append(("Content-Length", str(len(body))))
        start_response("200 OK", headers)
        return [b""] if method == "HEAD" else [body]

    return app


def serve_metrics(exposition: Exposition, host: str, port: int, max_connections: int = MAX_CONNECTIONS,
                  request_timeout_s: float = REQUEST_TIMEOUT_S) -> WSGIServer:
    """Serve /metrics on host:port (IPv4 or IPv6) from a daemon thread; shutdown() and server_close() stop it.

    Args:
        exposition: what to serve.
        host: the address to listen on.
        port: the port (0: any free one; the server's server_port says which).
        max_connections: connections served at once (see bounded_http.BoundedServer).
        request_timeout_s: how long a connection may take to send its request.
    """
    return serve_bounded(metrics_app(exposition), host, port, "metrics-http", max_connections, request_timeout_s)
