"""The drain circuit breaker: clusterwatch never drains more than a few nodes, or a small share, in a window.

A bad driver push, a flapping switch or a rule that misfires raises the same alert on many nodes at once;
draining each would take the cluster down for what may be one fault outside the nodes. So a drain is
admitted only while the nodes drained in the last `window_s` stay under the smaller of `max_nodes` and
`max_share` of the nodes the collector knows (never under one: a single bad node is always drained, or a
small cluster would never be). Past it the drain is held: the alert's other steps still notify, and the
caller says why (a log line, a /metrics counter, the action's record).

A node drained again within the window (a second alert on it) costs nothing more: it is out already.

Table `drain_breaker` (created if missing), in the collector's store so that a restarted collector still
counts the drains of the hour before it (else a crash loop would drain `max_nodes` more each start)::

    node TEXT, at REAL    one row a drain admitted; rows older than the window are deleted as it moves
"""
from __future__ import annotations

import math
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass

_SCHEMA = """
CREATE TABLE IF NOT EXISTS drain_breaker (
    node TEXT NOT NULL,
    at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS drain_breaker_at ON drain_breaker(at);
"""

DEFAULT_MAX_NODES = 2
DEFAULT_MAX_SHARE = 0.05
DEFAULT_WINDOW_S = 3600.0


@dataclass(frozen=True, slots=True)
class BreakerLimits:
    """How many drains a window admits: at most `max_nodes`, and at most `max_share` of the nodes known."""

    max_nodes: int = DEFAULT_MAX_NODES
    max_share: float = DEFAULT_MAX_SHARE
    window_s: float = DEFAULT_WINDOW_S

    def allowed(self, cluster_nodes: int) -> int:
        """Distinct nodes a window may drain in a cluster of `cluster_nodes` (at least one, when max_nodes
        allows any: 5 % of 10 nodes is half a node, and a single bad node must still be taken out)."""
        by_share = max(1, math.floor(self.max_share * cluster_nodes))
        return min(self.max_nodes, by_share)


@dataclass(frozen=True, slots=True)
class Verdict:
    """Whether a drain may run, and, when held, why in one line."""

    admitted: bool
    why: str = ""


class DrainBreaker:
    """Admits or holds each drain, counting the drains of the window in the store.

    Args:
        conn: the collector's store (the table is created if missing); the caller owns its thread.
        limits: the window and its limits.
        cluster_nodes: how many nodes the collector knows now (the share is of those).
    """

    def __init__(self, conn: sqlite3.Connection, limits: BreakerLimits,
                 cluster_nodes: Callable[[], int]) -> None:
        self.conn = conn
        self.limits = limits
        self.cluster_nodes = cluster_nodes
        self.held = 0  # drains held since start, for /metrics
        conn.executescript(_SCHEMA)
        conn.commit()

    def drained_in_window(self, now: float) -> set[str]:
        """The nodes drained within the window ending at `now`."""
        since = now - self.limits.window_s
        return {n for (n,) in self.conn.execute("SELECT DISTINCT node FROM drain_breaker WHERE at > ?", (since,))}

    def consider(self, node: str, now: float) -> Verdict:
        """Admit the drain of `node` (and count it) or hold it; called before the drain runs."""
        self.conn.execute("DELETE FROM drain_breaker WHERE at <= ?", (now - self.limits.window_s,))
        drained = self.drained_in_window(now)
        allowed = self.limits.allowed(self.cluster_nodes())
        if node not in drained and len(drained) >= allowed:
            self.held += 1
            self.conn.commit()
            return Verdict(False, f"circuit breaker: {len(drained)} node(s) drained in the last "
                                  f"{_window_text(self.limits.window_s)} ({', '.join(sorted(drained)[:5])}), the "
                                  f"most allowed (--drain-max-nodes {self.limits.max_nodes}, --drain-max-share "
                                  f"{self.limits.max_share:g} of {self.cluster_nodes()} nodes): not draining "
                                  f"{node}, notifying only")
        self.conn.execute("INSERT INTO drain_breaker VALUES (?, ?)", (node, now))
        self.conn.commit()
        return Verdict(True)


def _window_text(seconds: float) -> str:
    if seconds % 3600 == 0:
        return f"{seconds / 3600:g} h"
    if seconds % 60 == 0:
        return f"{seconds / 60:g} min"
    return f"{seconds:g} s"
