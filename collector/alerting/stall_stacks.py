"""A stalled job's Python stacks, taken once when its `training_stall` fires, kept with the alert (issue 16 part 3).

Every rank of a hung job stalls at once and each raises its own alert: the job's stacks are asked for once
(every rank, through the agents' py-spy: TrainAsks.ask_for_alert with `dump_stacks`), and the grouped summary
("ranks 0-6 in all_reduce at train.py:212; rank 7 in the data loader at ...", clusterwatch/stacks.py) goes
into the figures (`stacks`, `stacks_status`) and the description of each of the job's alerts that fired
meanwhile, so that `status` and `alerts` show it.

- Off the ingest path: asking only sends (the answers come on the collector's loop later); the grouping, a
  parse of up to 60,000 bytes a rank, runs in a worker thread of its own, and the result is written on the
  loop.
- Bounded: one take a job at a time (alerts of the same job within REUSE_S share it), the answers awaited at
  most WAIT_S, at most MAX_LINES lines of MAX_LINE characters each.
- Once per alert, also across a restart: `stacks_status` is stored with the alert as soon as it is asked,
  and an alert whose row has it is never asked again (its summary is put back on the engine's events, whose
  figures would otherwise replace the stored ones at the next refresh).
- `take_stacks = false` under `[training_stall]` in the rules file turns it off.
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from ..rules.model import FIRING, AlertEvent
from .alerts import Alert, AlertStore

log = logging.getLogger("clusterwatch.collector")

RULE = "training_stall"
#: How long the ranks' answers are awaited (py-spy takes a second or two a process).
WAIT_S = 30.0
#: Another rank's alert of the same job within this long of a take shares it (every rank stalls at once).
REUSE_S = 600.0
MAX_LINES = 8
MAX_LINE = 200
#: Where the summary begins in a description (what is before it is the engine's text).
MARK = "; stacks: "
ASKED, TAKEN, NOT_TAKEN = "asked", "taken", "not_taken"


@dataclass
class _Take:
    """One take of a job's stacks, shared by the alerts of its ranks."""

    job_id: str
    asked_at: float
    status: str = ASKED
    lines: list[str] = field(default_factory=list)
    keys: set[str] = field(default_factory=set)


def summary_lines(answers: Iterable[Any]) -> list[str]:
    """The grouped stacks of the answers (query_pb2.TrainAnswerView) as the alert carries them: one line a
    distinct main-thread stack with its ranks, then one a reason ranks gave no stacks; bounded."""
    from clusterwatch.stacks import by_rank, group_ranks, rank_list

    answers = list(answers)
    dumps, noun = by_rank(answers)
    lines = [g.summary(noun) for g in group_ranks(dumps)] if dumps else []
    missing: dict[str, list[int]] = {}
    for a in answers:
        if not a.payload:
            why = (a.message or a.status or "no answer").splitlines()[0] if (a.message or a.status) else "no answer"
            missing.setdefault(why, []).append(a.rank if noun == "rank" and a.HasField("rank") else a.pid)
    lines += [f"{rank_list(ids, noun)}: no stacks: {why}" for why, ids in missing.items()]
    if not lines:
        lines = ["no process answered"]
    out = [_printable(x)[:MAX_LINE] for x in lines[:MAX_LINES]]
    if len(lines) > MAX_LINES:
        out.append(f"... {len(lines) - MAX_LINES} more")
    return out


def _printable(text: str) -> str:
    """A stack line goes into an alert's one-line description: no control characters from a process's names."""
    return "".join(c if c.isprintable() else "?" for c in text)


