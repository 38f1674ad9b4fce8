"""Repeat offenders: every health finding kept per GPU and node for 90 days, and escalation over that history.

A GPU that logs XID 48 once may have met a cosmic ray; twice in a day it is failing. A node drained three
times in a week is not being repaired by a reboot. The findings the health rules raise (collector/health)
are one row each here, in the collector's store, so the history outlives a restart; the drains are the audit
trail's (collector/alerting/audit.py). The rules file's `[[escalations]]` say what count, within what
window, raises `gpu_repeat_offender` or `node_repeat_offender`, with the evidence in the alert's figures; or,
with `in_every_job = N`, which finding in each of a GPU's last N jobs raises it (the jobs that held each GPU,
clean ones too, are gpu_jobs.py's).

Table `finding_history` (created if missing)::

    id        INTEGER PRIMARY KEY
    at        REAL    when the finding was raised (Unix seconds)
    node, gpu TEXT    where ("" gpu: a node's finding, a port's or an NVSwitch's)
    rule      TEXT    gpu_xid, gpu_lost, ...
    xid       INTEGER the XID, for gpu_xid; NULL otherwise
    job_id    TEXT    a job it hurt ("" none); one row a job, so a finding on a GPU two jobs share is two rows
    serial    TEXT    the GPU's board serial where NVML gives one (its agent's inventory); NULL otherwise, and in
                      a store from before it (the column is added when missing)

A GPU is kept by its serial where known: moved to another node, its record follows it (the ranking, the
escalations); without one, by its node and UUID.

Table `escalation_raised`: an escalation raised on a GPU or node is raised once, and this says so across a
restart of the collector (the alert stands in the alert table; saying it again on every later finding would
notify, or drain, again). A mark goes with the history it was counted over, after 90 days::

    escalation TEXT   the escalation, by what defines it (on:what:xid:count:within_s, then :jobsN with
                      in_every_job)
    node, gpu  TEXT   its subject ("" gpu: a node's)
    at         REAL   when it was raised
"""
from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable
from typing import NamedTuple

from ..rules.config import Escalation
from ..rules.model import FIRING, AlertEvent
from .gpu_jobs import GpuJobs

_SCHEMA = """
CREATE TABLE IF NOT EXISTS finding_history (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    at REAL NOT NULL,
    node TEXT NOT NULL,
    gpu TEXT NOT NULL DEFAULT '',
    rule TEXT NOT NULL,
    xid INTEGER,
    job_id TEXT NOT NULL DEFAULT '',
    serial TEXT
);
CREATE INDEX IF NOT EXISTS finding_history_gpu ON finding_history(gpu, at);
CREATE INDEX IF NOT EXISTS finding_history_node ON finding_history(node, at);
CREATE TABLE IF NOT EXISTS escalation_raised (
    escalation TEXT NOT NULL,
    node TEXT NOT NULL,
    gpu TEXT NOT NULL DEFAULT '',
    at REAL NOT NULL,
    PRIMARY KEY (escalation, node, gpu)
);
"""

KEEP_S = 90 * 86400.0
#: Rows kept at most, whatever the 90 days hold: a thousand nodes' worth of a bad month, a few tens of MB.
MAX_ROWS = 500_000
#: The health rules' findings that count (the escalation alerts themselves never do).
FINDING_RULES = ("gpu_xid", "gpu_lost", "gpu_memory_errors", "gpu_throttle", "gpu_link_errors", "fabric_port",
                 "nvswitch_sxid")
GPU_REPEAT = "gpu_repeat_offender"
NODE_REPEAT = "node_repeat_offender"


class Offender(NamedTuple):
    """A GPU or node ranked by its history: findings, drains (nodes), distinct jobs hurt, and the mean time
    between its findings (None with fewer than two; findings at one instant, on several GPUs or rules, are one);
    the distinct jobs that held it (gpu_jobs' finished jobs and the jobs hurt), so "hurt" reads as a share."""

    node: str
    gpu: str
    findings: int
    drains: int
    jobs_hurt: int
    mtbf_s: float | None = None
    serial: str = ""  # a GPU's board serial where known ("" none, and for a node)
    jobs_held: int = 0


