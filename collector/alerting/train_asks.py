"""Requests from the collector to a job's training processes (checkpoint, stop, memory_snapshot,
dump_stacks), through their nodes' agents, and the answers, kept in SQLite.

Asked by `clusterwatch diagnose` (Query.AskTraining, which waits a few seconds for the answers) and by
the alert actions `checkpoint` and `stop` (which do not wait). Each request is one row, updated as its
answers come (the agent passes on "accepted", then the handler's); `status` shows the latest of each rank.
An answer is taken only from the node the request went to and for the process it named: an agent
speaks for its own node only; anything else is refused and counted (`answers_refused`).

Table `train_answers` (created if missing)::

    id           INTEGER PRIMARY KEY
    request_id   TEXT    unique, sent to the agent and echoed in its answers
    job_id, node, pid, start_time, rank (NULL when not known), kind, asked_by
    status       TEXT    sent, then accepted, done, refused, no_handler, failed, unreachable, not_yours, no_answer
    message      TEXT    what the process or its agent said
    payload      TEXT    dump_stacks: the stacks (py-spy dump text, at most 60000 bytes)
    truncated    INTEGER 1: the payload was cut at a thread
    asked_at     REAL    the collector's clock
    answered_at  REAL    the latest answer's time, or when the collector stopped waiting
"""
from __future__ import annotations

import asyncio
import logging
import math
import sqlite3
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from clusterwatch.v1 import agent_pb2, query_pb2

log = logging.getLogger(__name__)

KINDS = ("dump_stacks", "memory_snapshot", "checkpoint", "stop")
SENT, NO_ANSWER, UNREACHABLE = "sent", "no_answer", "unreachable"
FINAL = frozenset({"done", "refused", "no_handler", "failed", "unreachable", "not_yours"})
_FROM_AGENT = FINAL | {"accepted"}
DEFAULT_WAIT_S = 5.0
MAX_WAIT_S = 30.0
MAX_PAYLOAD = 60000       # bytes; the agent cuts a dump at a thread within it
MAX_MESSAGE = 1024
MAX_ROWS_PER_JOB = 2000   # beyond it the oldest answers of a job go
MAX_WAITING = 10000       # requests waiting for an answer; the oldest are forgotten past it
MAX_COLLECTIONS = 64      # requests asked together for a callback (a stall's stacks); the oldest answered past it
# A checkpoint or stop asked of several ranks names one step for all (`at_step`): saving is collective under
# FSDP or DeepSpeed, and a rank saving alone would leave the others waiting. It is the furthest step seen
# plus the steps of this long at the fastest rate (the steps seen are a few seconds old; the request takes
# a moment to arrive): a rank already past it refuses rather than save alone.
AT_STEP_AHEAD_S = 15.0
COLLECTIVE = frozenset({"checkpoint", "stop"})

_SCHEMA = """
CREATE TABLE IF NOT EXISTS train_answers (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    request_id TEXT NOT NULL UNIQUE,
    job_id TEXT NOT NULL,
    node TEXT NOT NULL,
    pid INTEGER NOT NULL,
    start_time REAL NOT NULL,
    rank INTEGER,
    kind TEXT NOT NULL,
    asked_by TEXT NOT NULL DEFAULT '',
    status TEXT NOT NULL,
    message TEXT NOT NULL DEFAULT '',
    payload TEXT NOT NULL DEFAULT '',
    truncated INTEGER NOT NULL DEFAULT 0,
    asked_at REAL NOT NULL,
    answered_at REAL NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS train_answers_job ON train_answers(job_id, id);
"""
_COLS = ("request_id", "node", "pid", "start_time", "rank", "kind", "status", "message", "payload", "truncated",
         "asked_by", "asked_at", "answered_at")


@dataclass(frozen=True, slots=True)
class Target:
    """One process to ask: (node, pid, start time) is its identity."""

    node: str
    pid: int
    start_time: float
    rank: int | None
    step: int | None = None
    steps_per_s: float | None = None


@dataclass
class _Waiting:
    node: str
    pid: int
    start_time: float
    done: asyncio.Event | None


