"""--resume's paths the real-Slurm test (tests/slurm/test_resume_slurm.py) does not reach.

The Resumer over a real store in a file (open_db, Store, the alerts, finding history and audit tables) and the
real audit trail, reopened as a restarted collector would; Slurm is an in-memory fake that keeps each node's
state and reason and records what it was asked (show, resume). Time is the tick's `now` and the Resumer's clock.
"""
from __future__ import annotations

import sqlite3
from pathlib import Path
from types import SimpleNamespace

import pytest
from clusterwatch.collector.alerting.alerts import AlertStore
from clusterwatch.collector.alerting.audit import ActionAudit
from clusterwatch.collector.alerting.resume import RETRY_S, Resumer, ResumeSettings
from clusterwatch.collector.health.engine import HealthEngine
from clusterwatch.collector.health.offenders import GPU_REPEAT, NODE_REPEAT, FindingHistory
from clusterwatch.collector.health.xid_catalog import load_catalog
from clusterwatch.collector.rules.model import FIRING, RESOLVED, AlertEvent
from clusterwatch.collector.state.cluster import NodeState
from clusterwatch.collector.state.store import Store, open_db

from clusterwatch.slurm.node_drain import NodeDrain
from tests.support.helpers import cli

NODE = "gpu017"
OTHER = "gpu018"
REASON = "clusterwatch: GPU GPU-0 on gpu017 fell off the bus (XID 79)"
T0 = 1_000_000.0
SETTINGS = ResumeSettings(after_s=600.0, window_s=86400.0, breaker_window_s=3600.0, down_after_intervals=3.0)


class FakeSlurm:
    """Slurm's side of a resume: each node's state and reason, and every call made, in order."""

    def __init__(self) -> None:
        self.nodes: dict[str, NodeDrain] = {}
        self.calls: list[tuple[str, str]] = []
        self.failures: list[Exception] = []  # raised by the next resume_node calls, one each

    def drain(self, node: str, reason: str, by: str = "slurm") -> None:
        self.nodes[node] = NodeDrain(node, "IDLE+DRAIN", reason, by, "2024-05-01T10:00:00")

    def node_drain(self, node: str) -> NodeDrain:
        self.calls.append(("show", node))
        return self.nodes.get(node, NodeDrain(node, "IDLE"))

    def resume_node(self, node: str) -> None:
        self.calls.append(("resume", node))
        if self.failures:
            raise self.failures.pop(0)
        self.nodes[node] = NodeDrain(node, "IDLE")


class World:
    """A collector's parts a resume goes through, over the store at `db`; `restart()` reopens it."""

    def __init__(self, db: Path, slurm: FakeSlurm | None = None, settings: ResumeSettings = SETTINGS) -> None:
        self.db = db
        self.slurm = slurm or FakeSlurm()
        self.settings = settings
        self.now = T0
        self.state = SimpleNamespace(nodes={})
        self.silent: set[str] = set()  # connected agents that send nothing
        self._open()

    def _open(self) -> None:
        self.conn = open_db(str(self.db))
        Store(self.conn)
        self.alerts = AlertStore(self.conn)
        FindingHistory(self.conn)
        self.audit = ActionAudit(self.conn)
        self.resumer = Resumer(self.conn, self.audit, self.state, HealthEngine(load_catalog(None)), self.slurm,
                               self.settings, node_trusted=lambda n: bool((ns := self.state.nodes.get(n)) is not None
                                                                          and ns.authenticated),
                               clock=lambda: self.now)

    def close(self) -> None:
        self.resumer.close()
        self.conn.close()

    def restart(self) -> None:
        """The collector stops and starts again: a new connection, audit trail and Resumer; no memory kept."""
        self.close()
        self.state.nodes.clear()
        self._open()

    def agent(self, node: str = NODE, boot: str = "boot-1", *, connected: bool = True,
              authenticated: bool = True) -> NodeState:
        ns = NodeState(node, boot_id=boot, send_interval_s=5.0, last_seen=self.now, connected=connected,
                       authenticated=authenticated)
        self.state.nodes[node] = ns
        return ns

    def drain(self, node: str = NODE, outcome: str = "done") -> None:
        """The dispatcher's drain step as its audit row ends (done: Slurm drained it with clusterwatch's reason)."""
        self.audit.record("drain", node=node, job_id="", rule="gpu_lost", alert_id=None,
                          why="gpu_lost: GPU fell off the bus", evidence={}, outcome=outcome,
                          detail=REASON if outcome == "done" else "the breaker held it", at=self.now)
        if outcome == "done":
            self.slurm.drain(node, REASON)

    def tick(self, at: float) -> None:
        """One tick at `at` (agents still connected are seen then); waits for the Slurm thread and writes what
        it said."""
        self.now = at
        for ns in self.state.nodes.values():
            if ns.connected and ns.node not in self.silent:
                ns.last_seen = at
        self.resumer.on_tick(at)
        for fut in list(self.resumer._busy.values()):
            fut.result(timeout=10)
        self.audit.flush()

    def rows(self, action: str = "", node: str = NODE) -> list[tuple[str, str, str]]:
        """(action, outcome, detail) of the node's resume steps, oldest first."""
        self.audit.flush()
        return [r for r in self.conn.execute(
            "SELECT action, outcome, detail FROM action_audit WHERE node=? AND action LIKE ? ORDER BY id",
            (node, f"{action or 'resume'}%"))]


