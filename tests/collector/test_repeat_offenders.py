"""Repeat offenders: the findings kept per GPU and node (90 days, bounded), ranked, and the rules file's
escalations over them and over the drains of the audit trail, in a real SQLite store."""
from __future__ import annotations

import re
import sqlite3
from pathlib import Path

import pytest
from clusterwatch.collector.alerting.audit import ActionAudit
from clusterwatch.collector.health.offenders import KEEP_S, FindingHistory
from clusterwatch.collector.rules.config import parse_rules
from clusterwatch.collector.rules.model import FIRING, RESOLVED, AlertEvent

from clusterwatch.errors import ConfigError
from tests.support.helpers import ROOT

RULES = """\
[[escalations]]
on = "gpu"
what = "gpu_xid"
xid = 48
count = 2
within_s = 86400
advice = "replace the GPU"

[[escalations]]
on = "node"
what = "drain"
count = 3
within_s = 604800
advice = "take the node out"
"""
DAY = 86400.0


def _xid(node: str, gpu: str, xid: int, t: float, job: str = "") -> AlertEvent:
    return AlertEvent(t=t, rule="gpu_xid", state=FIRING, severity="critical", node=node, gpu=gpu, job_id=job,
                      description=f"XID {xid}", figures={"xid": xid})


def _history(tmp_path: Path, max_rows: int = 500_000) -> tuple[sqlite3.Connection, FindingHistory]:
    conn = sqlite3.connect(tmp_path / "cw.db", check_same_thread=False)
    return conn, FindingHistory(conn, parse_rules(RULES).escalations, max_rows=max_rows)


def test_xid_48_twice_on_one_gpu_in_a_day_raises_its_escalation_with_the_evidence(tmp_path: Path) -> None:
    _, h = _history(tmp_path)
    t0 = 1_800_000_000.0
    # one finding hurting two jobs is one finding; another XID and another GPU do not count
    assert h.record([_xid("n1", "GPU-a", 48, t0, "1"), _xid("n1", "GPU-a", 48, t0, "2")], t0) == []
    assert h.record([_xid("n1", "GPU-a", 13, t0 + 60), _xid("n1", "GPU-b", 48, t0 + 60)], t0 + 60) == []
    assert h.record([AlertEvent(t=t0 + 90, rule="gpu_xid", state=RESOLVED, severity="critical", node="n1",
                                gpu="GPU-a", figures={"xid": 48})], t0 + 90) == []
    [alert] = h.record([_xid("n1", "GPU-a", 48, t0 + 3600, "3")], t0 + 3600)
    assert (alert.rule, alert.node, alert.gpu, alert.state, alert.severity) == (
        "gpu_repeat_offender", "n1", "GPU-a", FIRING, "critical")
    assert alert.figures["count"] == 2 and alert.figures["times"] == [t0, t0 + 3600]
    assert alert.description == ("GPU GPU-a on n1: 2 XID 48 findings in 24 h (the rules file's escalation: 2): "
                                 "replace the GPU")
    assert h.record([_xid("n1", "GPU-a", 48, t0 + 7200)], t0 + 7200) == []  # raised once, not on every finding
    # a day apart is not within the day
    assert h.record([_xid("n2", "GPU-c", 48, t0)], t0) == []
    assert h.record([_xid("n2", "GPU-c", 48, t0 + DAY + 1)], t0 + DAY + 1) == []


def test_three_drains_of_a_node_in_a_week_raise_its_escalation(tmp_path: Path) -> None:
    conn, h = _history(tmp_path)
    audit = ActionAudit(conn)
    t0 = 1_800_000_000.0

    def drain(node: str, t: float, outcome: str = "done") -> None:
        audit.record("drain", node=node, job_id="", rule="gpu_lost", alert_id=1, why="gpu_lost", evidence={},
                     outcome=outcome, at=t)

    drain("n1", t0 - 8 * DAY)  # a week and a day ago: out of the window
    drain("n1", t0 - 3 * DAY)
    drain("n1", t0 - DAY, outcome="held")  # held by the breaker: not a drain
    drain("n1", t0 - 60)
    assert h.check_drains("n1", t0) == []
    drain("n1", t0)
    [alert] = h.check_drains("n1", t0)
    assert (alert.rule, alert.node, alert.gpu) == ("node_repeat_offender", "n1", "")
    assert alert.figures["times"] == [t0 - 3 * DAY, t0 - 60, t0] and "take the node out" in alert.description
    gpus, nodes = h.ranking(since=t0 - 30 * DAY)
    assert gpus == [] and [(o.node, o.drains) for o in nodes] == [("n1", 4)]  # held not counted


