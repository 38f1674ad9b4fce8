"""Alerts to a real Alertmanager (Debian's prometheus-alertmanager, started by the test on a loopback port):
firing with its labels, resolved, silenced on a job, re-sent while it fires, retried while Alertmanager is away,
and never in the way of the other actions (a webhook, a drain)."""
from __future__ import annotations

import asyncio
import datetime
import json
import logging
import socket
import sqlite3
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest
from clusterwatch.collector.alerting.actions import Dispatcher
from clusterwatch.collector.alerting.alertmanager import ENDS_AFTER_RESENDS, AlertmanagerNotifier, alertmanager_urls
from clusterwatch.collector.alerting.alerts import AlertStore
from clusterwatch.collector.config import CollectorConfig
from clusterwatch.collector.rules import AlertEvent, parse_rules
from clusterwatch.collector.service import CollectorServer
from clusterwatch.collector.state.cluster import JobState

from clusterwatch.backoff import Backoff
from clusterwatch.errors import ConfigError
from tests.services.alertmanager import alertmanager_factory  # noqa: F401  (the fixture)
from tests.services.procs import free_port
from tests.support.helpers import cli, metric_value, wait_for


def _ev(state: str, job_id: str = "9", t: float | None = None, description: str = "GPU memory grows") -> AlertEvent:
    return AlertEvent(t=time.time() if t is None else t, rule="gpu_memory_leak", state=state, severity="warning",
                      node="n1", job_id=job_id, pid=4242 + int(job_id), start_time=3.0, gpu="GPU-a", rank=1,
                      description=description, figures={})


def _dispatcher(urls: list[str], rules_text: str = "", **notifier_kw) -> Dispatcher:
    notifier = AlertmanagerNotifier(alertmanager_urls(urls), job_user=lambda job_id: f"user{job_id}", **notifier_kw)
    notifier.page_base = "http://cw.example:8080"
    return Dispatcher(AlertStore(sqlite3.connect(":memory:", check_same_thread=False)),
                      parse_rules(rules_text).actions, alertmanager=notifier)


def test_a_firing_alert_appears_with_its_labels_and_its_resolution_ends_it(alertmanager_factory):  # noqa: F811
    am = alertmanager_factory()
    dispatcher = _dispatcher([am.url])
    try:
        dispatcher.process([_ev("firing")], time.time())
        (alert,) = am.wait_for_alerts(alertname="gpu_memory_leak")
        assert alert["labels"] == {"alertname": "gpu_memory_leak", "severity": "warning", "job_id": "9",
                                   "user": "user9", "node": "n1", "gpu": "GPU-a", "rank": "1",
                                   "source": "clusterwatch"}
        assert alert["annotations"] == {"summary": "gpu_memory_leak (warning) job 9 rank 1 on n1 GPU GPU-a",
                                        "description": "GPU memory grows"}
        assert alert["generatorURL"] == "http://cw.example:8080/jobs/9"
        assert alert["status"]["state"] == "active"
        # endsAt is resends ahead (minutes): the alert leaving below is its resolution, not its expiry
        assert _time(alert["endsAt"]) > time.time() + (ENDS_AFTER_RESENDS - 1) * 60

        dispatcher.process([_ev("resolved")], time.time())
        am.wait_for_alerts(lambda alerts: alerts == [], alertname="gpu_memory_leak")
        assert dispatcher.alertmanager.errors == 0
    finally:
        dispatcher.close()


def test_a_silence_on_a_job_mutes_that_jobs_alerts_only(alertmanager_factory):  # noqa: F811
    am = alertmanager_factory()
    dispatcher = _dispatcher([am.url])
    try:
        silence = am.silence(job_id="9")
        dispatcher.process([_ev("firing", job_id="9"), _ev("firing", job_id="10")], time.time())
        am.wait_for_alerts(lambda alerts: len(alerts) == 2, alertname="gpu_memory_leak")
        (muted,) = am.alerts(job_id="9")
        assert muted["status"]["state"] == "suppressed"
        assert muted["status"]["silencedBy"] == [silence]
        (other,) = am.alerts(job_id="10")
        assert other["status"]["state"] == "active"
    finally:
        dispatcher.close()


def test_a_firing_alert_is_sent_again_with_its_latest_text(alertmanager_factory):  # noqa: F811
    am = alertmanager_factory()
    dispatcher = _dispatcher([am.url], resend_s=1.0)
    try:
        dispatcher.process([_ev("firing")], time.time())
        (first,) = am.wait_for_alerts(alertname="gpu_memory_leak")
        dispatcher.store.refresh(_ev("firing", description="GPU memory grows 3 GiB/h"))
        dispatcher.tick(time.time())  # the collector's tick: what fires now, as the table has it

        def resent(alerts: list[dict]) -> bool:
            return bool(alerts) and alerts[0]["annotations"]["description"] == "GPU memory grows 3 GiB/h"

        (again,) = am.wait_for_alerts(resent, alertname="gpu_memory_leak")
        assert _time(again["endsAt"]) > _time(first["endsAt"])
        assert again["startsAt"] == first["startsAt"]  # the same alert, still firing since it first fired
    finally:
        dispatcher.close()