@pytest.fixture
def world(tmp_path: Path):
    w = World(tmp_path / "clusterwatch.db")
    yield w
    w.close()


def _outcomes(rows: list[tuple[str, str, str]]) -> list[tuple[str, str]]:
    return [r[:2] for r in rows]


def test_a_new_boot_id_is_a_repair_even_across_a_collector_restart(world: World) -> None:
    world.agent(boot="boot-1")
    world.drain()
    world.tick(T0 + 5)  # the drain is seen here with the agent's boot id; the GPU quiet for 5 s only
    assert world.slurm.calls == [] and world.rows() == []
    world.tick(T0 + 10)  # the same boot: no repair
    assert world.slurm.calls == [] and world.rows() == []

    world.restart()  # the collector restarts; meanwhile the node rebooted
    world.agent(boot="boot-2")
    world.tick(T0 + 20)  # 20 s after the drain: only the new boot id says it was repaired
    assert world.slurm.calls == [("show", NODE), ("resume", NODE)]
    rows = world.rows()
    assert _outcomes(rows) == [("resume_check", "passed"), ("resume", "done")], rows
    assert "new boot id" in rows[0][2], rows
    assert rows[1][2] == f"scontrol update NodeName={NODE} State=RESUME"
    assert not world.slurm.nodes[NODE].drained

    world.tick(T0 + 30)  # closed: asked once
    assert len(world.slurm.calls) == 2 and len(world.rows()) == 2


def test_a_quiet_node_without_a_new_boot_is_repaired_only_after_resume_after(world: World) -> None:
    world.agent()
    world.drain()
    world.tick(T0 + SETTINGS.after_s - 5)
    assert world.slurm.calls == []
    world.tick(T0 + SETTINGS.after_s + 5)
    assert ("resume", NODE) in world.slurm.calls
    rows = world.rows()
    assert _outcomes(rows) == [("resume_check", "passed"), ("resume", "done")], rows
    assert "no health finding" in rows[0][2] and "--resume-after" in rows[0][2]


def _resume_by_reboot(world: World, boot: str) -> None:
    world.agent(boot=boot)
    world.tick(world.now + 5)
    world.agent(boot=boot + "-rebooted")
    world.tick(world.now + 5)