@dataclass
class _Collection:
    """Requests asked together whose answers go to one callback, once all are final or at the deadline."""

    request_ids: list[str]
    waiting: set[str]
    answered: Callable[[list[query_pb2.TrainAnswerView]], None]
    wait_s: float


def targets(view: query_pb2.JobView, rank: int | None) -> list[Target]:
    """The live processes of a job to ask: its ranks (or one); a job with no rank known, every process."""
    alive = [p for p in view.processes if p.alive]
    ranked = [p for p in alive if p.HasField("rank")]
    chosen = [p for p in ranked if rank is None or p.rank == rank] if ranked or rank is not None else alive
    return [Target(p.node, p.pid, p.start_time, p.rank if p.HasField("rank") else None,
                   p.step if p.HasField("step") else None, p.steps_per_s if p.HasField("steps_per_s") else None)
            for p in sorted(chosen, key=lambda p: (p.rank if p.HasField("rank") else 1 << 31, p.node, p.pid))]


def collective_args(chosen: list[Target], kind: str) -> dict[str, str]:
    """`at_step` for a checkpoint or stop asked of several ranks whose steps are known; else nothing."""
    steps = [t.step for t in chosen if t.step is not None]
    if kind not in COLLECTIVE or len(chosen) < 2 or not steps:
        return {}
    rate = max((t.steps_per_s or 0.0) for t in chosen)
    return {"at_step": str(max(steps) + max(2, math.ceil(rate * AT_STEP_AHEAD_S)))}


def _view(row: tuple, with_payload: bool = True) -> query_pb2.TrainAnswerView:
    d = dict(zip(_COLS, row, strict=True))
    v = query_pb2.TrainAnswerView(
        request_id=d["request_id"], node=d["node"], pid=d["pid"], start_time=d["start_time"], kind=d["kind"],
        status=d["status"], message=d["message"], payload=d["payload"] if with_payload else "",
        truncated=bool(d["truncated"]), asked_by=d["asked_by"], asked_at=d["asked_at"],
        answered_at=d["answered_at"])
    if d["rank"] is not None:
        v.rank = d["rank"]
    return v