class StallStacks:
    """Takes a stalled job's stacks once and keeps the summary with its alerts.

    Args:
        store: the alert table.
        ask: returns the collector's TrainAsks.ask_for_alert, or None where this collector asks no process
            (read at each take: the collector gives it after building the alerting).
        enabled: the rules file's `[training_stall] take_stacks`.
    """

    def __init__(self, store: AlertStore, ask: Callable[[], Any], enabled: bool = True) -> None:
        self.store = store
        self.ask = ask
        self.enabled = enabled
        self.taken = 0  # takes asked
        self._by_key: dict[str, _Take] = {}
        self._by_job: dict[str, _Take] = {}
        self._checked: dict[str, str] = {}  # keys looked up in the table after a restart (→ job), found without
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None

    # -- the engine's events ---------------------------------------------------------------------

    def merge(self, events: Iterable[AlertEvent]) -> list[AlertEvent]:
        """The events with the stacks their alert holds: the engine's figures replace the stored ones."""
        out = []
        for ev in events:
            if ev.rule == RULE:
                take = self._by_key.get(ev.key) or self._restored(ev)
                if take is not None:
                    ev = self._with(ev, take)
            out.append(ev)
        return out

    def _restored(self, ev: AlertEvent) -> _Take | None:
        """After a restart: the stacks the alert's row holds (taken, or asked, before it)."""
        if ev.key in self._checked:
            return None
        self._checked[ev.key] = ev.job_id
        for a in self.store.active(job_id=ev.job_id):
            if a.key == ev.key and a.figures.get("stacks_status"):
                take = _Take(a.job_id, a.started_at, str(a.figures["stacks_status"]),
                             list(a.figures.get("stacks") or []), {a.key})
                self._by_key[a.key] = take
                return take
        return None

    @staticmethod
    def _with(ev: AlertEvent, take: _Take) -> AlertEvent:
        base = ev.description.split(MARK)[0]
        said = "; ".join(take.lines) if take.status == TAKEN else (
            "being taken" if take.status == ASKED else (take.lines[0] if take.lines else "not taken"))
        return dataclasses.replace(ev, description=f"{base}{MARK}{said}",
                                   figures={**ev.figures, "stacks_status": take.status, "stacks": list(take.lines)})

    # -- taking ----------------------------------------------------------------------------------

    def on_changed(self, changed: Iterable[Alert], now: float) -> None:
        """Alerts whose state changed: a training_stall that fires has its job's stacks taken (or shared)."""
        if not self.enabled:
            return
        for a in changed:
            if a.rule != RULE or a.state != FIRING or not a.job_id or a.key in self._by_key \
                    or a.figures.get("stacks_status"):
                continue
            with self._lock:
                take = self._by_job.get(a.job_id)
                if take is not None and (take.status == ASKED or now - take.asked_at < REUSE_S):
                    take.keys.add(a.key)
                    self._by_key[a.key] = take
                    share = True
                else:
                    share = False
            if share:
                self._write(take, [a])
                continue
            self._take(a, now)

    def _take(self, a: Alert, now: float) -> None:
        ask = self.ask()
        if ask is None:
            return  # this collector asks no process: nothing to say on the alert
        take = _Take(a.job_id, now, keys={a.key})
        with self._lock:
            self._by_job[a.job_id] = take
            self._by_key[a.key] = take
        self._write(take, [a])  # stored as asked first: a restart before the answers does not ask again
        self.taken += 1
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        try:
            n = ask(a.job_id, "", -1, 0.0, None, "dump_stacks", f"alert {a.id} {a.rule}",
                    answered=lambda answers: self._answered(take, answers, loop), wait_s=WAIT_S)
        except Exception as exc:  # a failed ask must not stop the alert's other steps
            log.warning("stacks of job %s not taken: %s", a.job_id, exc)
            self._done(take, NOT_TAKEN, [f"not taken: {exc}"[:MAX_LINE]])
            return
        if not n:
            self._done(take, NOT_TAKEN, ["not taken: the job has no live process"])

    def _answered(self, take: _Take, answers: list, loop: asyncio.AbstractEventLoop | None) -> None:
        """The answers are in (on the collector's loop): group them in the worker thread, write on the loop."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="stall-stacks")

        def group() -> None:
            try:
                lines, status = summary_lines(answers), TAKEN
            except Exception as exc:  # a dump the parser trips on is said, not raised into the loop
                log.exception("stacks of job %s not grouped", take.job_id)
                lines, status = [f"not grouped: {exc}"[:MAX_LINE]], NOT_TAKEN
            if loop is not None and not loop.is_closed():
                loop.call_soon_threadsafe(self._done, take, status, lines)
            else:
                self._done(take, status, lines)

        self._pool.submit(group)

    def _done(self, take: _Take, status: str, lines: list[str]) -> None:
        with self._lock:
            take.status, take.lines = status, lines
        self._write(take, None)

    def _write(self, take: _Take, alerts: list[Alert] | None) -> None:
        """Each of the take's alerts still active gets its summary in the table (figures and description)."""
        if alerts is None:
            alerts = [a for a in self.store.active(job_id=take.job_id) if a.key in take.keys]
        for a in alerts:
            ev = AlertEvent(t=a.updated_at, rule=a.rule, state=a.state, severity=a.severity, node=a.node,
                            job_id=a.job_id, pid=a.pid, start_time=a.start_time, gpu=a.gpu, rank=a.rank,
                            description=a.description, figures=dict(a.figures))
            try:
                self.store.refresh(self._with(ev, take))
            except Exception:
                log.exception("stacks of job %s not stored", take.job_id)

    def forget_job(self, job_id: str) -> None:
        """The job ended: its takes go (its alerts have resolved with the summary they held)."""
        with self._lock:
            self._by_job.pop(job_id, None)
            for key in [k for k, t in self._by_key.items() if t.job_id == job_id]:
                del self._by_key[key]
            for key in [k for k, j in self._checked.items() if j == job_id]:
                del self._checked[key]

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False)
