"""Actions: webhook to a real loopback server, command with JSON on stdin, signals, escalation."""
import dataclasses
import json
import socketserver
import sqlite3
import ssl
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest
from clusterwatch.collector.alerting.actions import Dispatcher
from clusterwatch.collector.alerting.alerts import AlertStore
from clusterwatch.collector.alerting.webhook import post_json
from clusterwatch.collector.rules import AlertEvent, parse_rules

from tests.services.procs import refused_port
from tests.support.helpers import wait_for


def _ev(state, t):
    return AlertEvent(t=t, rule="gpu_memory_leak", state=state, severity="warning", node="n1", job_id="9",
                      pid=4242, start_time=3.0, gpu="GPU-a", rank=1, description="grows",
                      figures={"rate_bytes_per_h": 1})


class _Hook(BaseHTTPRequestHandler):
    got: list = []

    def do_POST(self):  # noqa: N802 - http.server's name
        n = int(self.headers["Content-Length"])
        _Hook.got.append(json.loads(self.rfile.read(n)))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *a):
        pass


def test_webhook_command_signal_and_escalation(tmp_path):
    srv = HTTPServer(("127.0.0.1", 0), _Hook)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    out = tmp_path / "cmd.json"
    rules = parse_rules(f"""
[actions]
allow_signals = true
[[actions.steps]]
action = "webhook"
url = "http://127.0.0.1:{srv.server_port}/hook"
timeout_s = 5
[[actions.steps]]
action = "command"
command = ["{sys.executable}", "-c", "import sys; open({str(out)!r}, 'wb').write(sys.stdin.buffer.read())"]
on_resolved = false
[[actions.steps]]
action = "signal"
signal = "SIGUSR1"
after_s = 3600
""")
    sent = []
    db = tmp_path / "a.db"
    d = Dispatcher(AlertStore(sqlite3.connect(db, check_same_thread=False)), rules.actions,
                   send_signal=lambda *a: sent.append(a))
    try:
        d.process([_ev("firing", 100.0)], now=100.0)
        d.drain()
        assert _Hook.got[-1]["rule"] == "gpu_memory_leak" and _Hook.got[-1]["state"] == "firing"
        assert json.loads(out.read_text())["pid"] == 4242
        assert sent == []
        d.tick(1000.0)
        d.drain()
        assert sent == []
        d.tick(3700.0)
        d.drain()
        assert len(sent) == 1 and sent[0][:4] == ("n1", 4242, 3.0, 10) and "gpu_memory_leak" in sent[0][4]
        d.tick(8000.0)
        d.drain()
        assert len(sent) == 1  # each step once
    finally:
        d.close()
    # restart: nothing is sent again for the restored firing alert
    n_hooks = len(_Hook.got)
    d2 = Dispatcher(AlertStore(sqlite3.connect(db, check_same_thread=False)), rules.actions,
                    send_signal=lambda *a: sent.append(a))
    try:
        d2.process([_ev("firing", 9000.0)], now=9000.0)
        d2.tick(9000.0)
        d2.drain()
        assert len(_Hook.got) == n_hooks and len(sent) == 1
        d2.process([_ev("resolved", 9100.0)], now=9100.0)
        d2.drain()
        assert _Hook.got[-1]["state"] == "resolved"
    finally:
        d2.close()
        srv.shutdown()


def test_signal_off_by_default_and_slow_webhook_does_not_block(tmp_path):
    with refused_port() as port:  # a webhook nobody answers: the connection is refused
        rules = parse_rules(f"""
[[actions.steps]]
action = "webhook"
url = "http://127.0.0.1:{port}/unreachable"
timeout_s = 2
[[actions.steps]]
action = "signal"
""")
        sent = []
        d = Dispatcher(AlertStore(sqlite3.connect(":memory:", check_same_thread=False)), rules.actions,
                       send_signal=lambda *a: sent.append(a))
        try:
            t0 = time.monotonic()
            d.process([_ev("firing", 1.0)], now=1.0)
            assert time.monotonic() - t0 < 1.5  # generous (a shared machine), and under the webhook's 2 s timeout
            d.drain()
            assert sent == [] and d.errors == 1
        finally:
            d.close()


