"""Actions for alerts: log, webhook, command, signal; and escalation over time.

`Dispatcher` applies engine events to the `AlertStore` and runs the configured
steps (`[actions]` in the rules file) for each transition. Steps with `after_s = 0`
run when an alert fires; later steps run from `tick(now)` once the alert has been
firing that long (notify first, later ask for a checkpoint with SIGUSR1). Each
step run is recorded in the store, so a restarted collector does not repeat it.

Webhooks and commands run in one worker thread fed by a queue: the caller (the
collector's ingest loop) never waits on a slow endpoint. Signals go through the
`send_signal(node, pid, start_time, signum, reason)` callback the collector gives,
since the process lives on another node; they are sent only when
`allow_signals = true`.
"""
from __future__ import annotations

import json
import logging
import queue
import signal as _signal
import subprocess
import threading
import urllib.request
from collections.abc import Callable

from .alerts import Alert, AlertStore
from .rules.config import SEVERITIES, ActionsConfig, ActionStep
from .rules.model import FIRING, RESOLVED, AlertEvent

log = logging.getLogger("clusterwatch.alerts")

SendSignal = Callable[[str, int, float, int, str], None]


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
    """

    def __init__(self, store: AlertStore, config: ActionsConfig, send_signal: SendSignal | None = None,
                 logger: logging.Logger = log) -> None:
        self.store = store
        self.config = config
        self.send_signal = send_signal
        self.logger = logger
        self.errors = 0  # failed webhooks/commands/signals, counted rather than raised
        self._q: queue.Queue[tuple[ActionStep, dict] | None] = queue.Queue()
        self._worker = threading.Thread(target=self._run, name="clusterwatch-actions", daemon=True)
        self._worker.start()

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
            if a.state == FIRING:
                self._escalate(a, now)
            elif a.state == RESOLVED:
                for i, step in enumerate(self.config.steps):
                    if i in a.steps_done and step.on_resolved and step.action != "signal":
                        self._run_step(step, a)
        return changed

    def tick(self, now: float) -> None:
        """Run escalation steps that have come due for alerts still firing."""
        for a in self.store.active():
            if a.state == FIRING:
                self._escalate(a, now)

    def _escalate(self, a: Alert, now: float) -> None:
        fired = a.fired_at if a.fired_at is not None else now
        for i, step in enumerate(self.config.steps):
            if i in a.steps_done or not _applies(step, a) or now - fired < step.after_s:
                continue
            self.store.mark_step_done(a.id, i)
            a.steps_done.add(i)
            self._run_step(step, a)

    def _run_step(self, step: ActionStep, a: Alert) -> None:
        payload = a.to_dict()
        if step.action == "log":
            self.logger.warning("alert %s %s [%s] %s", a.state, a.rule, a.severity, a.description)
        elif step.action == "signal":
            if not self.config.allow_signals or self.send_signal is None or a.pid < 0:
                self.logger.info("signal step for %s skipped (allow_signals is off or no process)", a.rule)
                return
            self._q.put((step, payload))
        else:
            self._q.put((step, payload))

    def _run(self) -> None:
        while True:
            item = self._q.get()
            try:
                if item is None:
                    return
                step, payload = item
                self._deliver(step, payload)
            except Exception as exc:  # one failing endpoint must not stop the worker
                self.errors += 1
                self.logger.warning("alert action %s failed: %s", item[0].action if item else "?", exc)
            finally:
                self._q.task_done()

    def _deliver(self, step: ActionStep, payload: dict) -> None:
        body = json.dumps(payload, default=str).encode()
        if step.action == "webhook":
            req = urllib.request.Request(step.url, data=body, method="POST",
                                         headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=step.timeout_s) as resp:  # noqa: S310 - URL from the rules file
                resp.read()
        elif step.action == "command":
            subprocess.run(list(step.command), input=body, timeout=step.timeout_s, check=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        elif step.action == "signal":
            signum = int(getattr(_signal, step.signal))
            assert self.send_signal is not None
            self.send_signal(payload["node"], payload["pid"], payload["start_time"], signum,
                             f"{payload['rule']}: {payload['description']}")

    def drain(self, timeout: float = 10.0) -> None:
        """Wait until queued actions have run (for shutdown and tests)."""
        done = threading.Event()

        def waiter() -> None:
            self._q.join()
            done.set()

        threading.Thread(target=waiter, daemon=True).start()
        done.wait(timeout)

    def close(self) -> None:
        """Finish queued actions and stop the worker."""
        self.drain()
        self._q.put(None)
        self._worker.join(timeout=5)