class OffenderFigures(NamedTuple):
    """What /metrics shows of the history (collector/export/offender_families.py)."""

    node_findings: dict[tuple[str, str], int]   # (node, rule): findings kept
    node_drains: dict[str, int]                 # node: drains in the audit trail
    flagged_nodes: frozenset[str]               # node_repeat_offender raised
    gpu_findings: dict[tuple[str, str], int]    # (node, gpu): findings kept
    flagged_gpus: frozenset[tuple[str, str]]    # (node, gpu): gpu_repeat_offender raised


class FindingHistory:
    """The findings table, its ranking and the escalations over it and over the jobs each GPU held (`jobs`).

    Args:
        conn: the collector's store (the action_audit table, for drains, is in it too); the caller owns its thread.
        escalations: the rules file's.
        serial_of: a GPU's board serial, by (node, UUID), as its agent said it ("" unknown).
    """

    def __init__(self, conn: sqlite3.Connection, escalations: tuple[Escalation, ...] = (),
                 max_rows: int = MAX_ROWS, serial_of: Callable[[str, str], str] | None = None) -> None:
        self.conn = conn
        self.escalations = escalations
        self.max_rows = max_rows
        self.serial_of = serial_of
        conn.executescript(_SCHEMA)
        self.jobs = GpuJobs(conn, serial_of)
        if "serial" not in {r[1] for r in conn.execute("PRAGMA table_info(finding_history)")}:
            conn.execute("ALTER TABLE finding_history ADD COLUMN serial TEXT")  # a store from before serials
        conn.execute("CREATE INDEX IF NOT EXISTS finding_history_serial ON finding_history(serial, at)")
        conn.commit()
        self._lock = threading.Lock()
        self._figures = self._read_figures()

    def figures(self) -> OffenderFigures:
        """The figures as of the last finding or drain (read on the scrape's thread, written on the caller's)."""
        with self._lock:
            return self._figures

    def _refresh(self) -> None:
        figures = self._read_figures()
        with self._lock:
            self._figures = figures

    def _read_figures(self) -> OffenderFigures:
        c = self.conn
        drains = dict(c.execute("SELECT node, COUNT(*) FROM action_audit WHERE action='drain' AND outcome IN "
                                "('queued', 'done') GROUP BY node")) if self._has_audit() else {}
        raised = c.execute("SELECT node, gpu FROM escalation_raised").fetchall()
        return OffenderFigures(
            {(n, r): k for n, r, k in c.execute("SELECT node, rule, COUNT(DISTINCT gpu || at) FROM finding_history "
                                                "GROUP BY node, rule")},
            drains, frozenset(n for n, g in raised if not g),
            {(n, g): k for n, g, k in c.execute("SELECT node, gpu, COUNT(DISTINCT rule || at) FROM finding_history "
                                                "WHERE gpu != '' GROUP BY node, gpu")},
            frozenset((n, g) for n, g in raised if g))

    def record(self, events: list[AlertEvent], now: float) -> list[AlertEvent]:
        """Keep the health findings among `events` (those firing); returns the escalations they raise."""
        rows = [(e.t, e.node, e.gpu if e.rule != "fabric_port" else "", e.rule,
                 e.figures.get("xid") if e.rule == "gpu_xid" else None, e.job_id)
                for e in events if e.state == FIRING and e.rule in FINDING_RULES]
        if not rows:
            return []
        serials = {(n, g): self._serial_now(n, g) for _, n, g, *_ in rows}
        self.conn.executemany("INSERT INTO finding_history (at, node, gpu, rule, xid, job_id, serial) "
                              "VALUES (?,?,?,?,?,?,?)", [(*r, serials[(r[1], r[2])]) for r in rows])
        for (n, g), serial in serials.items():
            if serial:  # its findings from before the serial was known (an older agent or store) are its too
                self.conn.execute("UPDATE finding_history SET serial=? WHERE node=? AND gpu=? AND serial IS NULL",
                                  (serial, n, g))
        last = self.conn.execute("SELECT MAX(id) FROM finding_history").fetchone()[0]
        self.conn.execute("DELETE FROM finding_history WHERE id <= ? OR at < ?", (last - self.max_rows,
                                                                                  now - KEEP_S))
        self.conn.execute("DELETE FROM escalation_raised WHERE at < ?", (now - KEEP_S,))
        self.conn.commit()
        subjects = {(r[1], r[2]) for r in rows}
        # a finding of a job already closed (its health batch came after the job's end) may complete a run
        found = [e for e in self.escalations if e.what != "drain"]
        raised = [a for node, gpu in sorted(subjects) for a in self._check(node, gpu, now, found)]
        self._refresh()
        return raised

    def job_ended(self, job_id: str, gpus: set[tuple[str, str]], started: float, ended: float,
                  now: float) -> list[AlertEvent]:
        """Keep that job `job_id` held `gpus` ((node, UUID) pairs); returns the in_every_job escalations its end
        raises (the job is the last of its GPUs' jobs now)."""
        self.jobs.record(job_id, gpus, started, ended, now)
        every_job = [e for e in self.escalations if e.in_every_job]
        if not every_job:
            return []
        raised = [a for node, gpu in sorted(gpus) for a in self._check(node, gpu, now, every_job)]
        self._refresh()
        return raised

    def _serial_now(self, node: str, gpu: str) -> str | None:
        if not gpu or self.serial_of is None:
            return None
        return self.serial_of(node, gpu) or None

    def _serial(self, node: str, gpu: str) -> str | None:
        """The serial the GPU's findings are kept by (its latest finding's), None unknown."""
        row = self.conn.execute("SELECT serial FROM finding_history WHERE node=? AND gpu=? AND serial IS NOT NULL "
                                "ORDER BY at DESC LIMIT 1", (node, gpu)).fetchone()
        return row[0] if row else None

    def check_drains(self, node: str, now: float) -> list[AlertEvent]:
        """The escalations a drain of `node` raises (called once the drain is decided)."""
        raised = self._check(node, "", now, [e for e in self.escalations if e.what == "drain"])
        self._refresh()
        return raised

    def _check(self, node: str, gpu: str, now: float, escalations: list[Escalation]) -> list[AlertEvent]:
        out = []
        for esc in escalations:
            subject_gpu = gpu if esc.on == "gpu" else ""
            if esc.on == "gpu" and not gpu:
                continue
            key = (_key(esc), node, subject_gpu)
            serial = None
            if esc.on == "gpu":  # the board its history is kept by: that of its jobs, or of its findings
                serial = self.jobs.serial(node, gpu) if esc.in_every_job else self._serial(node, gpu)
            if self.conn.execute("SELECT 1 FROM escalation_raised WHERE escalation=? AND node=? AND gpu=?",
                                 key).fetchone() or (serial and self._raised_on_serial(key[0], serial)):
                continue  # raised once (before a restart too), not on every later finding: its alert stands
            alert = self._job_alert(esc, node, gpu, now) if esc.in_every_job else self._count_alert(
                esc, node, subject_gpu, now, serial)
            if alert is None:
                continue
            self.conn.execute("INSERT INTO escalation_raised (escalation, node, gpu, at) VALUES (?,?,?,?)",
                              (*key, now))
            self.conn.commit()
            out.append(alert)
        return out

    def _count_alert(self, esc: Escalation, node: str, gpu: str, now: float, serial: str | None) -> AlertEvent | None:
        """The alert of a `count` within `within_s` escalation, None while fewer are in the window."""
        times = self._times(esc, node, gpu, now, serial)
        return _alert(esc, node, gpu, times, now) if len(times) >= esc.count else None

    def _job_alert(self, esc: Escalation, node: str, gpu: str, now: float) -> AlertEvent | None:
        """The alert of an in_every_job escalation: None while the GPU has held fewer jobs than it counts, or
        one of them (a clean job between throttled ones too) had no `what` finding on it."""
        jobs = self.jobs.last_jobs(node, gpu, esc.in_every_job, esc.what, esc.xid)
        if len(jobs) < esc.in_every_job or not all(hit for _, hit in jobs):
            return None
        return _every_job_alert(esc, node, gpu, [job_id for job_id, _ in reversed(jobs)], now)

    def _raised_on_serial(self, escalation: str, serial: str) -> bool:
        """Whether the escalation stands on the board `serial` under another node or UUID (a GPU moved)."""
        return self.conn.execute(
            "SELECT 1 FROM escalation_raised r WHERE escalation=? AND gpu != '' AND EXISTS (SELECT 1 FROM "
            "finding_history h WHERE h.node=r.node AND h.gpu=r.gpu AND h.serial=?)", (escalation, serial)
        ).fetchone() is not None

    def _times(self, esc: Escalation, node: str, gpu: str, now: float, serial: str | None = None) -> list[float]:
        """When each counted event within the window happened (a finding on several jobs' GPU counts once); a GPU's
        by its serial where known, on whichever node it was."""
        since = now - esc.within_s
        if esc.what == "drain":
            q = ("SELECT at FROM action_audit WHERE action='drain' AND outcome IN ('queued', 'done') AND node=? "
                 "AND at > ? ORDER BY at")
            return [t for (t,) in self.conn.execute(q, (node, since))]
        if serial:
            q = "SELECT DISTINCT at FROM finding_history WHERE serial=? AND rule=? AND at > ?"
            args: list = [serial, esc.what, since]
        else:
            q = "SELECT DISTINCT at FROM finding_history WHERE node=? AND rule=? AND at > ?"
            args = [node, esc.what, since]
            if esc.on == "gpu":
                q += " AND gpu=?"
                args.append(gpu)
        if esc.xid:
            q += " AND xid=?"
            args.append(esc.xid)
        return [t for (t,) in self.conn.execute(q + " ORDER BY at", args)]

    def ranking(self, node: str = "", since: float = 0.0, limit: int = 20) -> tuple[list[Offender], list[Offender]]:
        """The GPUs and the nodes with the most findings (then drains, then jobs hurt) since `since`."""
        where, args = "at > ?", [since]
        if node:
            where += " AND node=?"
            args.append(node)
        # a GPU by its serial where known (moved, it is one: shown where its latest finding was), else node and UUID
        gpus = [Offender(*latest.split("\x1f", 2)[1:], f, 0, j, m, s or "") for f, j, m, s, latest in self.conn.execute(
            f"SELECT COUNT(DISTINCT rule || at), COUNT(DISTINCT NULLIF(job_id, '')), {_MTBF}, MAX(serial), "
            "MAX(printf('%017.6f', at) || char(31) || node || char(31) || gpu) "
            f"FROM finding_history WHERE {where} AND gpu != '' "
            "GROUP BY COALESCE('s' || serial, 'u' || node || char(31) || gpu)", args)]
        gpus.sort(key=lambda o: (-o.findings, -o.jobs_hurt, o.node, o.gpu))
        gpus = [o._replace(jobs_held=self._held(*(("serial=?", [o.serial]) if o.serial
                                                  else ("node=? AND gpu=?", [o.node, o.gpu])), since))
                for o in gpus[:limit]]
        findings = {n: (f, j, m) for n, f, j, m in self.conn.execute(
            f"SELECT node, COUNT(DISTINCT gpu || rule || at), COUNT(DISTINCT NULLIF(job_id, '')), {_MTBF} "
            f"FROM finding_history WHERE {where} GROUP BY node", args)}
        drains = dict(self.conn.execute(
            "SELECT node, COUNT(*) FROM action_audit WHERE action='drain' AND outcome IN ('queued', 'done') "
            f"AND {where} GROUP BY node", args)) if self._has_audit() else {}
        nodes = []
        for n in set(findings) | set(drains):
            count, jobs, mtbf = findings.get(n, (0, 0, None))
            nodes.append(Offender(n, "", count, drains.get(n, 0), jobs, mtbf))
        nodes.sort(key=lambda o: (-o.findings, -o.drains, -o.jobs_hurt, o.node))
        return gpus, [o._replace(jobs_held=self._held("node=?", [o.node], since)) for o in nodes[:limit]]

    def _held(self, where: str, args: list, since: float) -> int:
        """The distinct jobs that held a GPU (or a node's GPUs) since `since`: those finished (gpu_jobs) and those
        its findings hurt (a running job is not in gpu_jobs yet)."""
        return self.conn.execute(
            f"SELECT COUNT(*) FROM (SELECT job_id FROM gpu_jobs WHERE {where} AND ended > ? UNION "
            f"SELECT job_id FROM finding_history WHERE {where} AND at > ? AND job_id != '')",
            [*args, since, *args, since]).fetchone()[0]

    def _has_audit(self) -> bool:
        return self.conn.execute("SELECT 1 FROM sqlite_master WHERE name='action_audit'").fetchone() is not None