class _Drip(socketserver.BaseRequestHandler):
    """Reads a request, then answers one byte a second (each read well inside any per-read timeout)."""

    stop = threading.Event()

    def handle(self):
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = self.request.recv(4096)
            if not chunk:
                return
            data += chunk
        answer = b"HTTP/1.1 200 OK\r\nContent-Length: 40\r\n\r\n" + b"x" * 40
        for i in range(len(answer)):
            if _Drip.stop.wait(1.0):
                return
            try:
                self.request.sendall(answer[i:i + 1])
            except OSError:
                return  # the caller gave up: what the deadline is for


def test_a_webhook_that_drips_its_answer_is_cut_at_its_deadline_and_delays_no_other_rule():
    drip = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Drip)
    drip.daemon_threads = True
    fast = HTTPServer(("127.0.0.1", 0), _Hook)
    for srv in (drip, fast):
        threading.Thread(target=srv.serve_forever, daemon=True).start()
    rules = parse_rules(f"""
[[actions.steps]]
action = "webhook"
url = "http://127.0.0.1:{drip.server_address[1]}/slow"
timeout_s = 6
rules = ["gpu_memory_leak"]
[[actions.steps]]
action = "webhook"
url = "http://127.0.0.1:{fast.server_port}/fast"
timeout_s = 6
rules = ["training_stall"]
""")
    d = Dispatcher(AlertStore(sqlite3.connect(":memory:", check_same_thread=False)), rules.actions)
    _Hook.got.clear()
    try:
        t0 = time.monotonic()
        d.process([_ev("firing", 1.0)], now=1.0)  # the dripping endpoint: ~45 s for its whole answer
        time.sleep(0.2)  # it is being called
        d.process([dataclasses.replace(_ev("firing", 1.2), rule="training_stall")], now=1.2)
        wait_for(lambda: _Hook.got, timeout=30, what="the other rule's webhook")
        other = time.monotonic() - t0
        assert [h["rule"] for h in _Hook.got] == ["training_stall"]
        assert other < 4, other  # it waited for nobody (before: for the whole drip, ~45 s)
        assert d.drain(30)
        whole = time.monotonic() - t0
        assert d.errors == 1 and whole < 20, whole  # cut at its 6 s deadline, counted
    finally:
        _Drip.stop.set()
        d.close()
        for srv in (drip, fast):
            srv.shutdown()
            srv.server_close()
        _Drip.stop.clear()


def test_post_json_bounds_the_whole_call_and_says_so():
    drip = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Drip)
    drip.daemon_threads = True
    threading.Thread(target=drip.serve_forever, daemon=True).start()
    try:
        t0 = time.monotonic()
        with pytest.raises(TimeoutError, match="within 2 s"):
            post_json(f"http://127.0.0.1:{drip.server_address[1]}/", b"{}", 2.0)
        assert time.monotonic() - t0 < 10  # before: urllib's per-read timeout let it run ~45 s
    finally:
        _Drip.stop.set()
        drip.shutdown()
        drip.server_close()
        _Drip.stop.clear()


def test_post_json_over_tls_answers_and_is_cut_at_its_deadline(tmp_path, monkeypatch):
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=hook",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(tmp_path / "k.pem"),
                    "-out", str(tmp_path / "c.pem")], check=True, capture_output=True, timeout=60)
    monkeypatch.setenv("SSL_CERT_FILE", str(tmp_path / "c.pem"))  # the client trusts this server only
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(tmp_path / "c.pem", tmp_path / "k.pem")
    fast = HTTPServer(("127.0.0.1", 0), _Hook)
    fast.socket = ctx.wrap_socket(fast.socket, server_side=True)
    drip = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Drip)
    drip.daemon_threads = True
    drip.socket = ctx.wrap_socket(drip.socket, server_side=True)
    for srv in (drip, fast):
        threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        _Hook.got.clear()
        assert post_json(f"https://127.0.0.1:{fast.server_port}/hook", b'{"rule": "tls"}', 5.0) == 204
        assert _Hook.got == [{"rule": "tls"}]
        t0 = time.monotonic()
        with pytest.raises(TimeoutError):
            post_json(f"https://127.0.0.1:{drip.server_address[1]}/", b"{}", 2.0)
        assert time.monotonic() - t0 < 10
    finally:
        _Drip.stop.set()
        for srv in (drip, fast):
            srv.shutdown()
            srv.server_close()
        _Drip.stop.clear()