def test_an_alertmanager_away_gets_the_alerts_once_it_is_back(alertmanager_factory, caplog):  # noqa: F811
    port = free_port()
    dispatcher = _dispatcher([f"http://127.0.0.1:{port}"], retry=lambda: Backoff(initial_s=0.1, cap_s=0.5))
    notifier = dispatcher.alertmanager
    try:
        with caplog.at_level(logging.WARNING, logger="clusterwatch.alerts"):
            now = time.time()
            dispatcher.process([_ev("firing", job_id="9"), _ev("firing", job_id="10")], now)
            dispatcher.process([_ev("resolved", job_id="10")], now)
            wait_for(lambda: notifier.errors >= 3, what="three failed sends")
            said = [r.getMessage() for r in caplog.records if "cannot send alerts" in r.getMessage()]
            assert len(said) == 1 and f"127.0.0.1:{port}" in said[0]  # said once, however many tries

            am = alertmanager_factory(port)
            (alert,) = am.wait_for_alerts(alertname="gpu_memory_leak")
            assert alert["labels"]["job_id"] == "9"
            assert notifier.flush(30)
            # the resolution of job 10's alert, sent while away, came too (resolved alerts are not listed)
            with urllib.request.urlopen(f"{am.url}/metrics", timeout=10) as r:
                received = r.read().decode()
            assert metric_value(received, "alertmanager_alerts_received_total", status="resolved", version="v2") >= 1
            assert any("takes alerts again" in r.getMessage() for r in caplog.records)
    finally:
        dispatcher.close()


class _Hook(BaseHTTPRequestHandler):
    got: list = []

    def do_POST(self):  # noqa: N802 - http.server's name
        _Hook.got.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *a):
        pass


def test_an_alertmanager_that_never_answers_holds_up_no_webhook_and_no_drain():
    hook = HTTPServer(("127.0.0.1", 0), _Hook)
    threading.Thread(target=hook.serve_forever, daemon=True).start()
    # a listener that never accepts: the connection is made, the answer never comes
    silent = socket.create_server(("127.0.0.1", 0))
    drained: list[tuple[str, str]] = []
    rules = f"""
[[actions.steps]]
action = "webhook"
url = "http://127.0.0.1:{hook.server_port}/hook"
[[actions.steps]]
action = "drain"
"""
    dispatcher = _dispatcher([f"http://127.0.0.1:{silent.getsockname()[1]}"], rules, timeout_s=60.0)
    dispatcher.drain_node = lambda node, reason: drained.append((node, reason))
    _Hook.got = []
    try:
        dispatcher.process([_ev("firing")], time.time())
        wait_for(lambda: _Hook.got and drained, what="the webhook and the drain")
        assert _Hook.got[0]["rule"] == "gpu_memory_leak"
        assert drained[0][0] == "n1"
        assert not dispatcher.alertmanager.flush(0.1)  # its send still waits for an answer
        assert dispatcher.alertmanager.errors == 0
    finally:
        silent.close()  # the waiting send fails now; close() does not wait for it past its bound
        dispatcher.close()
        hook.shutdown()


def test_the_collector_sends_to_each_alertmanager_given_and_counts_failures(tmp_path):
    port, port2 = free_port(), free_port()  # nothing listens: every send fails
    config = CollectorConfig(db_path=str(tmp_path / "cw.db"), listen="127.0.0.1:0", metrics_listen=None,
                             query_auth="none", agent_auth="none",
                             alertmanagers=(f"http://127.0.0.1:{port}", f"http://127.0.0.1:{port2}/"))
    server = CollectorServer(config)
    notifier = server.alerting.dispatcher.alertmanager
    assert notifier.urls == (f"http://127.0.0.1:{port}/api/v2/alerts", f"http://127.0.0.1:{port2}/api/v2/alerts")
    server.core.state.jobs["9"] = JobState(job_id="9", user="alice")
    assert notifier._job_user("9") == "alice"  # the user label is the job's as Slurm or the agents say
    assert notifier._job_user("10") == ""
    server.alerting.handle([_ev("firing")], time.time())

    async def counted() -> dict:
        await server.start()
        try:
            wait_for(lambda: notifier.errors >= 1, what="a failed send")
            return server.counter_values()
        finally:
            await server.stop()

    counters = asyncio.run(counted())
    assert counters["clusterwatch_alertmanager_send_errors"][0] >= 1
    assert counters["clusterwatch_alertmanager_alerts_dropped"][0] == 0


def test_a_url_that_is_no_alertmanagers_stops_the_start(tmp_path):
    with pytest.raises(ConfigError, match="--alertmanager 'alertmanager:9093'"):
        CollectorServer(CollectorConfig(db_path=str(tmp_path / "cw.db"), alertmanagers=("alertmanager:9093",)))


def _time(rfc3339: str) -> float:
    return datetime.datetime.fromisoformat(rfc3339).timestamp()


def test_the_flags_variable_takes_several_urls_and_a_bad_one_is_one_line(tmp_path):
    r = cli("collector", "--db", str(tmp_path / "cw.db"), "--metrics-listen", "none", "--listen", "127.0.0.1:0",
            env={"CLUSTERWATCH_ALERTMANAGER": "http://127.0.0.1:9093 ftp://am2:9093"}, timeout=60)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines()[-1].startswith("clusterwatch: --alertmanager 'ftp://am2:9093' is not")