def test_the_ranking_and_the_bounds(tmp_path: Path) -> None:
    conn, h = _history(tmp_path, max_rows=6)
    t0 = 1_800_000_000.0
    h.record([_xid("n1", "GPU-a", 48, t0 - KEEP_S - 1, "9")], t0 - KEEP_S - 1)
    h.record([_xid("n1", "GPU-a", 79, t0, "1"), _xid("n1", "GPU-a", 79, t0, "2")], t0)
    h.record([_xid("n1", "GPU-a", 13, t0 + 1, "1")], t0 + 1)
    h.record([_xid("n2", "GPU-b", 13, t0 + 2, "3")], t0 + 2)
    # older than 90 days: gone
    assert conn.execute("SELECT COUNT(*) FROM finding_history WHERE job_id='9'").fetchone() == (0,)
    gpus, nodes = h.ranking()
    assert [(o.node, o.gpu, o.findings, o.jobs_hurt) for o in gpus] == [("n1", "GPU-a", 2, 2), ("n2", "GPU-b", 1, 1)]
    assert [(o.node, o.findings, o.jobs_hurt) for o in nodes] == [("n1", 2, 2), ("n2", 1, 1)]
    for i in range(10):
        h.record([_xid("n3", "GPU-c", 13, t0 + 10 + i)], t0 + 10 + i)
    assert conn.execute("SELECT COUNT(*) FROM finding_history").fetchone() == (6,)  # the newest kept


def test_raised_once_holds_across_a_restart_of_the_collector(tmp_path: Path) -> None:
    conn, h = _history(tmp_path)
    t0 = 1_800_000_000.0
    h.record([_xid("n1", "GPU-a", 48, t0)], t0)
    [alert] = h.record([_xid("n1", "GPU-a", 48, t0 + 60)], t0 + 60)
    assert alert.gpu == "GPU-a"
    conn.close()
    # the collector restarted: the store reopened, the escalation is not raised again on the next finding
    conn, h = _history(tmp_path)
    assert h.record([_xid("n1", "GPU-a", 48, t0 + 120)], t0 + 120) == []
    # while another GPU's is raised as before
    h.record([_xid("n1", "GPU-b", 48, t0 + 120)], t0 + 120)
    assert [a.gpu for a in h.record([_xid("n1", "GPU-b", 48, t0 + 180)], t0 + 180)] == ["GPU-b"]
    conn.close()
    # a mark goes with the history it was counted over: after 90 days, two new XIDs raise it again
    conn, h = _history(tmp_path)
    later = t0 + KEEP_S + 3600
    assert h.record([_xid("n1", "GPU-a", 48, later)], later) == []
    assert [a.gpu for a in h.record([_xid("n1", "GPU-a", 48, later + 60)], later + 60)] == ["GPU-a"]
    assert conn.execute("SELECT node, gpu FROM escalation_raised ORDER BY at").fetchall() == [("n1", "GPU-a")]


