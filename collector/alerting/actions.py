"""Actions for alerts: log, webhook, command, checkpoint, stop, signal, drain; and escalation over time.

`Dispatcher` applies engine events to the `AlertStore` and runs the configured
steps (`[actions]` in the rules file) for each transition. Steps with `after_s = 0`
run when an alert fires; later steps run from `tick(now)` once the alert has been
firing that long (notify first, later ask for a checkpoint with SIGUSR1). Each
step run is recorded in the store, so a restarted collector does not repeat it.

Webhooks, commands and signals run off the caller's thread (the collector's ingest loop never
waits on a slow endpoint), in lanes: one queue and one worker thread per (rule, step), so a slow
action holds only its own lane and never delays another rule's actions, while one step's
actions for one rule still run in order (a firing before its resolved). Each call has a
deadline for the whole of it, its `timeout_s` (collector/alerting/webhook.py: urllib's own timeout is
per read, and an endpoint dripping its answer held the only worker for 40 s on a 3 s
timeout). A lane holds at most 100 waiting actions (more are dropped and counted) and its
thread ends after a minute without work. Signals go through the
`send_signal(node, pid, start_time, signum, reason)` callback the collector gives,
since the process lives on another node; they are sent only when
`allow_signals = true`. A drain takes the alert's node out of scheduling through the
`drain_node(node, reason)` callback (`scontrol update NodeName=… State=DRAIN Reason=…`, given by a
collector with --slurm); it is never run on resolution, and like every step it is stored as done, so a
node an operator resumed is not drained again for the same alert, even after a restart. Every drain first
passes the circuit breaker (collector/alerting/breaker.py): past its limit the drain is held, said in a log
line and counted, and the alert's other steps notify alone.

Every step that acts, and every one that did not run and why, is a row of the audit trail
(collector/alerting/audit.py), its outcome written when its lane has run it.

`checkpoint` and `stop` ask the alert's process (or, for an alert of a whole job, each of its ranks)
through its agent and its clusterwatch.train socket (`ask_train`, collector/alerting/train_asks.py): its handler
runs in the training loop at the next report(), so they come ahead of signals, which stay for processes
that use no clusterwatch.train. They do not wait for the answer (it is stored and shown in `status`); a
process that never reported answers `unreachable`. Neither runs on resolution.

Apart from the steps, with --alertmanager every alert that fires and resolves goes to Alertmanager
(collector/alerting/alertmanager.py, its own threads): routing and silencing are the site's, there.
"""
from __future__ import annotations

import collections
import json
import logging
import re
import signal as _signal
import subprocess
import threading
import time
from collections.abc import Callable

from clusterwatch.slurm.node_names import why_not_a_node_name

from ..rules.config import SEVERITIES, ActionsConfig, ActionStep
from ..rules.model import FIRING, RESOLVED, AlertEvent
from .alertmanager import AlertmanagerNotifier
from .alerts import Alert, AlertStore
from .audit import ActionAudit
from .breaker import DrainBreaker
from .webhook import post_json

log = logging.getLogger("clusterwatch.alerts")

SendSignal = Callable[[str, int, float, int, str], None]
DrainNode = Callable[[str, str], None]
# job id, node, pid, start time, rank, kind, who asked -> how many processes were asked
AskTrain = Callable[[str, str, int, float, "int | None", str, str], int]
TRAIN_ACTIONS = ("checkpoint", "stop")

_REASON_MAX = 200  # characters of a drain reason (sinfo -R shows it; a full description would not fit)
_UNPRINTABLE = re.compile(r"[\x00-\x1f\x7f]+")


def _one_line(text: str) -> str:
    """A description for the log: a process or job name with a newline cannot forge a log line."""
    return _UNPRINTABLE.sub(" ", text)


def drain_reason(payload: dict) -> str:
    """The Reason= of a drain: "clusterwatch: " and the alert's description, on one line, bounded."""
    text = _UNPRINTABLE.sub(" ", f"clusterwatch: {payload.get('description') or payload.get('rule')}").strip()
    return text if len(text) <= _REASON_MAX else text[:_REASON_MAX - 1] + "…"


