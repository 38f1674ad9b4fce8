"""Agent instances and nodes gone a week are forgotten: their batch numbers and sample counts.

Each agent start is a new instance (boot id) with rows of its own in the store, so without this the
tables, and the restore that reads them at every collector start, grow with every agent restart.
Against the real Store (SQLite) and CollectorCore: the store's rows are aged by hand, the core's
clock is moved past the week.
"""
from __future__ import annotations

from pathlib import Path

from clusterwatch.collector.config import CollectorConfig
from clusterwatch.collector.state.core import CollectorCore
from clusterwatch.collector.state.store import STALE_AFTER_S, Store, open_db
from clusterwatch.v1 import agent_pb2

from clusterwatch.model import ProcessSample
from clusterwatch.wire import processes_to_table

T0 = 1_800_000_000.0


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


def hello(core: CollectorCore, node: str, boot_id: str) -> None:
    core.hello(agent_pb2.Hello(node=node, boot_id=boot_id, agent_version="t", interval_s=1.0))


def batch(core: CollectorCore, node: str, boot_id: str, seq: int) -> None:
    b = agent_pb2.Batch(seq=seq, sent_at=core.clock())
    processes_to_table([ProcessSample(core.clock(), node, 100 + seq, T0 - 50, ppid=1, user="alice",
                                      command="python", rss_bytes=1 << 30)], b.processes)
    core.batch(node, boot_id, b)


def age(db: Path, node: str, boot_id: str) -> None:
    """Make a node's and an instance's rows look written more than STALE_AFTER_S ago."""
    conn = open_db(str(db))
    conn.execute("UPDATE stream_seqs SET updated = updated - ? WHERE boot_id = ?", (STALE_AFTER_S + 60, boot_id))
    conn.execute("UPDATE node_counts SET updated = updated - ? WHERE node = ?", (STALE_AFTER_S + 60, node))
    conn.close()


def rows(db: Path) -> tuple[set[str], set[str]]:
    conn = open_db(str(db))
    try:
        return ({b for (b,) in conn.execute("SELECT boot_id FROM stream_seqs")},
                {n for (n,) in conn.execute("SELECT node FROM node_counts")})
    finally:
        conn.close()


def two_agents(db: Path, clock: Clock) -> CollectorCore:
    core = CollectorCore(CollectorConfig(), Store(open_db(str(db))), clock=clock)
    hello(core, "n1", "old-boot")
    hello(core, "n2", "new-boot")
    for seq in (1, 2, 3):
        batch(core, "n1", "old-boot", seq)
    batch(core, "n2", "new-boot", 1)
    core.flush()
    return core


def test_an_instance_and_a_node_silent_a_week_are_forgotten_by_the_periodic_sweep(tmp_path):
    db, clock = tmp_path / "cw.db", Clock()
    core = two_agents(db, clock)
    assert rows(db) == ({"old-boot", "new-boot"}, {"n1", "n2"})
    age(db, "n1", "old-boot")
    clock.now = T0 + STALE_AFTER_S + 1
    core.tick()
    assert rows(db) == ({"new-boot"}, {"n2"})
    assert [b for b, _, _ in Store(open_db(str(db))).load_seqs()] == ["new-boot"]  # what a restart restores
    # forgotten in memory too: a batch number it had stored is no longer a duplicate
    duplicates = core.counters.duplicates
    batch(core, "n1", "old-boot", 2)
    assert core.counters.duplicates == duplicates
    # and the live instance is still tracked
    batch(core, "n2", "new-boot", 1)
    assert core.counters.duplicates == duplicates + 1


def test_a_collector_up_less_than_a_week_forgets_nothing_restored(tmp_path):
    # rows restored at start-up count from the start: a collector that was down a week must keep the
    # batch numbers of agents that are about to resend what it never acknowledged
    db, clock = tmp_path / "cw.db", Clock()
    two_agents(db, clock).store.conn.close()
    age(db, "n1", "old-boot")
    clock.now = T0 + STALE_AFTER_S + 1
    core = CollectorCore(CollectorConfig(), Store(open_db(str(db))), clock=clock)
    clock.now += 3600
    core.tick()
    assert rows(db) == ({"old-boot", "new-boot"}, {"n1", "n2"})
    duplicates = core.counters.duplicates
    batch(core, "n1", "old-boot", 2)
    assert core.counters.duplicates == duplicates + 1