def test_the_figures_for_metrics_follow_the_findings_the_drains_and_the_flags(tmp_path: Path) -> None:
    from clusterwatch.collector.export.offender_families import OffenderFamilies

    conn, h = _history(tmp_path)
    audit = ActionAudit(conn)
    t0 = 1_800_000_000.0
    assert not any(h.figures())  # nothing kept: no series
    h.record([_xid("n1", "GPU-a", 48, t0, "1"), _xid("n1", "GPU-a", 48, t0, "2")], t0)  # one finding, two jobs
    h.record([_xid("n1", "GPU-a", 48, t0 + 60)], t0 + 60)  # raises GPU-a's escalation
    audit.record("drain", node="n1", job_id="", rule="gpu_xid", alert_id=1, why="w", evidence={}, outcome="done",
                 at=t0 + 61)
    h.check_drains("n1", t0 + 61)
    fig = h.figures()
    assert fig.node_findings == {("n1", "gpu_xid"): 2} and fig.node_drains == {"n1": 1}
    assert fig.gpu_findings == {("n1", "GPU-a"): 2} and fig.flagged_gpus == {("n1", "GPU-a")}
    assert fig.flagged_nodes == frozenset()
    rows = {fam.name: r for fam, r in OffenderFamilies(h.figures).series(fig)}
    assert rows["clusterwatch_gpu_repeat_offender"] == [(("node", "gpu"), ("n1", "GPU-a"), 1.0)]
    assert rows["clusterwatch_node_drains"] == [(("node",), ("n1",), 1.0)]
    # a restarted collector reads them back from the store
    conn.close()
    _, again = _history(tmp_path)
    assert again.figures() == fig


def test_the_mean_time_between_a_gpus_and_a_nodes_findings(tmp_path: Path) -> None:
    _, h = _history(tmp_path)
    t0 = 1_800_000_000.0
    # GPU-a: findings at t0, t0 + 1 h (two rules at one instant, two jobs: one failure), t0 + 3 h
    h.record([_xid("n1", "GPU-a", 79, t0, "1")], t0)
    h.record([_xid("n1", "GPU-a", 48, t0 + 3600, "1"), _xid("n1", "GPU-a", 48, t0 + 3600, "2"),
              AlertEvent(t=t0 + 3600, rule="gpu_lost", state=FIRING, severity="critical", node="n1", gpu="GPU-a")],
             t0 + 3600)
    h.record([_xid("n1", "GPU-a", 13, t0 + 3 * 3600)], t0 + 3 * 3600)
    # GPU-b, on the same node, once: no mean time of its own; the node's times are GPU-a's and GPU-b's
    h.record([_xid("n1", "GPU-b", 13, t0 + 7 * 3600)], t0 + 7 * 3600)
    gpus, nodes = h.ranking()
    assert [(o.gpu, o.findings, o.mtbf_s) for o in gpus] == [("GPU-a", 4, 5400.0), ("GPU-b", 1, None)]
    assert [(o.node, o.findings, o.jobs_hurt, o.mtbf_s) for o in nodes] == [("n1", 5, 2, 7 * 3600 / 3)]
    # a node drained but with no finding kept: ranked, with no mean time
    audit = ActionAudit(h.conn)
    audit.record("drain", node="n2", job_id="", rule="gpu_xid", alert_id=1, why="gpu_xid: XID 48", evidence={},
                 outcome="queued", at=t0)
    _, nodes = h.ranking()
    assert [(o.node, o.findings, o.drains, o.mtbf_s) for o in nodes] == [("n1", 5, 0, 7 * 3600 / 3),
                                                                         ("n2", 0, 1, None)]


EVERY_JOB = '[[escalations]]\non = "gpu"\nwhat = "gpu_throttle"\nin_every_job = 3\nadvice = "check its cooling"\n'


def _throttle(node: str, gpu: str, t: float, job: str) -> AlertEvent:
    return AlertEvent(t=t, rule="gpu_throttle", state=FIRING, severity="warning", node=node, gpu=gpu, job_id=job)


class _Jobs:
    """Jobs run one after another on GPUs, each `throttled` or not: the findings during the job, then its end."""

    def __init__(self, h: FindingHistory, t0: float = 1_800_000_000.0) -> None:
        self.h, self.t, self.n = h, t0, 0

    def run(self, throttled: bool, gpus: tuple[tuple[str, str], ...] = (("n1", "GPU-a"),)) -> list[AlertEvent]:
        """One more job on `gpus`; the escalations its findings and its end raise."""
        self.n += 1
        job, start = str(self.n), self.t
        self.t += 3600
        raised = self.h.record([_throttle(n, g, start + 600, job) for n, g in gpus], start + 600) if throttled else []
        return raised + self.h.job_ended(job, set(gpus), start, self.t, self.t)