class TrainAsks:
    """Sends TrainRequests through the agents' streams and keeps their answers.

    Args:
        conn: the collector's store connection (a table of its own on it).
        send: node, TrainRequest -> whether that node's agent is connected (ingest_service.AgentOutboxes).
        job_view: job id -> its live view (CollectorCore.live_job_view), for an alert of a whole job.
        clock: wall clock.
        why_unreachable: node -> why a request cannot reach it now, None when it can (AgentOutboxes.why_not:
            not connected, not authenticated); None: every node is asked.

    Attributes:
        answers_refused: answers from another node than the one asked, for another process, of no request
            sent, or with a status no agent sends.
    """

    def __init__(self, conn: sqlite3.Connection, send: Callable[[str, agent_pb2.TrainRequest], bool],
                 job_view: Callable[[str], query_pb2.JobView | None] | None = None,
                 clock: Callable[[], float] = time.time,
                 why_unreachable: Callable[[str], str | None] | None = None) -> None:
        self.conn = conn
        self.send = send
        self.job_view = job_view
        self.clock = clock
        self.answers_refused = 0
        self.asked = 0
        self.why_unreachable = why_unreachable
        self._waiting: dict[str, _Waiting] = {}
        self._collections: dict[str, _Collection] = {}  # first request id → its collection
        self._collected: dict[str, str] = {}  # request id → its collection's first request id
        conn.executescript(_SCHEMA)
        conn.commit()

    def counts(self) -> dict[str, int]:
        return {"train_requests": self.asked, "train_answers_refused": self.answers_refused}

    # -- asking -------------------------------------------------------------------------------------

    def send_to(self, job_id: str, target: Target, kind: str, asked_by: str, event: asyncio.Event | None = None,
                args: dict[str, str] | None = None) -> str:
        """Ask one process (not waiting); its request id. An agent not connected is answered `unreachable` at once."""
        request_id = uuid.uuid4().hex
        now = self.clock()
        self.conn.execute(
            "INSERT INTO train_answers (request_id, job_id, node, pid, start_time, rank, kind, asked_by, status, "
            "asked_at) VALUES (?,?,?,?,?,?,?,?,?,?)",
            (request_id, job_id, target.node, target.pid, target.start_time, target.rank, kind, asked_by[:200],
             SENT, now))
        self._trim(job_id)
        self.asked += 1
        req = agent_pb2.TrainRequest(id=request_id, pid=target.pid, start_time=target.start_time, kind=kind,
                                     asked_by=asked_by[:200], args=args or {})
        if self.send(target.node, req):
            self._waiting[request_id] = _Waiting(target.node, target.pid, target.start_time, event)
            while len(self._waiting) > MAX_WAITING:
                self._waiting.pop(next(iter(self._waiting)))
        else:
            why = self.why_unreachable(target.node) if self.why_unreachable is not None else None
            self._update(request_id, UNREACHABLE,
                         why or f"the agent of {target.node} is not connected to this collector", "", False, now)
        self.conn.commit()
        return request_id

    def ask_for_alert(self, job_id: str, node: str, pid: int, start_time: float, rank: int | None, kind: str,
                      asked_by: str, *, answered: Callable[[list[query_pb2.TrainAnswerView]], None] | None = None,
                      wait_s: float = MAX_WAIT_S) -> int:
        """An alert's step: its process, or every rank of its job (an alert of the whole job, or a pid < 0).

        `answered`, when given, is called once with every request's answer (payloads included) when all are
        final, or after `wait_s` with what came (the rest marked no_answer), on the collector's loop; at once
        when none could be sent. It never waits here: the alerts are handled on the ingest path.
        """
        if pid >= 0 and node:
            chosen = [Target(node, pid, start_time, rank)]
        else:
            view = self.job_view(job_id) if self.job_view is not None else None
            chosen = targets(view, None) if view is not None else []
        args = collective_args(chosen, kind)
        ids = [self.send_to(job_id, target, kind, asked_by, args=args) for target in chosen]
        if answered is not None:
            self._collect(ids, answered, min(wait_s, MAX_WAIT_S))
        return len(chosen)

    def _collect(self, ids: list[str], answered: Callable[[list[query_pb2.TrainAnswerView]], None],
                 wait_s: float) -> None:
        waiting = {rid for rid in ids if rid in self._waiting}
        if not ids:
            answered([])
            return
        cid = ids[0]
        self._collections[cid] = _Collection(ids, waiting, answered, wait_s)
        if not waiting:
            self._finish(cid)
            return
        for rid in waiting:
            self._collected[rid] = cid
        while len(self._collections) > MAX_COLLECTIONS:  # bounded: the oldest is answered with what came
            self._finish(next(iter(self._collections)))
        try:
            asyncio.get_running_loop().call_later(wait_s, self._finish, cid)
        except RuntimeError:  # no loop (a test's core driven by hand): answered when the answers are in
            pass

    def _finish(self, cid: str) -> None:
        col = self._collections.pop(cid, None)
        if col is None:
            return
        now = self.clock()
        for rid in col.request_ids:
            self._collected.pop(rid, None)
            if self._waiting.pop(rid, None) is not None:
                self._no_answer(rid, col.wait_s, now)
        self.conn.commit()
        try:
            col.answered([self._get(rid) for rid in col.request_ids])
        except Exception:  # the taker's fault must not break the agent's stream of answers
            log.exception("answers' callback failed")

    async def ask(self, job_id: str, chosen: list[Target], kind: str, asked_by: str,
                  wait_s: float = DEFAULT_WAIT_S) -> list[query_pb2.TrainAnswerView]:
        """Ask each process and wait (at most `wait_s`, capped) until every one has answered finally."""
        wait_s = min(wait_s or DEFAULT_WAIT_S, MAX_WAIT_S)
        args = collective_args(chosen, kind)
        events = {self.send_to(job_id, t, kind, asked_by, asyncio.Event(), args): None for t in chosen}
        waits = [w.done.wait() for rid in events if (w := self._waiting.get(rid)) is not None and w.done]
        if waits:
            try:
                await asyncio.wait_for(asyncio.gather(*waits), wait_s)
            except asyncio.TimeoutError:
                pass
        now = self.clock()
        for rid in events:
            if self._waiting.pop(rid, None) is not None:  # no final answer in time
                self._no_answer(rid, wait_s, now)
        self.conn.commit()
        return [self._get(rid) for rid in events]

    def _no_answer(self, rid: str, wait_s: float, now: float) -> None:
        self.conn.execute("UPDATE train_answers SET status=CASE status WHEN ? THEN ? ELSE status END, "
                          "message=CASE status WHEN ? THEN ? ELSE message END, answered_at=? "
                          "WHERE request_id=?",
                          (SENT, NO_ANSWER, SENT, f"no answer within {wait_s:g} s", now, rid))

    # -- answers ------------------------------------------------------------------------------------

    def on_answer(self, node: str, answer: agent_pb2.TrainAnswer) -> None:
        """An agent's answer (on the collector's loop, from the ingest stream of `node`)."""
        waiting = self._waiting.get(answer.id)
        if waiting is None:
            row = self.conn.execute("SELECT node, pid, start_time, status FROM train_answers WHERE request_id=?",
                                    (answer.id,)).fetchone()
            if row is None or row[3] in FINAL:  # no such request, or answered already
                self.answers_refused += 1
                return
            waiting = _Waiting(row[0], row[1], row[2], None)
        if (waiting.node != node or waiting.pid != answer.pid or abs(waiting.start_time - answer.start_time) > 0.05
                or answer.status not in _FROM_AGENT):
            self.answers_refused += 1
            return
        payload, truncated = answer.payload, answer.truncated
        if len(payload.encode()) > MAX_PAYLOAD:
            payload, truncated = payload.encode()[:MAX_PAYLOAD].decode("utf-8", "ignore"), True
        self._update(answer.id, answer.status, answer.message[:MAX_MESSAGE], payload, truncated, self.clock())
        self.conn.commit()
        if answer.status in FINAL:
            self._waiting.pop(answer.id, None)
            if waiting.done is not None:
                waiting.done.set()
            cid = self._collected.pop(answer.id, None)
            col = self._collections.get(cid) if cid is not None else None
            if col is not None:
                col.waiting.discard(answer.id)
                if not col.waiting:
                    self._finish(cid)

    def _update(self, request_id: str, status: str, message: str, payload: str, truncated: bool, now: float) -> None:
        self.conn.execute("UPDATE train_answers SET status=?, message=?, payload=CASE WHEN ?='' THEN payload "
                          "ELSE ? END, truncated=?, answered_at=? WHERE request_id=?",
                          (status, message, payload, payload, int(truncated), now, request_id))

    def _trim(self, job_id: str) -> None:
        self.conn.execute("DELETE FROM train_answers WHERE job_id=? AND id <= (SELECT id FROM train_answers "
                          "WHERE job_id=? ORDER BY id DESC LIMIT 1 OFFSET ?)", (job_id, job_id, MAX_ROWS_PER_JOB))

    # -- reading ------------------------------------------------------------------------------------

    def _get(self, request_id: str) -> query_pb2.TrainAnswerView:
        row = self.conn.execute(f"SELECT {', '.join(_COLS)} FROM train_answers WHERE request_id=?",
                                (request_id,)).fetchone()
        return _view(row)

    def latest(self, job_id: str) -> list[query_pb2.TrainAnswerView]:
        """The latest request of each process of a job and its answer, by rank (no payload: `diagnose` has it)."""
        rows = self.conn.execute(
            f"SELECT {', '.join(_COLS)} FROM train_answers WHERE id IN (SELECT MAX(id) FROM train_answers "
            "WHERE job_id=? GROUP BY node, pid, start_time)", (job_id,)).fetchall()
        views = [_view(r, with_payload=False) for r in rows]
        return sorted(views, key=lambda v: (v.rank if v.HasField("rank") else 1 << 31, v.node, v.pid))
