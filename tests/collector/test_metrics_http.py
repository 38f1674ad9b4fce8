"""The /metrics HTTP server under connections that never send a request (issue 13, item 9).

wsgiref waits for a request forever, with a thread and a descriptor per connection: a few hundred
idle connections took the server to its descriptor limit, and /metrics stopped answering.
"""
from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
import urllib.request

from clusterwatch.collector.export import ClusterCollector, Exposition, serve_metrics
from clusterwatch.collector.state.cluster import ClusterState

# serve_metrics in a process of its own, with a low descriptor limit (what a busy collector has left)
SERVER = r"""
import resource, sys, threading, time
from clusterwatch.collector.export import ClusterCollector, Exposition, serve_metrics
from clusterwatch.collector.state.cluster import ClusterState
resource.setrlimit(resource.RLIMIT_NOFILE, (int(sys.argv[1]), resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
httpd = serve_metrics(Exposition(ClusterCollector(ClusterState(), time.time), threading.Lock()), "127.0.0.1", 0)
print(httpd.server_port, flush=True)
sys.stdin.readline()
"""


def _scrape(port: int, timeout: float = 20.0) -> tuple[float, bytes]:
    t = time.monotonic()
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=timeout) as r:
        body = r.read()
    return time.monotonic() - t, body


def _threads(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return int(next(line for line in f if line.startswith("Threads:")).split()[1])


def test_hundreds_of_idle_connections_at_a_low_fd_limit_leave_scrapes_answered():
    server = subprocess.Popen([sys.executable, "-c", SERVER, "128"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)
    idle: list[socket.socket] = []
    try:
        assert server.stdout is not None
        port = int(server.stdout.readline())
        for _ in range(300):  # connect and say nothing, more than the server has descriptors
            idle.append(socket.create_connection(("127.0.0.1", port), timeout=5))
        time.sleep(0.5)  # let the server accept what it will
        took, body = _scrape(port)
        assert b"# TYPE clusterwatch_" in body, body[:200]  # an empty state still exports its families' HELP/TYPE
        assert took < 10, took  # generous: a shared machine; it hung for ever before
        assert _threads(server.pid) <= 64 + 8  # a thread a connection, at most 64 of them, and a few of its own
        # the server still answers after all that, scrape after scrape
        assert all(_scrape(port)[0] < 10 for _ in range(3))
    finally:
        for s in idle:
            s.close()
        server.kill()
        server.wait(10)


def test_a_connection_that_sends_nothing_is_closed_after_the_request_timeout():
    httpd = serve_metrics(Exposition(ClusterCollector(ClusterState(), time.time), threading.Lock()), "127.0.0.1", 0,
                          request_timeout_s=1.0)
    try:
        with socket.create_connection(("127.0.0.1", httpd.server_port), timeout=15) as s:
            t = time.monotonic()
            assert s.recv(1) == b""  # the server hung up (before: recv timed out after 15 s)
            assert time.monotonic() - t < 10
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_dripping_connections_give_way_to_a_scrape():
    httpd = serve_metrics(Exposition(ClusterCollector(ClusterState(), time.time), threading.Lock()), "127.0.0.1", 0,
                          max_connections=8, request_timeout_s=30.0)
    stop = threading.Event()
    drippers = [socket.create_connection(("127.0.0.1", httpd.server_port), timeout=5) for _ in range(8)]

    def drip() -> None:  # a byte of a request line every 0.2 s: no read ever times out
        while not stop.wait(0.2):
            for s in drippers:
                try:
                    s.send(b"G")
                except OSError:
                    pass

    t = threading.Thread(target=drip, daemon=True)
    t.start()
    try:
        time.sleep(0.5)
        took, _ = _scrape(httpd.server_port)  # all 8 places are taken by requests never finished
        assert took < 10, took
        assert httpd.evicted >= 1 and httpd.refused == 0
    finally:
        stop.set()
        t.join(5)
        for s in drippers:
            s.close()
        httpd.shutdown()
        httpd.server_close()
