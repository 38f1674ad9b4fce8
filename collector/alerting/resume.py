"""Resume a node clusterwatch drained, once it is repaired and a check passes (`--resume`, off by default).

Only a drain clusterwatch made is ever undone: the audit trail (collector/alerting/audit.py) holds each drain
done with the Reason= it set, and Slurm, asked just before the resume, must still show the node drained with
exactly that reason. A node a person drained, or drained again with their own reason, stays as they left it:
the resume is refused, and said so.

For each node whose latest drain is clusterwatch's and not yet undone, every `CHECK_EVERY_S`:

1. The repair, noticed: the agent's hello carries a new boot id (the agent restarted: a reboot, a reinstall),
   or the node's GPUs have had no standing health finding and no new one for `after_s` (`--resume-after`).
2. The check: a repeat offender is refused for good (resumed by clusterwatch and drained again within
   `window_s`, `--resume-window`, or a repeat-offender escalation standing on it): a person looks at it. It
   waits while the node's agent is not connected and reporting, or not authenticated (what an unproven
   stream says resumes nothing), while a GPU of the node has a standing finding, and while the drain
   circuit breaker (collector/alerting/breaker.py) has held a drain within its window (nodes failing together:
   not the moment to put one back). A resumed node's drain still counts in the breaker's window.
3. The resume: `scontrol update NodeName=X State=RESUME`, through the same node-name checks as a drain.

Every step is a row of the audit trail: `resume_check` (passed, or failed with why: written when its why
changes, not every pass), `resume` (queued, then done, failed, refused or skipped), counted on /metrics.
Slurm is asked on a thread of its own, one node at a time, so the collector's tick never waits on scontrol.

Table `resume_watch` (created if missing): the agent's boot id when each drain was first seen here, so a
restarted collector still notices a reboot that happened while it was down::

    drain_id INTEGER PRIMARY KEY    the drain's audit row
    node     TEXT
    boot_id  TEXT                   "" when no agent had said hello
"""
from __future__ import annotations

import logging
import sqlite3
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

from clusterwatch.humanize import duration
from clusterwatch.slurm.node_drain import NodeDrain

from ..health.offenders import GPU_REPEAT, NODE_REPEAT
from ..state.core import CoreListener
from .audit import ActionAudit

log = logging.getLogger("clusterwatch.alerts")

CHECK_EVERY_S = 5.0
#: After a resume that failed (Slurm did not answer), the next try waits this long.
RETRY_S = 60.0
DEFAULT_AFTER_S = 900.0
DEFAULT_WINDOW_S = 86400.0
_FINAL = ("done", "refused", "skipped")  # a resume outcome that closes its drain
_SCHEMA = """
CREATE TABLE IF NOT EXISTS resume_watch (
    drain_id INTEGER PRIMARY KEY,
    node TEXT NOT NULL,
    boot_id TEXT NOT NULL DEFAULT ''
);
"""


class SlurmNodes(Protocol):
    """What a resume asks of Slurm (blocking; called on the resumer's own thread)."""

    def node_drain(self, node: str) -> NodeDrain: ...

    def resume_node(self, node: str) -> None: ...


@dataclass(frozen=True, slots=True)
class ResumeSettings:
    """--resume-after and --resume-window, and the breaker's window (its held drains make resumes wait)."""

    after_s: float = DEFAULT_AFTER_S
    window_s: float = DEFAULT_WINDOW_S
    breaker_window_s: float = 3600.0
    down_after_intervals: float = 3.0


@dataclass(frozen=True, slots=True)
class _Drain:
    id: int
    node: str
    at: float
    reason: str


