"""Issue 17 item 13: an agent whose token the collector refuses says so (refused, and why), once, keeps
retrying with backoff (the collector may be the one to fix), counts the refusals, and delivers once the
collector takes its token. A real collector and a real agent."""
from __future__ import annotations

import re
from pathlib import Path

from tests.support.helpers import CLI, Collector, Proc, metric_value, wait_for

REFUSED = "refuses this agent's stream (UNAUTHENTICATED: missing or wrong clusterwatch token)"


def test_a_wrong_token_is_said_as_refused_counted_and_retried_until_the_collector_takes_it(tmp_path: Path) -> None:
    collector = Collector(tmp_path, "--token", "the-collectors")
    port = collector.grpc_port
    agent = Proc([*CLI, "agent", "--collector", collector.address, "--node", "n1", "--interval", "0.5",
                  "--send-interval", "0", "--gpu-source", "none", "--token", "the-agents", "--no-provenance",
                  "--kmsg", "none", "--spool-dir", str(tmp_path / "spool"),
                  "--train-socket", str(tmp_path / "train.sock"), "--pid", str(collector.pid), "--job-id", "t-1"],
                 tmp_path / "agent.log")
    fixed = None
    try:
        wait_for(lambda: REFUSED in agent.text(), timeout=30, what="the refusal said")
        # retried with backoff (0.5 s, then x1.6): a few refusals within seconds, said once
        wait_for(lambda: _refused(collector) >= 3, timeout=30, what="the agent retrying")
        collector.stop()
        # the collector is fixed: it now has the agent's token, on the same port
        fixed = Collector(tmp_path, "--token", "the-agents", name="fixed", listen=f"127.0.0.1:{port}")
        wait_for(lambda: "connected again" in agent.text(), timeout=60, what="the agent connected again")
    finally:
        code = agent.stop()
        collector.stop()
        if fixed is not None:
            fixed.stop()
    text = agent.text()
    assert code == 0, text
    [line] = [ln for ln in text.splitlines() if REFUSED in ln]
    assert "give it the collector's token" in line and "Retrying with backoff" in line
    assert "--token" in line and "CLUSTERWATCH_TOKEN" in line
    counts = dict(re.findall(r"(\w+)=(\d+)", [ln for ln in text.splitlines() if ln.startswith("samples_sent=")][-1]))
    # Those it could tell: a write racing the refusal can end the call as INTERNAL, its status lost in
    # gRPC's core (the collector counted every one).
    assert int(counts["streams_refused"]) >= 1
    assert int(counts["samples_acked"]) > 0  # delivered once the collector took the token


def _refused(collector: Collector) -> float:
    return metric_value(collector.metrics(), "clusterwatch_ingest_unauthenticated_total") or 0.0