@pytest.mark.parametrize(("gap", "refused"), [(3600.0, True), (SETTINGS.window_s + 3600.0, False)])
def test_drained_again_within_the_resume_window_is_refused_for_good(world: World, gap: float,
                                                                    refused: bool) -> None:
    world.drain()
    _resume_by_reboot(world, "boot-1")
    assert _outcomes(world.rows()) == [("resume_check", "passed"), ("resume", "done")]
    first_resume = len(world.slurm.calls)

    world.now = T0 + gap  # it fails again: clusterwatch drains it again
    world.drain()
    _resume_by_reboot(world, "boot-2")
    rows = world.rows()[2:]
    if not refused:  # past the window: a new failure, resumed like the first
        assert _outcomes(rows) == [("resume_check", "passed"), ("resume", "done")], rows
        return
    assert _outcomes(rows) == [("resume_check", "failed"), ("resume", "refused")], rows
    why = rows[1][2]
    assert why.startswith(f"repeat offender: {NODE} was drained again ") and "--resume-window" in why, why
    assert len(world.slurm.calls) == first_resume and world.slurm.nodes[NODE].drained  # Slurm never asked

    for later in (60.0, SETTINGS.window_s * 2):  # for good: another reboot, the window long past, a restart
        world.restart()
        world.agent(boot=f"boot-later-{later}")
        world.tick(world.now + later)
        assert len(world.rows()) == 4 and len(world.slurm.calls) == first_resume


@pytest.mark.parametrize("rule", [GPU_REPEAT, NODE_REPEAT])
@pytest.mark.parametrize("standing", [True, False])
def test_a_standing_repeat_offender_alert_refuses_the_resume(world: World, rule: str, standing: bool) -> None:
    world.alerts.apply(AlertEvent(t=T0 - 60, rule=rule, state=FIRING, severity="critical", node=NODE,
                                  gpu="GPU-0" if rule == GPU_REPEAT else "", description="XID 48 twice in 24 h"))
    if not standing:
        world.alerts.apply(AlertEvent(t=T0 - 30, rule=rule, state=RESOLVED, severity="critical", node=NODE,
                                      gpu="GPU-0" if rule == GPU_REPEAT else "", description="XID 48 twice"))
    world.alerts.apply(AlertEvent(t=T0 - 60, rule=rule, state=FIRING, severity="critical", node=OTHER,
                                  description="another node's"))  # another node's alert counts not here
    world.drain()
    _resume_by_reboot(world, "boot-1")
    rows = world.rows()
    if not standing:
        assert _outcomes(rows) == [("resume_check", "passed"), ("resume", "done")], rows
        return
    assert _outcomes(rows) == [("resume_check", "failed"), ("resume", "refused")], rows
    assert f"a {rule} alert stands on {NODE}" in rows[1][2], rows
    assert world.slurm.calls == []
    world.agent(boot="boot-again")
    world.tick(world.now + 5)
    assert len(world.rows()) == 2 and world.slurm.calls == []


def test_resumes_wait_while_the_breaker_has_held_a_drain_within_its_window(world: World) -> None:
    world.drain()
    world.now = T0 + 2
    world.drain(OTHER, outcome="held")  # nodes failing together: the breaker held another node's drain
    _resume_by_reboot(world, "boot-1")
    for t in (60.0, 1800.0, SETTINGS.breaker_window_s - 5):  # waits; said once, not every pass
        world.tick(T0 + t)
    rows = world.rows()
    assert _outcomes(rows) == [("resume_check", "failed")], rows
    assert rows[0][2].startswith("circuit breaker: it held 1 drain(s)"), rows
    assert world.slurm.calls == []
    world.tick(T0 + 2 + SETTINGS.breaker_window_s + 1)  # the held drain has left the window
    assert _outcomes(world.rows()) == [("resume_check", "failed"), ("resume_check", "passed"), ("resume", "done")]
    assert world.slurm.calls == [("show", NODE), ("resume", NODE)]