class Resumer(CoreListener):
    """Watches clusterwatch's drains and resumes each repaired node whose check passes.

    Args:
        conn: the collector's store (action_audit, alerts and finding_history are in it); the caller's thread.
        audit: the audit trail the steps are written to.
        state: the cluster state (each node's agent: boot id, connection, last seen, authentication).
        health: the health engine (the standing findings of a node's GPUs).
        slurm: asks Slurm for a node's drain and resumes it.
        settings: the waits and windows.
        node_trusted: whether a node's agent is authenticated; None: every node.
        clock: Unix time, read on the Slurm thread when a resume fails (its retry is due `RETRY_S` after);
            the collector core's clock, which drives `on_tick`'s `now`.
    """

    def __init__(self, conn: sqlite3.Connection, audit: ActionAudit, state: Any, health: Any, slurm: SlurmNodes,
                 settings: ResumeSettings, node_trusted: Callable[[str], bool] | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.conn = conn
        self.audit = audit
        self.state = state
        self.health = health
        self.slurm = slurm
        self.settings = settings
        self.node_trusted = node_trusted
        self.clock = clock
        self._checked = 0.0
        self._said: dict[int, str] = {}  # drain id -> the last check written for it
        self._retry_at: dict[int, float] = {}  # drain id -> not before (a resume that failed)
        self._busy: dict[str, Future] = {}  # node -> its resume on the Slurm thread
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="cw-resume")
        conn.executescript(_SCHEMA)
        conn.commit()

    # -- the tick ----------------------------------------------------------------------------------

    def on_tick(self, now: float) -> None:
        if now - self._checked < CHECK_EVERY_S:
            return
        self._checked = now
        finished = [node for node, fut in self._busy.items() if fut.done()]
        self.audit.flush()  # what the Slurm thread reported, before its nodes are looked at again
        for node in finished:
            del self._busy[node]
        for drain in self._open_drains():
            if drain.node in self._busy or now < self._retry_at.get(drain.id, 0.0):
                continue
            try:
                self._consider(drain, now)
            except Exception:  # one node's trouble must not stop the others', nor the tick
                log.exception("resume of %s: the check failed", drain.node)

    def _open_drains(self) -> list[_Drain]:
        """Each node's latest drain done by clusterwatch that no resume has closed since."""
        latest: dict[str, tuple] = {}
        for row in self.conn.execute(
                "SELECT id, node, at, detail, action FROM action_audit WHERE node != '' AND "
                "((action='drain' AND outcome='done') OR (action='resume' AND outcome IN (?,?,?))) ORDER BY id",
                _FINAL):
            latest[row[1]] = row
        return [_Drain(r[0], r[1], r[2], r[3]) for r in latest.values() if r[4] == "drain"]

    def _consider(self, drain: _Drain, now: float) -> None:
        boot_then = self._boot_at_drain(drain)
        repaired = self._repaired(drain, boot_then, now)
        if repaired is None:
            return
        final, why = self._check(drain, now)
        if final:  # a repeat offender: said once, and its drain closed
            self._record("resume_check", drain, now, "failed", why, repaired)
            self._record("resume", drain, now, "refused", why, repaired)
            log.warning("not resuming %s: %s", drain.node, why)
            return
        if why:
            if self._said.get(drain.id) != why.split(":")[0]:
                self._said[drain.id] = why.split(":")[0]
                self._record("resume_check", drain, now, "failed", why, repaired)
                log.info("resume of %s waits: %s", drain.node, why)
            return
        self._said.pop(drain.id, None)
        self._record("resume_check", drain, now, "passed", repaired, repaired)
        row = self._record("resume", drain, now, "queued", "", repaired)
        self._busy[drain.node] = self._pool.submit(self._resume, drain, row)

    # -- the repair and the check ------------------------------------------------------------------

    def _boot_at_drain(self, drain: _Drain) -> str:
        """The node's agent boot id when this drain was first seen (kept in the store)."""
        got = self.conn.execute("SELECT boot_id FROM resume_watch WHERE drain_id=?", (drain.id,)).fetchone()
        if got is not None:
            return got[0]
        ns = self.state.nodes.get(drain.node)
        boot = ns.boot_id if ns is not None else ""
        self.conn.execute("INSERT INTO resume_watch VALUES (?,?,?)", (drain.id, drain.node, boot))
        self.conn.execute("DELETE FROM resume_watch WHERE drain_id NOT IN (SELECT id FROM action_audit)")
        self.conn.commit()
        return boot

    def _views(self, node: str) -> list:
        return [v for (n, _), v in list(self.health.gpus.items()) if n == node]

    def _standing(self, node: str) -> list:
        keys = [k for k in list(self.health.gpus) if k[0] == node]
        return self.health.findings(keys, since=float("inf"), standing=True)

    def _repaired(self, drain: _Drain, boot_then: str, now: float) -> str | None:
        """How the repair was noticed, in words; None while it is not."""
        ns = self.state.nodes.get(drain.node)
        if ns is not None and boot_then and ns.boot_id and ns.boot_id != boot_then:
            return f"{drain.node}'s agent came back with a new boot id (restarted or rebooted) since the drain"
        if self._standing(drain.node):
            return None
        last = [drain.at, *(t for v in self._views(drain.node) for t, _ in v.findings)]
        stored = self.conn.execute("SELECT MAX(at) FROM finding_history WHERE node=?", (drain.node,)).fetchone()
        if stored is not None and stored[0] is not None:
            last.append(stored[0])
        quiet = now - max(last)
        if quiet < self.settings.after_s:
            return None
        return f"no health finding on {drain.node}'s GPUs for {duration(quiet)} (--resume-after " \
               f"{duration(self.settings.after_s)})"

    def _check(self, drain: _Drain, now: float) -> tuple[bool, str]:
        """(final, why not): final refuses for good; a why alone waits; ("", False): the check passes."""
        node = drain.node
        window = self.settings.window_s
        before = self.conn.execute(
            "SELECT MAX(at) FROM action_audit WHERE action='resume' AND outcome='done' AND node=? AND id < ? "
            "AND at > ?", (node, drain.id, drain.at - window)).fetchone()[0]
        if before is not None:
            return True, (f"repeat offender: {node} was drained again {duration(drain.at - before)} after "
                          f"clusterwatch resumed it, within --resume-window {duration(window)}; it is not resumed "
                          f"automatically again (scontrol update nodename={node} state=resume, once repaired)")
        escalated = self.conn.execute(
            "SELECT rule FROM alerts WHERE node=? AND rule IN (?,?) AND resolved_at IS NULL LIMIT 1",
            (node, GPU_REPEAT, NODE_REPEAT)).fetchone()
        if escalated is not None:
            return True, (f"repeat offender: a {escalated[0]} alert stands on {node}; it is not resumed "
                          f"automatically (scontrol update nodename={node} state=resume, once repaired)")
        ns = self.state.nodes.get(node)
        down_after = self.settings.down_after_intervals * (ns.send_interval_s if ns is not None else 5.0)
        if ns is None or not ns.connected or now - ns.last_seen > down_after:
            return False, f"agent down: {node}'s agent is not connected and reporting"
        if self.node_trusted is not None and not self.node_trusted(node):
            return False, f"agent not authenticated: what {node}'s agent says cannot resume it"
        standing = self._standing(node)
        if standing:
            _, f = standing[0]
            return False, f"standing finding: {f.rule} on {node}: {f.description[:200]}"
        held = self.conn.execute(
            "SELECT COUNT(*) FROM action_audit WHERE action='drain' AND outcome='held' AND at > ?",
            (now - self.settings.breaker_window_s,)).fetchone()[0]
        if held:
            return False, (f"circuit breaker: it held {held} drain(s) in the last "
                           f"{duration(self.settings.breaker_window_s)}, nodes failing together; resumes wait "
                           f"until it has held none for its window")
        return False, ""

    # -- the resume, on the Slurm thread -----------------------------------------------------------

    def _resume(self, drain: _Drain, row: int) -> None:
        node = drain.node
        try:
            shown = self.slurm.node_drain(node)
            if not shown.drained:
                self.audit.finish(row, "resume", "skipped", f"Slurm shows {node} {shown.state}, not drained: "
                                                            "someone resumed it already")
                return
            if not drain.reason or shown.reason != drain.reason:
                who = f" (set by {shown.set_by} at {shown.set_at})" if shown.set_by else ""
                why = (f"{node} is drained with reason {shown.reason[:200]!r}{who}, not the one clusterwatch set: "
                       "a person's drain, left as it is")
                log.warning("not resuming %s: %s", node, why)
                self.audit.finish(row, "resume", "refused", why)
                return
            self.slurm.resume_node(node)
        except Exception as exc:  # Slurm down or a refused name: said, and tried again later
            log.warning("resume of %s failed: %s", node, exc)
            self._retry_at[drain.id] = self.clock() + RETRY_S
            self.audit.finish(row, "resume", "failed", " ".join(str(exc).split())[:400])
            return
        log.warning("resumed node %s (clusterwatch drained it: %s)", node, drain.reason)
        self.audit.finish(row, "resume", "done", f"scontrol update NodeName={node} State=RESUME")

    def _record(self, action: str, drain: _Drain, now: float, outcome: str, detail: str, repaired: str) -> int:
        return self.audit.record(action, node=drain.node, job_id="", rule="", alert_id=None,
                                 why=f"resume after the drain of {duration(now - drain.at)} ago: {repaired}",
                                 evidence={"drain_row": drain.id, "drained_at": drain.at, "reason": drain.reason},
                                 outcome=outcome, detail=detail, at=now)

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=False)
