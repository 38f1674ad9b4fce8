"""Actions: webhook to a real loopback server, command with JSON on stdin, signals, escalation."""
import json
import sqlite3
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer

from clusterwatch.collector.actions import Dispatcher
from clusterwatch.collector.alerts import AlertStore
from clusterwatch.collector.rules import AlertEvent, parse_rules


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
    rules = parse_rules("""
[[actions.steps]]
action = "webhook"
url = "http://127.0.0.1:9/unreachable"
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
        assert time.monotonic() - t0 < 0.5
        d.drain()
        assert sent == [] and d.errors == 1
    finally:
        d.close()
