"""Which jobs held which GPU (collector/health/gpu_jobs.py): written as jobs close in the real collector, kept in
its SQLite file across a restart, bounded; and the in_every_job escalation raised from it end to end."""
from __future__ import annotations

import sqlite3
import time
from pathlib import Path

from clusterwatch.collector.config import CollectorConfig
from clusterwatch.collector.health.gpu_jobs import KEEP_S, GpuJobs
from clusterwatch.collector.health.offenders import FindingHistory
from clusterwatch.collector.rules.model import FIRING, AlertEvent
from clusterwatch.collector.service import CollectorServer
from clusterwatch.collector.state.cluster import JobState
from clusterwatch.v1 import agent_pb2

RULES = '[[escalations]]\non = "gpu"\nwhat = "gpu_throttle"\nin_every_job = 3\nadvice = "check its cooling"\n'
SERIAL = "1320221012345"


def _server(tmp_path: Path) -> CollectorServer:
    rules = tmp_path / "rules.toml"
    rules.write_text(RULES)
    server = CollectorServer(CollectorConfig(db_path=str(tmp_path / "cw.db"), rules_path=str(rules)))
    gpus = [agent_pb2.GpuInfo(uuid="GPU-a", index=0, serial=SERIAL), agent_pb2.GpuInfo(uuid="GPU-b", index=1),
            agent_pb2.GpuInfo(uuid="MIG-b1", index=1, parent_uuid="GPU-b")]
    server.core.hello(agent_pb2.Hello(node="n1", boot_id="b1", agent_version="t", interval_s=1.0, gpus=gpus),
                      authenticated=True)
    return server


def _run_job(server: CollectorServer, job_id: str, gpus: list[str], throttled: bool) -> None:
    """A job on n1's `gpus` (throttled on each while it ran, or not) that ended now, closed by the core."""
    now = time.time()
    job = JobState(job_id, nodes=["n1"], gpus_by_node={"n1": gpus}, start_time=now - 600, end_time=now,
                   state="COMPLETED", exit_code=0)
    server.core.state.jobs[job_id] = job
    if throttled:
        server.alerting.health.handle([AlertEvent(t=now - 300, rule="gpu_throttle", state=FIRING, severity="warning",
                                                  node="n1", gpu=g, job_id=job_id) for g in gpus], now - 300)
    server.core.close_job(job)
    assert job_id not in server.core.state.jobs  # stored and forgotten: the history is all that is left of it


def _offender_alerts(server: CollectorServer) -> list:
    return [a for a in server.alerting.store.active() if a.rule == "gpu_repeat_offender"]


def test_the_collector_keeps_every_jobs_gpus_across_a_restart_and_raises_in_every_job(tmp_path: Path) -> None:
    server = _server(tmp_path)
    _run_job(server, "1", ["GPU-a", "GPU-b"], throttled=True)
    _run_job(server, "2", ["GPU-a", "MIG-b1"], throttled=False)  # on GPU-b's MIG slice: GPU-b held it too
    _run_job(server, "3", ["GPU-a"], throttled=True)
    assert _offender_alerts(server) == []  # GPU-a's job 2 was clean
    conn = server.offenders.conn
    assert conn.execute("SELECT job_id, node, gpu, serial FROM gpu_jobs ORDER BY job_id, gpu").fetchall() == [
        ("1", "n1", "GPU-a", SERIAL), ("1", "n1", "GPU-b", None), ("2", "n1", "GPU-a", SERIAL),
        ("2", "n1", "GPU-b", None), ("2", "n1", "MIG-b1", None), ("3", "n1", "GPU-a", SERIAL)]
    conn.close()
    # the collector restarted on the same file: jobs 3 and 4 and one more throttled make GPU-a's last three
    server = _server(tmp_path)
    _run_job(server, "4", ["GPU-a"], throttled=True)
    assert _offender_alerts(server) == []
    _run_job(server, "5", ["GPU-a"], throttled=True)
    [alert] = _offender_alerts(server)
    assert (alert.node, alert.gpu) == ("n1", "GPU-a")
    assert "in each of its last 3 jobs (3, 4, 5)" in alert.description
    assert server.offenders.figures().flagged_gpus == {("n1", "GPU-a")}


def test_the_history_is_bounded_in_rows_and_in_days(tmp_path: Path) -> None:
    conn = sqlite3.connect(tmp_path / "cw.db")
    FindingHistory(conn)  # the finding_history table last_jobs reads
    jobs = GpuJobs(conn, max_rows=5)
    t0 = 1_800_000_000.0
    jobs.record("old", {("n1", "GPU-a")}, t0 - 60, t0, t0)
    later = t0 + KEEP_S + 1
    jobs.record("1", {("n1", "GPU-a")}, later - 60, later, later)  # the old job is past 90 days: gone
    assert [j for j, _ in jobs.last_jobs("n1", "GPU-a", 10, "gpu_throttle")] == ["1"]
    for i in range(2, 6):
        jobs.record(str(i), {("n1", "GPU-a"), ("n1", "GPU-b")}, later, later + i, later + i)
    # the newest five rows kept: 5 and 4 on each GPU, and job 3's on GPU-b (written after its GPU-a row)
    assert conn.execute("SELECT COUNT(*) FROM gpu_jobs").fetchone() == (5,)
    assert [j for j, _ in jobs.last_jobs("n1", "GPU-a", 10, "gpu_throttle")] == ["5", "4"]
    assert [j for j, _ in jobs.last_jobs("n1", "GPU-b", 10, "gpu_throttle")] == ["5", "4", "3"]


def test_a_job_closed_again_is_one_job_and_a_serial_learnt_later_takes_its_earlier_jobs(tmp_path: Path) -> None:
    conn = sqlite3.connect(tmp_path / "cw.db")
    serials: dict[tuple[str, str], str] = {}
    FindingHistory(conn)  # the finding_history table last_jobs reads
    jobs = GpuJobs(conn, serial_of=lambda n, g: serials.get((n, g), ""))
    t0 = 1_800_000_000.0
    jobs.record("1", {("n1", "GPU-a")}, t0, t0 + 60, t0 + 60)
    jobs.record("1", {("n1", "GPU-a")}, t0, t0 + 90, t0 + 90)  # closed again by a restarted collector
    assert conn.execute("SELECT job_id, ended, serial FROM gpu_jobs").fetchall() == [("1", t0 + 90, None)]
    serials[("n1", "GPU-a")] = SERIAL  # an agent that says serials now
    jobs.record("2", {("n1", "GPU-a")}, t0 + 100, t0 + 200, t0 + 200)
    assert conn.execute("SELECT DISTINCT serial FROM gpu_jobs").fetchall() == [(SERIAL,)]
    # moved to n2 under a new UUID: the board's jobs are one history
    serials[("n2", "GPU-x")] = SERIAL
    jobs.record("3", {("n2", "GPU-x")}, t0 + 300, t0 + 400, t0 + 400)
    assert jobs.last_jobs("n2", "GPU-x", 5, "gpu_throttle") == [("3", False), ("2", False), ("1", False)]
