"""The audit trail of automatic actions: what was done, to which node or job, why, when, on what evidence,
and what came of it; kept in the store, bounded, and counted for /metrics by action and outcome.

An operator asking "why is gpu017 drained?" or "did the checkpoint request go out?" reads it
(`clusterwatch health --history`); a site proves with it what its automation did. Every step of the
Dispatcher (collector/alerting/actions.py) that acts (webhook, command, signal, drain, checkpoint, stop) is
one row, and so is a step that did not run and why (the breaker held it, the node was refused, the
collector cannot reach Slurm).

Steps that run off the ingest thread (in the action lanes) report their outcome later: it is queued here
and written by the collector's own thread (`flush`, each tick), since a lane writing the shared connection
could land in the middle of another writer's transaction.

Table `action_audit` (created if missing)::

    id        INTEGER PRIMARY KEY
    at        REAL    when it was decided (Unix seconds)
    action    TEXT    webhook, command, signal, drain, checkpoint, stop; resume_check, resume (--resume:
                      collector/alerting/resume.py)
    node, job_id, rule, alert_id    its subject and the alert that asked for it
    why       TEXT    the alert, in one line
    evidence  TEXT    JSON: the alert's figures, GPU, process
    outcome   TEXT    queued, done, failed, held, refused, skipped, dropped, asked, passed (a resume's check)
    detail    TEXT    the outcome in words (an error, the breaker's count; a drain done: the Reason= it set)
    updated   REAL    when the outcome was last written
"""
from __future__ import annotations

import collections
import json
import sqlite3
import threading
import time
from typing import NamedTuple

_SCHEMA = """
CREATE TABLE IF NOT EXISTS action_audit (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    at REAL NOT NULL,
    action TEXT NOT NULL,
    node TEXT NOT NULL DEFAULT '',
    job_id TEXT NOT NULL DEFAULT '',
    rule TEXT NOT NULL DEFAULT '',
    alert_id INTEGER,
    why TEXT NOT NULL DEFAULT '',
    evidence TEXT NOT NULL DEFAULT '{}',
    outcome TEXT NOT NULL,
    detail TEXT NOT NULL DEFAULT '',
    updated REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS action_audit_node ON action_audit(node);
"""

#: The outcomes a row can have (a bounded label on /metrics).
OUTCOMES = ("queued", "done", "failed", "held", "refused", "skipped", "dropped", "asked", "passed")
#: Rows kept: the newest; an hour of a thousand nodes all firing is far fewer.
MAX_ROWS = 20_000
_DETAIL_MAX = 500


class AuditRow(NamedTuple):
    """One automatic action as the audit table holds it."""

    id: int
    at: float
    action: str
    node: str
    job_id: str
    rule: str
    alert_id: int | None
    why: str
    evidence: dict
    outcome: str
    detail: str
    updated: float


class ActionAudit:
    """The audit table and the counts by (action, outcome) since this collector started.

    Args:
        conn: the collector's store; the caller owns its thread (record, flush and rows run on it).
        max_rows: the newest rows kept.
    """

    def __init__(self, conn: sqlite3.Connection, max_rows: int = MAX_ROWS) -> None:
        self.conn = conn
        self.max_rows = max_rows
        self.counts: collections.Counter[tuple[str, str]] = collections.Counter()
        self._lock = threading.Lock()
        self._pending: collections.deque[tuple[int, str, str, float]] = collections.deque()
        conn.executescript(_SCHEMA)
        conn.commit()

    def record(self, action: str, *, node: str, job_id: str, rule: str, alert_id: int | None, why: str,
               evidence: dict, outcome: str, detail: str = "", at: float | None = None) -> int:
        """One action decided now, with its first outcome ("queued" when a lane runs it); returns its id."""
        assert outcome in OUTCOMES, outcome
        at = time.time() if at is None else at
        cur = self.conn.execute(
            "INSERT INTO action_audit (at, action, node, job_id, rule, alert_id, why, evidence, outcome, detail,"
            " updated) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
            (at, action, node, job_id, rule, alert_id, why, json.dumps(evidence, default=str), outcome,
             detail[:_DETAIL_MAX], at))
        row_id = int(cur.lastrowid)
        # bounded: the oldest rows go (ids only grow, so this is a range delete)
        self.conn.execute("DELETE FROM action_audit WHERE id <= ?", (row_id - self.max_rows,))
        self.conn.commit()
        if outcome != "queued":  # a queued action is counted by what comes of it (finish)
            with self._lock:
                self.counts[(action, outcome)] += 1
        return row_id

    def finish(self, row_id: int, action: str, outcome: str, detail: str = "") -> None:
        """What came of a queued action; from any thread (written by the next flush)."""
        assert outcome in OUTCOMES, outcome
        with self._lock:
            self._pending.append((row_id, outcome, detail[:_DETAIL_MAX], time.time()))
            self.counts[(action, outcome)] += 1

    def flush(self) -> None:
        """Write the outcomes the lanes reported; on the store's thread."""
        with self._lock:
            done, self._pending = list(self._pending), collections.deque()
        if done:
            self.conn.executemany("UPDATE action_audit SET outcome=?, detail=?, updated=? WHERE id=?",
                                  [(outcome, detail, t, row_id) for row_id, outcome, detail, t in done])
            self.conn.commit()

    def rows(self, limit: int = 100, node: str = "") -> list[AuditRow]:
        """The newest actions first, optionally of one node."""
        self.flush()
        q = "SELECT * FROM action_audit" + (" WHERE node=?" if node else "") + " ORDER BY id DESC LIMIT ?"
        args = (node, limit) if node else (limit,)
        return [AuditRow(*r[:7], r[7], json.loads(r[8] or "{}"), *r[9:]) for r in self.conn.execute(q, args)]

    def count_rows(self) -> dict[tuple[str, str], int]:
        """The actions since start by (action, outcome), each counted once by its final outcome: /metrics."""
        with self._lock:
            return dict(self.counts)
