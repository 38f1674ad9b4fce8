"""Which kernel-log records the collector has had, kept in its store: a restart must not take them anew.

A restarted agent reads the kernel log from boot again (NVML does not deliver events from before it
started), and the health engine drops what it has seen by (node, kernel boot id, record number). Kept in
memory only, a restarted collector would take an XID 79 read again as a new loss: the same fault raised
twice, a node an operator resumed drained again. One row per (node, kernel boot), the highest record
number taken; rows of boots not heard of for 30 days go at start.
"""
from __future__ import annotations

import sqlite3
import time

__all__ = ["KmsgMarks"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS health_kmsg_marks (
    node TEXT NOT NULL,
    kernel_boot_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    updated_at REAL NOT NULL,
    PRIMARY KEY (node, kernel_boot_id)
);
"""
KEEP_S = 30 * 86400


class KmsgMarks:
    """The health_kmsg_marks table on the collector's store connection (committed at once, as alerts are)."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        conn.executescript(_SCHEMA)
        conn.commit()

    def load(self, now: float | None = None) -> dict[tuple[str, str], int]:
        """(node, kernel boot id) → the highest record number taken; forgets boots quiet for 30 days."""
        now = time.time() if now is None else now
        self.conn.execute("DELETE FROM health_kmsg_marks WHERE updated_at < ?", (now - KEEP_S,))
        self.conn.commit()
        rows = self.conn.execute("SELECT node, kernel_boot_id, seq FROM health_kmsg_marks")
        return {(node, boot): seq for node, boot, seq in rows}

    def save(self, marks: dict[tuple[str, str], int], now: float | None = None) -> None:
        now = time.time() if now is None else now
        self.conn.executemany(
            "INSERT INTO health_kmsg_marks (node, kernel_boot_id, seq, updated_at) VALUES (?, ?, ?, ?) "
            "ON CONFLICT (node, kernel_boot_id) DO UPDATE SET seq = MAX(seq, excluded.seq), "
            "updated_at = excluded.updated_at",
            [(node, boot, seq, now) for (node, boot), seq in marks.items()])
        self.conn.commit()