def _key(esc: Escalation) -> str:
    """An escalation by what defines it, not by its place in the rules file (a file edited keeps its marks)."""
    key = f"{esc.on}:{esc.what}:{esc.xid}:{esc.count}:{esc.within_s:g}"
    return f"{key}:jobs{esc.in_every_job}" if esc.in_every_job else key  # the other escalations keep their marks


#: Mean time between a group's findings: the span of their distinct times over the gaps between them.
_MTBF = "CASE WHEN COUNT(DISTINCT at) > 1 THEN (MAX(at) - MIN(at)) / (COUNT(DISTINCT at) - 1) END"


def _alert(esc: Escalation, node: str, gpu: str, times: list[float], now: float) -> AlertEvent:
    what = "drains" if esc.what == "drain" else (f"XID {esc.xid}" if esc.xid else esc.what) + " findings"
    where = f"GPU {gpu} on {node}" if gpu else f"node {node}"
    window = f"{esc.within_s / 3600:g} h" if esc.within_s < 2 * 86400 else f"{esc.within_s / 86400:g} days"
    text = f"{where}: {len(times)} {what} in {window} (the rules file's escalation: {esc.count})"
    return AlertEvent(t=now, rule=GPU_REPEAT if esc.on == "gpu" else NODE_REPEAT, state=FIRING,
                      severity=esc.severity, node=node, gpu=gpu,
                      description=text + (f": {esc.advice}" if esc.advice else ""),
                      figures={"count": len(times), "within_s": esc.within_s, "what": esc.what, "xid": esc.xid or None,
                               "times": times[-20:], "advice": esc.advice})


def _every_job_alert(esc: Escalation, node: str, gpu: str, jobs: list[str], now: float) -> AlertEvent:
    what = (f"XID {esc.xid}" if esc.xid else esc.what) + " findings"
    text = (f"GPU {gpu} on {node}: {what} in each of its last {len(jobs)} jobs ({', '.join(jobs)}) "
            f"(the rules file's escalation: in_every_job = {esc.in_every_job})")
    return AlertEvent(t=now, rule=GPU_REPEAT, state=FIRING, severity=esc.severity, node=node, gpu=gpu,
                      description=text + (f": {esc.advice}" if esc.advice else ""),
                      figures={"count": len(jobs), "in_every_job": esc.in_every_job, "what": esc.what,
                               "xid": esc.xid or None, "jobs": jobs, "advice": esc.advice})