def test_a_gpu_that_throttles_in_each_of_its_last_n_jobs_raises_once_with_the_jobs(tmp_path: Path) -> None:
    h = FindingHistory(sqlite3.connect(tmp_path / "cw.db"), parse_rules(EVERY_JOB).escalations)
    jobs = _Jobs(h)
    assert jobs.run(True) == [] and jobs.run(True) == []  # two jobs are fewer than three
    [alert] = jobs.run(True)
    assert (alert.rule, alert.node, alert.gpu, alert.severity) == ("gpu_repeat_offender", "n1", "GPU-a", "critical")
    assert alert.figures["jobs"] == ["1", "2", "3"] and alert.figures["in_every_job"] == 3
    assert alert.description == ("GPU GPU-a on n1: gpu_throttle findings in each of its last 3 jobs (1, 2, 3) "
                                 "(the rules file's escalation: in_every_job = 3): check its cooling")
    assert jobs.run(True) == []  # raised once: its alert stands
    assert h.figures().flagged_gpus == {("n1", "GPU-a")}


def test_a_clean_job_between_the_throttled_ones_raises_nothing(tmp_path: Path) -> None:
    h = FindingHistory(sqlite3.connect(tmp_path / "cw.db"), parse_rules(EVERY_JOB).escalations)
    jobs = _Jobs(h)
    both = (("n1", "GPU-a"), ("n1", "GPU-b"))
    assert jobs.run(True, both) == [] and jobs.run(True, both) == []
    assert jobs.run(False, (("n1", "GPU-a"),)) == []  # GPU-a ran a clean job (GPU-b held none)
    # GPU-a's last three: 2 and 4 throttled, 3 clean; GPU-b's: 1, 2 and 4, each throttled
    [alert] = jobs.run(True, both)
    assert (alert.gpu, alert.figures["jobs"]) == ("GPU-b", ["1", "2", "4"])
    assert jobs.run(True, (("n1", "GPU-a"),)) == []  # 3 (clean), 4, 5
    assert [a.figures["jobs"] for a in jobs.run(True, (("n1", "GPU-a"),))] == [["4", "5", "6"]]


def test_fewer_jobs_than_in_every_job_raise_nothing_however_often_they_throttle(tmp_path: Path) -> None:
    h = FindingHistory(sqlite3.connect(tmp_path / "cw.db"), parse_rules(EVERY_JOB).escalations)
    t0 = 1_800_000_000.0
    # two jobs, each throttled many times, and findings outside any job: still two jobs
    for job in ("1", "2"):
        for i in range(5):
            assert h.record([_throttle("n1", "GPU-a", t0 + i, job), _throttle("n1", "GPU-a", t0 + i, "")], t0 + i) == []
        assert h.job_ended(job, {("n1", "GPU-a")}, t0, t0 + 10, t0 + 10) == []
    assert h.job_ended("1", {("n1", "GPU-a")}, t0, t0 + 20, t0 + 20) == []  # closed again: still one job
    assert h.jobs.last_jobs("n1", "GPU-a", 3, "gpu_throttle") == [("1", True), ("2", True)]


def test_a_finding_that_comes_after_its_jobs_end_completes_the_run(tmp_path: Path) -> None:
    h = FindingHistory(sqlite3.connect(tmp_path / "cw.db"), parse_rules(EVERY_JOB).escalations)
    jobs = _Jobs(h)
    assert jobs.run(True) == [] and jobs.run(True) == [] and jobs.run(False) == []
    # job 3's health batch came after the epilog closed it: its throttle is job 3's all the same
    [alert] = h.record([_throttle("n1", "GPU-a", jobs.t - 60, "3")], jobs.t + 5)
    assert alert.figures["jobs"] == ["1", "2", "3"]


