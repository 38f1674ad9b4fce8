"""Alerts for real: a leaking process under a real agent and collector raises host_memory_leak,
which reaches /metrics, `alerts`, `status`, a webhook and (escalation) a SIGUSR1 to the process;
a collector restart neither loses nor re-sends it; `record` then `replay` finds it again."""
from __future__ import annotations

import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from tests.support.helpers import CLI, Collector, Proc, cli, firing_alert, metric_value, wait_for
from tests.support.short_leak_rules import WINDOW_S, short_leak_rules

pytestmark = pytest.mark.e2e

LEAKER = """
import signal, sys, time
marker = sys.argv[1]
def on_usr1(*_):
    open(marker, "w").write("checkpoint asked")
signal.signal(signal.SIGUSR1, on_usr1)
hoard = []
for i in range(2000):
    block = bytearray(4 * 1024 * 1024)
    block[::4096] = b"x" * len(block[::4096])
    hoard.append(block)
    time.sleep(0.25)
"""


class Hooks(BaseHTTPRequestHandler):
    received: list = []

    def do_POST(self):  # noqa: N802 - the name http.server calls
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        Hooks.received.append(json.loads(body))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def webhook():
    Hooks.received = []
    server = HTTPServer(("127.0.0.1", 0), Hooks)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}/hook", Hooks.received
    server.shutdown()
    server.server_close()


def _rules(tmp_path, url: str):
    text = short_leak_rules() + f"""
[actions]
allow_signals = true

[[actions.steps]]
action = "webhook"
url = "{url}"
timeout_s = 5

[[actions.steps]]
action = "signal"
signal = "SIGUSR1"
after_s = 2
rules = ["host_memory_leak"]
"""
    path = tmp_path / "rules.toml"
    path.write_text(text)
    return path


def test_leak_alert_end_to_end(tmp_path, webhook):
    url, received = webhook
    rules = _rules(tmp_path, url)
    db = tmp_path / "cw.db"
    marker = tmp_path / "usr1"
    collector = Collector(tmp_path, "--rules", str(rules), "--history-step", "0", db=db)
    leaker = Proc([sys.executable, "-c", LEAKER, str(marker)], tmp_path / "leaker.log")
    agent = Proc([*CLI, "agent", "--collector", collector.address, "--node", "leak-node", "--interval", "0.5",
                  "--send-interval", "0",
                  "--gpu-source", "none", "--pid", str(leaker.pid), "--job-id", "leak-1", "--no-provenance",
                  "--spool-dir", str(tmp_path / "spool"), "--train-socket", str(tmp_path / "train.sock")],
                 tmp_path / "agent.log")
    try:
        entry = wait_for(lambda: firing_alert(collector, "host_memory_leak"), timeout=120,
                         what="host_memory_leak firing")
        assert entry["job_id"] == "leak-1"
        assert entry["node"] == "leak-node" and entry["pid"] == leaker.pid
        assert "grows" in entry["description"]
        text = collector.metrics()
        assert metric_value(text, "clusterwatch_alert", rule="host_memory_leak", state="firing",
                            job_id="leak-1") == 1.0
        status = cli("status", "leak-1", "--collector", collector.address)
        assert "host_memory_leak" in status.stdout and "FIRING" in status.stdout
        wait_for(lambda: any(a.get("rule") == "host_memory_leak" for a in received), timeout=30,
                 what="the webhook")
        # escalation: still firing after 2 s, the agent sends SIGUSR1 to the leaking process
        wait_for(marker.exists, timeout=30, what="SIGUSR1 delivered to the leaking process")
        posted = len(received)

        # record what the collector holds, and replay it through the same engine and leak rule
        trace, leak_rules = tmp_path / "leak.jsonl", tmp_path / "leak_rules.toml"
        leak_rules.write_text(short_leak_rules())
        wait_for(lambda: cli("record", "leak-1", "--collector", collector.address, "-o", str(trace),
                                     "--force").returncode == 0
                 and len(trace.read_text().splitlines()) > 2 * (WINDOW_S + 20), timeout=90,
                 what="a recorded trace of a window and 20 s")
        replay = cli("replay", str(trace), "--rules", str(leak_rules), "--format", "jsonl")
        assert replay.returncode == 0, replay.stderr
        events = [json.loads(line) for line in replay.stdout.splitlines() if line.startswith("{")]
        assert any(e["rule"] == "host_memory_leak" and e["state"] == "firing" and e["pid"] == leaker.pid
                   for e in events), replay.stdout

        # restart: the alert comes back from the store and is not sent again
        assert collector.stop() == 0
        collector = Collector(tmp_path, "--rules", str(rules), "--history-step", "0", db=db, name="collector2")
        agent.stop()
        agent = Proc([*CLI, "agent", "--collector", collector.address, "--node", "leak-node", "--interval", "0.5",
                      "--send-interval", "0",
                      "--gpu-source", "none", "--pid", str(leaker.pid), "--job-id", "leak-1", "--no-provenance",
                      "--spool-dir", str(tmp_path / "spool"), "--train-socket", str(tmp_path / "train.sock")],
                     tmp_path / "agent2.log")
        assert firing_alert(collector, "host_memory_leak") is not None
        wait_for(lambda: (metric_value(collector.metrics(), "clusterwatch_rank_rss_bytes", job_id="leak-1") or 0),
                 what="samples after the restart")
        firing_posts = [a for a in received[posted:] if a.get("state") == "firing"]
        assert not firing_posts, f"the restarted collector notified again: {firing_posts}"

    finally:
        for p in (agent, leaker, collector):
            p.stop()