def _applies(step: ActionStep, a: Alert) -> bool:
    if step.rules and a.rule not in step.rules:
        return False
    return SEVERITIES.index(a.severity) >= SEVERITIES.index(step.min_severity)


class Dispatcher:
    """Turns engine events into stored alerts and actions.

    Args:
        store: The alert table.
        config: The `[actions]` configuration.
        send_signal: Callback that delivers a signal to a process on its node, or None.
        logger: Where the log action writes.
        drain_node: Callback that drains a node with a reason (Slurm), or None: drain steps are skipped.
        ask_train: Asks a job's training processes (TrainAsks.ask_for_alert), or None: checkpoint and stop
            steps are skipped.
        node_trusted: Whether a node's agent is authenticated: a drain on what an unauthenticated stream said
            is refused, since anyone may have sent it; None: every node (a Dispatcher of its own).
        alertmanager: Sends every firing and resolved alert to Alertmanager (--alertmanager), whatever the
            steps; None: none.
        breaker: Admits or holds each drain (the most nodes a window may lose); None: every drain runs (a
            Dispatcher without drain_node, or a test of the steps alone).
        audit: The audit trail each acting step is written to, with what came of it; None: none.
    """

    def __init__(self, store: AlertStore, config: ActionsConfig, send_signal: SendSignal | None = None,
                 logger: logging.Logger = log, drain_node: DrainNode | None = None, ask_train: AskTrain | None = None,
                 node_trusted: Callable[[str], bool] | None = None,
                 alertmanager: AlertmanagerNotifier | None = None, breaker: DrainBreaker | None = None,
                 audit: ActionAudit | None = None) -> None:
        self.store = store
        self.breaker = breaker
        self.audit = audit
        self.alertmanager = alertmanager
        self.config = config
        self.send_signal = send_signal
        self.drain_node = drain_node
        self.ask_train = ask_train
        self.node_trusted = node_trusted
        self.logger = logger
        self.errors = 0  # failed webhooks/commands/signals, counted rather than raised
        self.dropped = 0  # actions dropped because their lane was full
        self.drains_refused = 0  # drains of a name that is not one node, or of an unauthenticated agent's node
        self._count_lock = threading.Lock()
        self._lanes = _Lanes(self._deliver_counted)

    def process(self, events: list[AlertEvent] | tuple[AlertEvent, ...], now: float) -> list[Alert]:
        """Apply events to the store and run the steps due for each transition.

        Args:
            events: Engine events, oldest first.
            now: Current time.

        Returns:
            The alerts whose state changed.
        """
        changed = []
        for ev in events:
            a = self.store.apply(ev)
            if a is None:
                continue
            changed.append(a)
            if self.alertmanager is not None and a.state in (FIRING, RESOLVED):
                (self.alertmanager.fired if a.state == FIRING else self.alertmanager.resolved)(a)
            if a.state == FIRING:
                self._escalate(a, now)
            elif a.state == RESOLVED:
                for i, step in enumerate(self.config.steps):
                    if i in a.steps_done and step.on_resolved and step.action not in ("signal", "drain",
                                                                                      *TRAIN_ACTIONS):
                        self._run_step(i, step, a, now)
        return changed

    def tick(self, now: float) -> None:
        """Run escalation steps that have come due for alerts still firing; tell Alertmanager what fires."""
        if self.audit is not None:  # what the lanes reported, written on this thread
            self.audit.flush()
        firing = [a for a in self.store.active() if a.state == FIRING]
        for a in firing:
            self._escalate(a, now)
        if self.alertmanager is not None:
            self.alertmanager.sync(firing, now)

    def _escalate(self, a: Alert, now: float) -> None:
        fired = a.fired_at if a.fired_at is not None else now
        for i, step in enumerate(self.config.steps):
            if i in a.steps_done or not _applies(step, a) or now - fired < step.after_s:
                continue
            self.store.mark_step_done(a.id, i)
            a.steps_done.add(i)
            self._run_step(i, step, a, now)

    def _run_step(self, index: int, step: ActionStep, a: Alert, now: float) -> None:
        if step.action == "log":
            self.logger.warning("alert %s %s [%s] %s", a.state, a.rule, a.severity, _one_line(a.description))
            return
        held = self._why_not(step, a, now)
        if held is not None:
            self._audit(step.action, a, now, *held)
            return
        if step.action in TRAIN_ACTIONS:
            self._ask_train(step.action, a, now)
            return
        row = self._audit(step.action, a, now, "queued", "")
        if not self._lanes.put((a.rule, index), (step, a.to_dict(), row)):
            with self._count_lock:
                self.dropped += 1
                self.errors += 1
            if self.audit is not None and row is not None:
                self.audit.finish(row, step.action, "dropped", "its lane held 100 waiting actions")

    def _why_not(self, step: ActionStep, a: Alert, now: float) -> tuple[str, str] | None:
        """(outcome, why) of a step that must not run, said in the log; None: it runs."""
        if step.action == "signal" and (not self.config.allow_signals or self.send_signal is None or a.pid < 0):
            self.logger.info("signal step for %s skipped (allow_signals is off or no process)", a.rule)
            return "skipped", "allow_signals is off, or the alert names no process"
        if step.action in TRAIN_ACTIONS and (self.ask_train is None or not a.job_id):
            why = "no job" if self.ask_train is not None else "this collector asks no process"
            self.logger.info("%s step for %s skipped (%s)", step.action, a.rule, why)
            return "skipped", why
        if step.action != "drain":
            return None
        if self.drain_node is None or not a.node:
            why = "the collector runs without --slurm" if a.node else "the alert names no node"
            self.logger.info("drain step for %s skipped (%s)", a.rule, why)
            return "skipped", why
        if why_not_a_node_name(a.node):
            # the alert's node is its agent's Hello's: a keyword or node set would drain other nodes
            why = f"not draining {a.node[:200]!r}: {why_not_a_node_name(a.node)}"
            self.logger.warning("drain step for %s refused: %s", a.rule, why)
            self.drains_refused += 1
            return "refused", why
        if self.node_trusted is not None and not self.node_trusted(a.node):
            why = (f"the agent of {_one_line(a.node)} is not authenticated (no token, certificate or munge "
                   "credential), so what raised the alert may be forged")
            self.logger.warning("drain step for %s refused: %s", a.rule, why)
            self.drains_refused += 1
            return "refused", why
        if self.breaker is not None:
            # decided here, on the caller's thread, one alert after another: two lanes cannot both take the last
            verdict = self.breaker.consider(a.node, now)
            if not verdict.admitted:
                self.logger.warning("drain step for alert %s %s held: %s", a.id, a.rule, verdict.why)
                return "held", verdict.why
        return None

    def _audit(self, action: str, a: Alert, now: float, outcome: str, detail: str) -> int | None:
        """One row of the audit trail for an action on this alert's subject; its id (None without a trail)."""
        if self.audit is None:
            return None
        evidence = {"figures": a.figures, "gpu": a.gpu, "pid": a.pid, "rank": a.rank, "severity": a.severity,
                    "fired_at": a.fired_at}
        return self.audit.record(action, node=a.node, job_id=a.job_id, rule=a.rule, alert_id=a.id,
                                 why=_one_line(f"{a.rule}: {a.description}"), evidence=evidence, outcome=outcome,
                                 detail=detail, at=now)

    def _ask_train(self, kind: str, a: Alert, now: float) -> None:
        """Queue the request on the agents' streams (no waiting: the answers are stored as they come)."""
        assert self.ask_train is not None
        asked = self.ask_train(a.job_id, a.node, a.pid, a.start_time, a.rank, kind, f"alert {a.id} {a.rule}")
        self.logger.warning("alert %s %s: asked %d process(es) of job %s to %s", a.id, a.rule, asked, a.job_id, kind)
        self._audit(kind, a, now, "asked", f"asked {asked} process(es) of job {a.job_id}")

    def _deliver_counted(self, item: tuple[ActionStep, dict, int | None]) -> None:
        step, payload, row = item
        try:
            said = self._deliver(step, payload)
        except Exception as exc:  # one failing endpoint must not stop its lane
            with self._count_lock:  # lanes fail in threads of their own
                self.errors += 1
            self.logger.warning("alert action %s for %s failed: %s", step.action, payload.get("rule"), exc)
            if self.audit is not None and row is not None:
                self.audit.finish(row, step.action, "failed", _one_line(str(exc)))
            return
        if self.audit is not None and row is not None:
            self.audit.finish(row, step.action, "done", said)

    def _deliver(self, step: ActionStep, payload: dict) -> str:
        """Run one step; returns what the audit row's detail keeps (a drain's reason: a resume compares it)."""
        body = json.dumps(payload, default=str).encode()
        if step.action == "webhook":
            post_json(step.url, body, step.timeout_s)
        elif step.action == "command":
            # subprocess.run's timeout is for the whole run: it kills the command when it passes
            subprocess.run(list(step.command), input=body, timeout=step.timeout_s, check=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        elif step.action == "signal":
            signum = int(getattr(_signal, step.signal))
            assert self.send_signal is not None
            self.send_signal(payload["node"], payload["pid"], payload["start_time"], signum,
                             f"{payload['rule']}: {payload['description']}")
        elif step.action == "drain":
            assert self.drain_node is not None
            reason = drain_reason(payload)
            self.drain_node(payload["node"], reason)
            self.logger.warning("drained node %s: %s", payload["node"], reason)
            return reason
        return ""

    def drain(self, timeout: float = 10.0) -> bool:
        """Wait until queued actions have run (for shutdown and tests); False if some still run."""
        return self._lanes.drain(timeout)

    def close(self) -> None:
        """Finish queued actions (10 s at most) and stop the lanes and the Alertmanager senders."""
        self._lanes.drain(10.0)
        self._lanes.close()
        if self.alertmanager is not None:
            self.alertmanager.close()


class _Lanes:
    """A queue and a worker thread per key, started on demand; a thread ends after `idle_s` idle.

    Args:
        run: runs one item; it must not raise (the caller counts its failures).
        max_queue: items a lane holds; put() refuses more.
        idle_s: a lane's thread ends after this long without items.
    """

    def __init__(self, run: Callable[[object], None], max_queue: int = 100, idle_s: float = 60.0) -> None:
        self._run_item = run
        self.max_queue = max_queue
        self.idle_s = idle_s
        self._cond = threading.Condition()
        self._queues: dict[object, collections.deque] = {}  # key -> waiting items; a key here has a thread
        self._pending = 0  # items put and not yet run
        self._closed = False

    def put(self, key: object, item: object) -> bool:
        """Queue an item on its key's lane; False when the lane is full or the lanes are closed."""
        with self._cond:
            if self._closed:
                return False
            q = self._queues.get(key)
            if q is None:
                q = self._queues[key] = collections.deque()
                threading.Thread(target=self._worker, args=(key, q), name="cw-action", daemon=True).start()
            elif len(q) >= self.max_queue:
                return False
            q.append(item)
            self._pending += 1
            self._cond.notify_all()
        return True

    def _worker(self, key: object, q: collections.deque) -> None:
        while True:
            with self._cond:
                deadline = time.monotonic() + self.idle_s
                while not q and not self._closed:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    self._cond.wait(left)
                if not q:  # idle too long, or closed: this lane goes (a later put starts a new one)
                    del self._queues[key]
                    return
                item = q.popleft()
            try:
                self._run_item(item)
            finally:
                with self._cond:
                    self._pending -= 1
                    self._cond.notify_all()

    def drain(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._pending:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
        return True

    def close(self) -> None:
        """Stop taking items; each lane's thread ends once its queue is empty."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