def test_in_every_job_of_one_xid_counts_only_that_xid(tmp_path: Path) -> None:
    rules = '[[escalations]]\non = "gpu"\nwhat = "gpu_xid"\nxid = 79\nin_every_job = 2\n'
    h = FindingHistory(sqlite3.connect(tmp_path / "cw.db"), parse_rules(rules).escalations)
    t0 = 1_800_000_000.0
    for job, xid in (("1", 79), ("2", 13), ("3", 79)):  # job 2 had an XID, not XID 79
        t = t0 + 600 * int(job)
        assert h.record([_xid("n1", "GPU-a", xid, t, job)], t) == []
        assert h.job_ended(job, {("n1", "GPU-a")}, t - 60, t + 60, t + 60) == []
    h.record([_xid("n1", "GPU-a", 79, t0 + 3000, "4")], t0 + 3000)
    [alert] = h.job_ended("4", {("n1", "GPU-a")}, t0 + 2900, t0 + 3100, t0 + 3100)
    assert alert.figures["jobs"] == ["3", "4"] and alert.figures["xid"] == 79
    assert alert.description.startswith("GPU GPU-a on n1: XID 79 findings in each of its last 2 jobs (3, 4)")


def test_a_gpus_jobs_follow_its_serial_to_another_node(tmp_path: Path) -> None:
    serials = {("n1", "GPU-a"): "1320221012345", ("n2", "GPU-a2"): "1320221012345"}  # moved: a new UUID too
    h = FindingHistory(sqlite3.connect(tmp_path / "cw.db"), parse_rules(EVERY_JOB).escalations,
                       serial_of=lambda n, g: serials.get((n, g), ""))
    jobs = _Jobs(h)
    assert jobs.run(True) == [] and jobs.run(True) == []
    [alert] = jobs.run(True, (("n2", "GPU-a2"),))
    assert (alert.node, alert.gpu, alert.figures["jobs"]) == ("n2", "GPU-a2", ["1", "2", "3"])
    assert jobs.run(True) == []  # back on n1: the board's escalation stands


def test_the_escalations_docs_health_shows_load_as_it_says() -> None:
    text = (ROOT / "docs" / "health.md").read_text()
    examples = [parse_rules(t).escalations for t in re.findall(r"```toml\n(\[\[escalations]].*?)```", text, re.S)]
    assert [(e.what, e.count, e.in_every_job) for es in examples for e in es] == [
        ("gpu_xid", 2, 0), ("drain", 3, 0), ("gpu_throttle", 0, 3)]


@pytest.mark.parametrize("body, says", [
    ('on = "gpu"\nwhat = "drain"\ncount = 3\nwithin_s = 60', "drains are of a node"),
    ('on = "node"\nwhat = "gpu_lost"\nxid = 48\ncount = 3\nwithin_s = 60', "xid counts with"),
    ('on = "rack"\nwhat = "gpu_lost"\ncount = 3\nwithin_s = 60', "on"),
    ('on = "gpu"\nwhat = "gpu_throttle"\nin_every_job = "all"', r"<rules>: line 4: .*in_every_job must be a number"),
    ('on = "gpu"\nwhat = "gpu_throttle"\nin_every_job = inf', "in_every_job must be a whole number, not inf"),
    ('on = "gpu"\nwhat = "gpu_throttle"\nin_every_job = 0', "in_every_job must be a whole number of jobs from 1"),
    ('on = "gpu"\nwhat = "gpu_throttle"\nin_every_job = 21', "from 1 to 20"),
    ('on = "gpu"\nwhat = "gpu_throttle"\nin_every_job = -2', "in_every_job must not be negative"),
    ('on = "node"\nwhat = "gpu_throttle"\nin_every_job = 3', 'line 2: .*held a GPU: on = "gpu"'),
    ('on = "gpu"\nwhat = "fabric_port"\nin_every_job = 3', "a GPU's own findings"),
    ('on = "gpu"\nwhat = "gpu_throttle"\nin_every_job = 3\nwithin_s = 60', "line 5: .*drop within_s"),
    ('on = "gpu"\nwhat = "gpu_throttle"\nwithin_s = 60', r"needs count \(or in_every_job = N\)"),
    ('on = "gpu"\nwhat = "gpu_throttle"\ncount = 2', "needs within_s"),
])
def test_a_wrong_escalation_is_refused_with_the_key(body: str, says: str) -> None:
    with pytest.raises(ConfigError, match=says) as refused:
        parse_rules("[[escalations]]\n" + body)
    assert "\n" not in str(refused.value)