@pytest.mark.parametrize(("trouble", "said"), [
    ("disconnected", "agent down: "),
    ("silent", "agent down: "),
    ("gone", "agent down: "),
    ("unauthenticated", "agent not authenticated: "),
])
def test_resumes_wait_while_the_agent_is_down_or_unauthenticated(world: World, trouble: str, said: str) -> None:
    world.agent()
    world.drain()
    world.tick(T0 + 5)
    if trouble == "disconnected":
        world.state.nodes[NODE].connected = False
    elif trouble == "silent":  # connected, but nothing for longer than three send intervals
        world.silent.add(NODE)
    elif trouble == "gone":
        del world.state.nodes[NODE]
    else:
        world.state.nodes[NODE].authenticated = False
    world.tick(T0 + SETTINGS.after_s + 5)  # the repair: quiet for --resume-after
    world.tick(world.now + 5)
    rows = world.rows()
    assert _outcomes(rows) == [("resume_check", "failed")], rows
    assert rows[0][2].startswith(said), rows
    assert world.slurm.calls == [] and world.slurm.nodes[NODE].drained

    world.silent.clear()
    world.agent(boot="boot-1")  # connected, reporting and authenticated again
    world.tick(world.now + 5)
    assert _outcomes(world.rows()) == [("resume_check", "failed"), ("resume_check", "passed"), ("resume", "done")]
    assert world.slurm.calls == [("show", NODE), ("resume", NODE)]


def test_a_failed_resume_is_tried_again_after_a_minute(world: World) -> None:
    world.slurm.failures.append(RuntimeError("scontrol: error: Unable to contact slurm controller\n(connect)"))
    world.drain()
    _resume_by_reboot(world, "boot-1")
    failed_at = world.now
    rows = world.rows()
    assert _outcomes(rows) == [("resume_check", "passed"), ("resume", "failed")], rows
    assert rows[1][2] == "scontrol: error: Unable to contact slurm controller (connect)"
    assert world.slurm.calls == [("show", NODE), ("resume", NODE)] and world.slurm.nodes[NODE].drained

    for t in range(5, int(RETRY_S), 5):  # not before the minute is up
        world.tick(failed_at + t)
    assert len(world.slurm.calls) == 2 and len(world.rows()) == 2
    world.tick(failed_at + RETRY_S)
    rows = world.rows()
    assert _outcomes(rows)[2:] == [("resume_check", "passed"), ("resume", "done")], rows
    assert world.slurm.calls[2:] == [("show", NODE), ("resume", NODE)] and not world.slurm.nodes[NODE].drained


def test_a_persons_drain_is_refused_and_a_node_resumed_already_skipped(world: World) -> None:
    world.drain()
    world.drain(OTHER)
    world.slurm.drain(NODE, "ops: GPU swap booked", by="alice")  # a person's reason over clusterwatch's
    world.slurm.nodes[OTHER] = NodeDrain(OTHER, "IDLE")  # someone resumed it already
    world.agent(OTHER, "boot-1")
    _resume_by_reboot(world, "boot-1")
    world.agent(OTHER, "boot-1-rebooted")
    world.tick(world.now + 5)
    rows = world.rows()
    assert _outcomes(rows) == [("resume_check", "passed"), ("resume", "refused")], rows
    assert "'ops: GPU swap booked' (set by alice" in rows[1][2] and "a person's drain" in rows[1][2]
    assert _outcomes(world.rows(node=OTHER)) == [("resume_check", "passed"), ("resume", "skipped")]
    assert ("resume", NODE) not in world.slurm.calls and ("resume", OTHER) not in world.slurm.calls


@pytest.mark.parametrize("env", [{}, {"CLUSTERWATCH_RESUME": "1"}])
def test_resume_without_slurm_is_one_line_and_exit_2(tmp_path: Path, env: dict) -> None:
    db = tmp_path / "cw.db"
    done = cli("collector", *([] if env else ["--resume"]), "--listen", "127.0.0.1:0", "--metrics-listen", "none",
               "--web-listen", "none", "--query-auth", "none", "--db", str(db), env=env)
    assert done.returncode == 2, done.stderr
    assert done.stderr == "clusterwatch: --resume resumes nodes through Slurm: give --slurm too\n"
    assert not db.exists()  # refused before anything is opened


def test_the_store_keeps_each_drains_boot_id(world: World) -> None:
    world.agent(boot="boot-1")
    world.drain()
    world.tick(T0 + 5)
    conn = sqlite3.connect(world.db)
    try:
        got = conn.execute("SELECT node, boot_id FROM resume_watch").fetchall()
    finally:
        conn.close()
    assert got == [(NODE, "boot-1")]
