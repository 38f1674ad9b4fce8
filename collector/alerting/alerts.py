"""The alert table: pending → firing → resolved, kept in SQLite.

Fed by the rule engine's events. The table is the memory of what was said: a
collector that restarts reloads it and neither loses an alert nor sends it again
(each escalation step already run is recorded per alert).

Table `alerts` (created if missing)::

    id           INTEGER PRIMARY KEY      one row per alert occurrence
    key          TEXT    rule|node|pid|start_time|gpu (the subject)
    rule, state, severity, job_id, node, pid, start_time, gpu, rank, description
    figures      TEXT    JSON object (rate_bytes_per_h, growth_for_s, ...)
    started_at   REAL    first pending or firing
    fired_at     REAL    first firing (NULL while only pending)
    resolved_at  REAL    NULL while active
    updated_at   REAL    last change
    steps_done   TEXT    JSON list of escalation step indexes already run

At most one active (unresolved) row per key (a partial unique index).
"""
from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass, field
from typing import Any

from ..rules.model import FIRING, PENDING, RESOLVED, AlertEvent

_SCHEMA = """
CREATE TABLE IF NOT EXISTS alerts (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    key TEXT NOT NULL,
    rule TEXT NOT NULL,
    state TEXT NOT NULL,
    severity TEXT NOT NULL,
    job_id TEXT NOT NULL DEFAULT '',
    node TEXT NOT NULL DEFAULT '',
    pid INTEGER NOT NULL DEFAULT -1,
    start_time REAL NOT NULL DEFAULT 0,
    gpu TEXT NOT NULL DEFAULT '',
    rank INTEGER,
    description TEXT NOT NULL DEFAULT '',
    figures TEXT NOT NULL DEFAULT '{}',
    started_at REAL NOT NULL,
    fired_at REAL,
    resolved_at REAL,
    updated_at REAL NOT NULL,
    steps_done TEXT NOT NULL DEFAULT '[]'
);
CREATE UNIQUE INDEX IF NOT EXISTS alerts_active_key ON alerts(key) WHERE resolved_at IS NULL;
CREATE INDEX IF NOT EXISTS alerts_job ON alerts(job_id);
"""

_COLS = ("id", "key", "rule", "state", "severity", "job_id", "node", "pid", "start_time", "gpu", "rank",
         "description", "figures", "started_at", "fired_at", "resolved_at", "updated_at", "steps_done")


@dataclass
class Alert:
    """One alert occurrence as stored.

    Attributes mirror the table's columns; `figures` is a dict and `steps_done` a
    set of escalation step indexes.
    """

    id: int
    key: str
    rule: str
    state: str
    severity: str
    job_id: str
    node: str
    pid: int
    start_time: float
    gpu: str
    rank: int | None
    description: str
    figures: dict[str, Any]
    started_at: float
    fired_at: float | None
    resolved_at: float | None
    updated_at: float
    steps_done: set[int] = field(default_factory=set)

    def to_dict(self) -> dict[str, Any]:
        """The alert as a JSON-ready dict (what webhooks and commands receive)."""
        d = {c: getattr(self, c) for c in _COLS}
        d["steps_done"] = sorted(self.steps_done)
        return d


def _row(r: tuple) -> Alert:
    d = dict(zip(_COLS, r, strict=True))
    d["figures"] = json.loads(d["figures"] or "{}")
    d["steps_done"] = set(json.loads(d["steps_done"] or "[]"))
    return Alert(**d)