def test_a_gpu_is_kept_by_its_serial_and_keeps_its_record_moved_to_another_node(tmp_path: Path) -> None:
    conn = sqlite3.connect(tmp_path / "cw.db")
    # a store from before serials: its table has no serial column, and opens all the same
    conn.execute("CREATE TABLE finding_history (id INTEGER PRIMARY KEY AUTOINCREMENT, at REAL NOT NULL, "
                 "node TEXT NOT NULL, gpu TEXT NOT NULL DEFAULT '', rule TEXT NOT NULL, xid INTEGER, "
                 "job_id TEXT NOT NULL DEFAULT '')")
    t0 = 1_800_000_000.0
    conn.execute("INSERT INTO finding_history (at, node, gpu, rule, xid, job_id) VALUES (?,?,?,?,?,?)",
                 (t0 - 60, "n1", "GPU-a", "gpu_xid", 48, "1"))
    conn.commit()
    serials = {("n1", "GPU-a"): "1320221012345", ("n2", "GPU-a2"): "1320221012345"}  # moved: a new UUID too
    h = FindingHistory(conn, parse_rules(RULES).escalations, serial_of=lambda n, g: serials.get((n, g), ""))
    assert h.record([_xid("n1", "GPU-a", 13, t0, "2"), _xid("n1", "GPU-c", 13, t0)], t0) == []
    # the old row took the serial; a GPU without one keeps none (NULL, not "")
    assert conn.execute("SELECT gpu, serial FROM finding_history ORDER BY id").fetchall() == [
        ("GPU-a", "1320221012345"), ("GPU-a", "1320221012345"), ("GPU-c", None)]
    # on n2 the board's second XID 48 within the day is its second: the escalation counts by serial
    [alert] = h.record([_xid("n2", "GPU-a2", 48, t0 + 600, "3")], t0 + 600)
    assert (alert.node, alert.gpu, alert.figures["times"]) == ("n2", "GPU-a2", [t0 - 60, t0 + 600])
    gpus, nodes = h.ranking()
    assert [(o.node, o.gpu, o.serial, o.findings, o.jobs_hurt) for o in gpus] == [
        ("n2", "GPU-a2", "1320221012345", 3, 3), ("n1", "GPU-c", "", 1, 0)]
    assert {o.node: o.findings for o in nodes} == {"n1": 3, "n2": 1}
    # reopened (the collector restarted): the column is there, the mark stands across the move back
    h2 = FindingHistory(conn, parse_rules(RULES).escalations, serial_of=lambda n, g: serials.get((n, g), ""))
    assert h2.record([_xid("n1", "GPU-a", 48, t0 + 900)], t0 + 900) == []


def test_the_ranking_counts_the_jobs_that_held_a_gpu_beside_those_hurt(tmp_path: Path) -> None:
    """Five finished jobs held GPU-a, two of them hurt, and a running job is hurt now: hurt 3 of 6 held; the
    node's jobs are its GPUs'. A job before the ranking's `since` is not counted."""
    conn, h = _history(tmp_path)
    t0 = 1_800_000_000.0
    h.job_ended("0", [("n1", "GPU-a")], t0 - 20 * DAY - 3600, t0 - 20 * DAY, t0 - 20 * DAY)
    for i in range(5):
        h.job_ended(str(i + 1), [("n1", "GPU-a"), ("n1", "GPU-b")], t0 + 3600 * i, t0 + 3600 * i + 3000,
                    t0 + 3600 * i + 3000)
    h.record([_xid("n1", "GPU-a", 13, t0 + 100, "2"), _xid("n1", "GPU-a", 13, t0 + 7300, "3")], t0 + 7300)
    h.record([_xid("n1", "GPU-a", 13, t0 + 20000, "running")], t0 + 20000)
    gpus, nodes = h.ranking(since=t0 - DAY)
    assert [(o.gpu, o.jobs_hurt, o.jobs_held) for o in gpus] == [("GPU-a", 3, 6)]
    assert [(o.node, o.jobs_hurt, o.jobs_held) for o in nodes] == [("n1", 3, 6)]
    gpus, _ = h.ranking()
    assert gpus[0].jobs_held == 7
