"""The collector's composition root (CollectorServer.__init__): each part is built with what it reaches."""
from __future__ import annotations

import asyncio

from clusterwatch.collector.config import CollectorConfig
from clusterwatch.collector.health.kmsg_marks import KmsgMarks
from clusterwatch.collector.ingest.service import IngestServicer
from clusterwatch.collector.rules.model import FIRING, AlertEvent
from clusterwatch.collector.service import CollectorServer
from clusterwatch.collector.state.store import open_db
from clusterwatch.v1 import agent_pb2


def test_the_actions_ask_and_answer_through_the_same_train_asks(tmp_path):
    server = CollectorServer(CollectorConfig(db_path=str(tmp_path / "cw.db")))
    dispatcher, asks = server.alerting.dispatcher, server.train_asks
    assert dispatcher.ask_train == asks.ask_for_alert
    assert asks.why_unreachable == server.outboxes.why_not
    assert asks.send == server.outboxes.send_train_request
    assert dispatcher.send_signal == server.outboxes.send_signal
    assert dispatcher.store is server.alerting.store
    assert dispatcher.drain_node is None  # no Slurm, no drain
    # the trace of a job carries the health history of the engine the health rules run
    assert server.core._health is server.alerting.health.engine


def test_a_drain_is_trusted_only_on_an_authenticated_agent(tmp_path):
    server = CollectorServer(CollectorConfig(db_path=str(tmp_path / "cw.db")))
    trusted = server.alerting.dispatcher.node_trusted
    hello = agent_pb2.Hello(node="n1", boot_id="b1", agent_version="t", interval_s=1.0)
    assert not trusted("n1")
    server.core.hello(hello, authenticated=False)
    assert not trusted("n1")
    server.core.hello(hello, authenticated=True)
    assert trusted("n1")


def test_the_kernel_log_records_taken_before_a_restart_are_not_taken_again(tmp_path):
    db = str(tmp_path / "cw.db")
    CollectorServer(CollectorConfig(db_path=db))  # makes the tables
    KmsgMarks(open_db(db)).save({("n1", "kboot"): 41})
    server = CollectorServer(CollectorConfig(db_path=db))
    assert server.alerting.health.engine.kmsg_seq[("n1", "kboot")] == 41
    assert server.alerting.health.marks is not None


def test_the_health_rules_alerts_are_handled_by_the_alerting(tmp_path):
    server = CollectorServer(CollectorConfig(db_path=str(tmp_path / "cw.db")))
    handled = []
    server.alerting.handle = lambda events, now: handled.append((events, now))
    event = AlertEvent(t=5.0, rule="gpu_xid", state=FIRING, severity="critical", node="n1", gpu="GPU-1",
                       figures={"xid": 48})
    server.alerting.health.handle([event], 5.0)
    assert handled == [([event], 5.0)]
    # and the finding is kept for the repeat offenders
    assert [(o.node, o.gpu, o.findings) for o in server.offenders.ranking()[0]] == [("n1", "GPU-1", 1)]


def test_the_agents_stream_is_built_at_start_with_what_agents_must_prove(tmp_path):
    config = CollectorConfig(db_path=str(tmp_path / "cw.db"), listen="127.0.0.1:0", metrics_listen=None,
                             agent_auth="token", token="s3cret", query_auth="none")
    server = CollectorServer(config)

    async def started() -> IngestServicer:
        await server.start()
        try:
            return server.ingest
        finally:
            await server.stop()

    ingest = asyncio.run(started())
    assert ingest.auth.mode == "token"
    assert ingest.outboxes is server.outboxes
    assert ingest.on_train_answer == server.train_asks.on_answer