class AlertStore:
    """The lifecycle manager over one SQLite connection.

    Args:
        conn: An open connection; the `alerts` table is created if missing. The
            caller owns the connection (and its thread).
    """

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        conn.executescript(_SCHEMA)
        conn.commit()

    def apply(self, ev: AlertEvent) -> Alert | None:
        """Record one engine event.

        Args:
            ev: The event.

        Returns:
            The alert after the change when its state changed (pending, firing or
            resolved), None when the event changed nothing (a repeat, or a resolve of
            an alert not active). Repeats are what a restarted engine sends; they are
            absorbed here, so they never notify twice.
        """
        key = ev.key
        cur = self._active(key)
        figures = json.dumps(ev.figures, default=str)
        if ev.state == RESOLVED:
            if cur is None:
                return None
            self.conn.execute("UPDATE alerts SET state=?, resolved_at=?, updated_at=?, description=?, "
                              "figures=? WHERE id=?",
                              (RESOLVED, ev.t, ev.t, ev.description or cur.description, figures, cur.id))
            self.conn.commit()
            return self.get(cur.id)
        if ev.state not in (PENDING, FIRING):
            raise ValueError(f"unknown alert state {ev.state!r}")
        if cur is None:
            self.conn.execute(
                "INSERT INTO alerts (key, rule, state, severity, job_id, node, pid, start_time, gpu, rank, "
                "description, figures, started_at, fired_at, updated_at) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                (key, ev.rule, ev.state, ev.severity, ev.job_id, ev.node, ev.pid, ev.start_time, ev.gpu, ev.rank,
                 ev.description, figures, ev.t, ev.t if ev.state == FIRING else None, ev.t))
            self.conn.commit()
            return self._active(key)
        if cur.state == ev.state or (cur.state == FIRING and ev.state == PENDING):
            # A repeat (or a late pending after firing): refresh the figures, no transition.
            self.conn.execute("UPDATE alerts SET description=?, figures=?, severity=? WHERE id=?",
                              (ev.description or cur.description, figures, ev.severity, cur.id))
            self.conn.commit()
            return None
        self.conn.execute("UPDATE alerts SET state=?, fired_at=?, updated_at=?, description=?, figures=?, "
                          "severity=? WHERE id=?",
                          (FIRING, ev.t, ev.t, ev.description or cur.description, figures, ev.severity, cur.id))
        self.conn.commit()
        return self.get(cur.id)

    def refresh(self, ev: AlertEvent) -> bool:
        """Bring an active alert's description, figures and severity up to date (the engine's `refresh`).

        Never a transition and never a new alert: an event whose key has no active row, or whose state
        is not the row's, changes nothing (the engine and the table can disagree for a moment after a
        restart; a refresh must not raise what the engine never announced). Returns whether the row
        changed; an unchanged one is not written.
        """
        cur = self._active(ev.key)
        if cur is None or cur.state != ev.state:
            return False
        figures = json.loads(json.dumps(ev.figures, default=str))
        if cur.description == ev.description and cur.figures == figures and cur.severity == ev.severity:
            return False
        self.conn.execute("UPDATE alerts SET description=?, figures=?, severity=? WHERE id=?",
                          (ev.description, json.dumps(figures), ev.severity, cur.id))
        self.conn.commit()
        return True

    def mark_step_done(self, alert_id: int, step: int) -> None:
        """Record that escalation step `step` ran for an alert (so a restart does not rerun it)."""
        a = self.get(alert_id)
        if a is None:
            return
        a.steps_done.add(step)
        self.conn.execute("UPDATE alerts SET steps_done=? WHERE id=?", (json.dumps(sorted(a.steps_done)), alert_id))
        self.conn.commit()

    def get(self, alert_id: int) -> Alert | None:
        """One alert by id."""
        r = self.conn.execute(f"SELECT {', '.join(_COLS)} FROM alerts WHERE id=?", (alert_id,)).fetchone()
        return None if r is None else _row(r)

    def _active(self, key: str) -> Alert | None:
        r = self.conn.execute(f"SELECT {', '.join(_COLS)} FROM alerts WHERE key=? AND resolved_at IS NULL",
                              (key,)).fetchone()
        return None if r is None else _row(r)

    def active(self, job_id: str | None = None) -> list[Alert]:
        """Alerts pending or firing, oldest first, optionally for one job."""
        q = f"SELECT {', '.join(_COLS)} FROM alerts WHERE resolved_at IS NULL"
        args: tuple = ()
        if job_id is not None:
            q += " AND job_id=?"
            args = (job_id,)
        return [_row(r) for r in self.conn.execute(q + " ORDER BY started_at, id", args)]

    def history(self, limit: int = 100, job_id: str | None = None) -> list[Alert]:
        """The latest alerts, active or resolved, newest first."""
        q = f"SELECT {', '.join(_COLS)} FROM alerts"
        args: tuple = ()
        if job_id is not None:
            q += " WHERE job_id=?"
            args = (job_id,)
        return [_row(r) for r in self.conn.execute(q + " ORDER BY updated_at DESC, id DESC LIMIT ?", (*args, limit))]

    def resolve_missing(self, active_keys: set[str], t: float) -> list[Alert]:
        """After a restart, resolve stored alerts the live engine no longer holds.

        Args:
            active_keys: `AlertEvent.key` of every alert the engine now has pending or firing.
            t: Time of the check.

        Returns:
            The alerts resolved.
        """
        out = []
        for a in self.active():
            if a.key not in active_keys:
                self.conn.execute("UPDATE alerts SET state=?, resolved_at=?, updated_at=? WHERE id=?",
                                  (RESOLVED, t, t, a.id))
                out.append(a)
        self.conn.commit()
        return [x for x in (self.get(a.id) for a in out) if x is not None]
